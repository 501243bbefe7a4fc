"""GPT-1 in plain PyTorch, the reference that bench/train_step.py times tinygpt against.

The same architecture as tinygpt.GPT and transformers' OpenAIGPTLMHeadModel: token and position
embeddings, post-LN blocks (n = ln_1(x + attn(x)); h = ln_2(n + mlp(n))), attention written out
as matmul, causal mask, softmax, dropout, matmul (as transformers does), tanh GELU, and an LM
head tied to the token embedding. Weights are (in, out) like GPT-1's Conv1D.

Needs PyTorch, which tinygpt itself does not: for the CPU build,
    pip install torch --index-url https://download.pytorch.org/whl/cpu
"""

import math

try:
    import torch
    from torch import nn
    from torch.nn import functional as F
except ImportError:
    torch = None

INSTALL_HINT = (
    "PyTorch is not installed; for the CPU build: "
    "pip install torch --index-url https://download.pytorch.org/whl/cpu (or time tinygpt alone: "
    "train_step.py --no-torch, gpu_bench.py --sides tinygpt)"
)


def require_torch():
    if torch is None:
        raise SystemExit(INSTALL_HINT)
    return torch


if torch is not None:

    class Conv1D(nn.Module):
        """x @ weight + bias with weight (in, out), as in GPT-1's code."""

        def __init__(self, n_in, n_out, std):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(n_in, n_out) * std)
            self.bias = nn.Parameter(torch.zeros(n_out))

        def forward(self, x):
            return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).reshape(*x.shape[:-1], -1)

    class Attention(nn.Module):
        """Written out as transformers does, or (sdpa) through torch's scaled_dot_product_attention,
        which picks a flash or memory-efficient kernel on a GPU: the strongest eager baseline."""

        def __init__(self, config, sdpa=False):
            super().__init__()
            self.n_head, self.attn_pdrop, self.sdpa = config.n_head, config.attn_pdrop, sdpa
            self.c_attn = Conv1D(config.n_embd, 3 * config.n_embd, config.initializer_range)
            self.c_proj = Conv1D(config.n_embd, config.n_embd, config.initializer_range)
            self.resid_dropout = nn.Dropout(config.resid_pdrop)
            self.register_buffer(
                "causal", torch.tril(torch.ones(config.n_ctx, config.n_ctx, dtype=torch.bool))
            )

        def forward(self, x):
            batch, time, width = x.shape
            q, k, v = self.c_attn(x).split(width, dim=2)
            q, k, v = (t.view(batch, time, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
            if self.sdpa:
                p = self.attn_pdrop if self.training else 0.0
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
                return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(batch, time, width)))
            scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
            scores = scores.masked_fill(~self.causal[:time, :time], float("-inf"))
            weights = F.dropout(scores.softmax(dim=-1), self.attn_pdrop, self.training)
            y = (weights @ v).transpose(1, 2).reshape(batch, time, width)
            return self.resid_dropout(self.c_proj(y))

    class MLP(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.c_fc = Conv1D(config.n_embd, config.n_inner, config.initializer_range)
            self.c_proj = Conv1D(config.n_inner, config.n_embd, config.initializer_range)
            self.dropout = nn.Dropout(config.resid_pdrop)

        def forward(self, x):
            return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))

    class Block(nn.Module):
        def __init__(self, config, sdpa=False):
            super().__init__()
            self.attn = Attention(config, sdpa)
            self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
            self.mlp = MLP(config)
            self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)

        def forward(self, x):
            n = self.ln_1(x + self.attn(x))
            return self.ln_2(n + self.mlp(n))

    class GPT(nn.Module):
        """GPT-1 for a tinygpt.GPTConfig; model(ids) gives the LM logits. sdpa: attention through
        torch's scaled_dot_product_attention."""

        def __init__(self, config, sdpa=False):
            super().__init__()
            std = config.initializer_range
            self.tokens_embed = nn.Embedding(config.vocab_size, config.n_embd)
            self.positions_embed = nn.Embedding(config.n_ctx, config.n_embd)
            nn.init.normal_(self.tokens_embed.weight, std=std)
            nn.init.normal_(self.positions_embed.weight, std=std)
            self.drop = nn.Dropout(config.embd_pdrop)
            self.h = nn.ModuleList(Block(config, sdpa) for _ in range(config.n_layer))

        def forward(self, ids):
            positions = torch.arange(ids.shape[1], device=ids.device)
            x = self.drop(self.tokens_embed(ids) + self.positions_embed(positions))
            for block in self.h:
                x = block(x)
            return x @ self.tokens_embed.weight.T


def transformers_gpt(config):
    """transformers' OpenAIGPTLMHeadModel for a tinygpt.GPTConfig, as a user of it would build it,
    with a forward that gives the LM logits; SystemExit naming the package where it is missing."""
    try:
        from transformers import OpenAIGPTConfig, OpenAIGPTLMHeadModel
    except ImportError:
        raise SystemExit("the transformers baseline needs transformers: pip install transformers") from None
    hf_config = OpenAIGPTConfig(
        vocab_size=config.vocab_size,
        n_positions=config.n_ctx,
        n_embd=config.n_embd,
        n_layer=config.n_layer,
        n_head=config.n_head,
        resid_pdrop=config.resid_pdrop,
        embd_pdrop=config.embd_pdrop,
        attn_pdrop=config.attn_pdrop,
        layer_norm_epsilon=config.layer_norm_epsilon,
    )

    class LogitsOnly(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = OpenAIGPTLMHeadModel(hf_config)

        def forward(self, ids):
            return self.model(input_ids=ids).logits

    return LogitsOnly()
