"""GPT-1: a 12-layer decoder-only transformer with post-LN blocks and a tied LM head.

    h_0 = W_e[U] + W_p                        (token and position embeddings, then dropout)
    h_l = block(h_{l-1})  for l = 1..n        (masked self-attention, then an MLP)
    P(u) = softmax(h_n W_e^T)                 (the LM head shares W_e)

Parameter names are those of the openai-gpt checkpoints, so state dicts move both ways.
"""

import dataclasses
import json
import os

import numpy as np

import autograd as ag
from autograd import backend, nn, precision
from autograd import functional as F
from autograd.serialization import load_file, save_file
from autograd.tensor import Tensor, no_grad

from .config import ACTIVATIONS, GPTConfig
from .weights import weights_folder


class CausalSelfAttention(nn.Module):
    """Masked multi-head self-attention: one projection to q, k, v (c_attn), heads attended
    in parallel, merged back and projected (c_proj), then residual dropout."""

    def __init__(self, n_embd, n_head, attn_pdrop=0.1, resid_pdrop=0.1, std=0.02):
        if n_embd % n_head:
            raise ValueError(f"n_embd={n_embd} is not divisible by n_head={n_head}")
        self.n_head = n_head
        self.attn_pdrop = attn_pdrop
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, std=std)
        self.c_proj = nn.Linear(n_embd, n_embd, std=std)
        self.resid_dropout = nn.Dropout(resid_pdrop)

    def forward(self, x, cache=None):
        """x: (B, T, D). With a KVCache, the keys and values of earlier positions come from it
        and this call's are added to it, so x holds only the new positions."""
        return self.resid_dropout(self.c_proj(self.attend(x, cache)))  # (B, T, D)

    def project(self, x, cache=None):
        """forward before c_proj's bias and the residual dropout, (B, T, D): a post-LN block adds
        those with its residual in one op (LayerNorm.residual)."""
        return F.linear(self.attend(x, cache), self.c_proj.weight)

    def attend(self, x, cache=None):
        """The heads' outputs side by side, (B, T, D), before c_proj."""
        dropout_p = self.attn_pdrop if self.training else 0.0
        if cache is None:  # c_attn's product; its bias added as the heads are read: one op
            qkv = F.linear(x, self.c_attn.weight)  # (B, T, 3 D): q, k and v side by side, before the bias
            return F.multi_head_attention(qkv, self.n_head, dropout_p, bias=self.c_attn.bias)  # (B, T, D)
        q, k, v = self.heads(x)  # each (B, H, T, D / H)
        k, v = cache.extend(self, k, v)  # (B, H, S, D / H): the S positions so far
        y = F.scaled_dot_product_attention(q, k, v, causal=True, dropout_p=dropout_p)  # (B, H, T, D / H)
        return y.transpose(0, 2, 1, 3).reshape(x.shape)  # heads merged: (B, T, D)

    def heads(self, x):
        """q, k and v of x (B, T, D), each (B, H, T, D / H)."""
        batch, time, width = x.shape
        heads = self.c_attn(x).reshape(
            batch, time, 3, self.n_head, width // self.n_head
        )  # (B, T, 3, H, D / H)
        return (heads[:, :, i].transpose(0, 2, 1, 3) for i in range(3))

    def weights(self, x):
        """Each head's attention weights, (B, H, T, T): row t, position t's over positions 0..t."""
        q, k, _ = self.heads(x)
        return F.attention_weights(q, k)


class KVCache:
    """The keys and values of the positions seen so far, for each attention layer, so that
    generating one more token costs attention over one new position, not the whole sequence."""

    def __init__(self):
        self.length = 0  # positions cached; the model advances it after each call
        self._keys, self._values = {}, {}

    def extend(self, layer, k, v):
        """Append this call's k and v (batch, head, time, width) for `layer`; return all so far."""
        if layer in self._keys:
            k = ag.concat([self._keys[layer], k], axis=2)
            v = ag.concat([self._values[layer], v], axis=2)
        self._keys[layer], self._values[layer] = k, v
        return k, v


class MLP(nn.Module):
    """The position-wise feed-forward network: c_fc, GELU, c_proj, residual dropout."""

    def __init__(self, n_embd, n_inner, resid_pdrop=0.1, approximate="tanh", std=0.02):
        self.c_fc = nn.Linear(n_embd, n_inner, std=std)
        self.c_proj = nn.Linear(n_inner, n_embd, std=std)
        self.dropout = nn.Dropout(resid_pdrop)
        self.approximate = approximate

    def forward(self, x):
        return self.dropout(self.c_proj(self.hidden(x)))

    def project(self, x):
        """forward before c_proj's bias and the residual dropout: a post-LN block adds those with
        its residual in one op (LayerNorm.residual)."""
        return F.linear(self.hidden(x), self.c_proj.weight)

    def hidden(self, x):
        """gelu(x W_fc + b_fc), (B, T, n_inner); GPT-1's tanh form adds the bias inside GELU's op."""
        if self.approximate == "tanh":
            return F.gelu(F.linear(x, self.c_fc.weight), bias=self.c_fc.bias)
        return F.gelu(self.c_fc(x), self.approximate)


class Block(nn.Module):
    """One post-LN transformer block: n = ln_1(x + attn(x)); h = ln_2(n + mlp(n)).

    Each sublayer ends in a linear layer and residual dropout: attn(x) = dropout(y W + b). The block
    takes its product y W before the bias (the sublayer's `project`, not its forward), and the norm
    adds the bias, the dropout and the residual in the same op (LayerNorm.residual): on a GPU, one
    pass over the rows."""

    def __init__(self, config):
        std = config.initializer_range
        self.attn = CausalSelfAttention(
            config.n_embd, config.n_head, config.attn_pdrop, config.resid_pdrop, std
        )
        self.ln_1 = nn.LayerNorm(config.n_embd, config.layer_norm_epsilon)
        self.mlp = MLP(config.n_embd, config.n_inner, config.resid_pdrop, ACTIVATIONS[config.afn], std)
        self.ln_2 = nn.LayerNorm(config.n_embd, config.layer_norm_epsilon)

    def forward(self, x, cache=None):
        attn, mlp = self.attn, self.mlp
        # n = ln_1(x + attn(x))
        n = self.ln_1.residual(x, attn.project(x, cache), attn.c_proj.bias, attn.resid_dropout)
        # h = ln_2(n + mlp(n))
        return self.ln_2.residual(n, mlp.project(n), mlp.c_proj.bias, mlp.dropout)


class GPT(nn.Module):
    """GPT-1 as in section 3.1 of the paper: token and learned position embeddings summed, then
    n_layer post-LN blocks; no LayerNorm after the last one. The LM head is the token embedding
    transposed, so the two share their weights.

    model(ids) gives the next-token logits (batch, time, vocab_size) of token ids (batch, time);
    model.hidden_states(ids) gives the last block's output (batch, time, n_embd), which the task
    heads read. Weights start as the paper's: N(0, initializer_range), biases 0, LayerNorm gains 1.
    """

    def __init__(self, config):
        self.config = config = dataclasses.replace(config)  # our own copy: resizing changes it
        std = config.initializer_range
        self.tokens_embed = nn.Embedding(config.vocab_size, config.n_embd, std)
        self.positions_embed = nn.Embedding(config.n_ctx, config.n_embd, std)
        self.drop = nn.Dropout(config.embd_pdrop)
        self.h = [Block(config) for _ in range(config.n_layer)]

    def hidden_states(self, ids, cache=None, layers=None):
        """The last block's output (batch, time, n_embd) for token ids (batch, time); with `layers`,
        that of the first `layers` blocks.

        With a KVCache (generation), ids are the positions after those already in the cache.
        """
        start = cache.length if cache is not None else 0
        ids = self._check_ids(ids, start)
        with backend.device_scope(ids):  # on the model's GPU, whichever is current
            positions = backend.get_array_module(ids).arange(start, start + ids.shape[1])
        x = self.drop(self.tokens_embed(ids) + self.positions_embed(positions))
        for block in self.h[:layers]:
            x = block(x, cache)
        if cache is not None:
            cache.length += ids.shape[1]
        return x

    @no_grad()
    def attention_weights(self, ids, layer):
        """The attention weights of every head of block `layer` for token ids (batch, time):
        (batch, n_head, time, time), as the block's own attention computes them (no dropout)."""
        return self.h[layer].attn.weights(self.hidden_states(ids, layers=layer))

    def forward(self, ids, cache=None):
        """Next-token logits (batch, time, vocab_size)."""
        return self.lm_logits(self.hidden_states(ids, cache))

    def lm_logits(self, hidden):
        """The LM head: hidden states times W_e^T (tied to the token embedding), read from the copy of
        W_e in the hidden states' type that the embedding keeps (autograd.precision.kept_cast)."""
        table = self.tokens_embed.weight
        return F.linear(hidden, table.T, weight_cast=precision.kept_cast(table, hidden.dtype).T)

    def _check_ids(self, ids, start=0):
        """The ids as a (batch, time) integer array on the model's device. Ids that arrive on the
        host (a list, a NumPy array, a CPU tensor) are checked to lie in the vocabulary before
        they are copied there; ids already on a GPU are not, as reading them back would make the
        host wait for the GPU."""
        ids = ids.data if isinstance(ids, Tensor) else ids
        on_host = backend.device_of(ids) == "cpu"
        ids = np.asarray(ids) if on_host else ids
        if ids.ndim != 2 or ids.dtype.kind not in "iu":
            raise ValueError(f"token ids must be a (batch, time) integer array, got {ids.dtype} {ids.shape}")
        if not ids.size:
            raise ValueError(f"token ids of shape {ids.shape} hold no tokens: a batch needs one or more")
        if (length := start + ids.shape[1]) > self.config.n_ctx:
            raise ValueError(f"sequence of {length} tokens is longer than n_ctx={self.config.n_ctx}")
        if on_host and ids.size and (ids.min() < 0 or ids.max() >= self.config.vocab_size):
            raise ValueError(
                f"token ids must lie in [0, {self.config.vocab_size}), got {int(ids.min())}..{int(ids.max())}"
            )
        return backend.to_device(ids, self.tokens_embed.weight.device)

    def resize_token_embeddings(self, n):
        """Grow the vocabulary to n tokens (the paper's _start_, _delimiter_, _classify_);
        new rows are drawn like the rest, old rows stay as they are."""
        old = self.tokens_embed.weight
        if n < (tokens := old.shape[0]):
            raise ValueError(f"resize_token_embeddings: {n} is fewer than the {tokens} tokens there are")
        new_rows = nn.normal((n - old.shape[0], old.shape[1]), self.config.initializer_range).data
        with backend.device_scope(old.data):
            grown = old.xp.concatenate([old.data, backend.to_device(new_rows, old.device, old.dtype)])
        self.tokens_embed.weight = nn.Parameter(grown)
        self.config.vocab_size = n

    # ----- checkpoints in the openai-gpt layout: config.json + model.safetensors
    def save_pretrained(self, directory):
        os.makedirs(directory, exist_ok=True)
        # "pt" is the format tag transformers checks for; the bytes are plain little-endian arrays
        save_file(self.state_dict(), os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(directory, "config.json"), "w") as f:
            json.dump(self.config.to_hf_dict(), f, indent=2)

    @classmethod
    def from_pretrained(cls, directory, device="cpu"):
        """A model from config.json + model.safetensors; keys may carry a 'transformer.' prefix,
        and a tied lm_head.weight or causal-mask buffers are ignored. `directory` may also be a
        training run folder: a fine-tune's best/ is read (its best epoch), else the newest checkpoint
        (see tinygpt/weights.py)."""
        directory = weights_folder(directory)
        config = GPTConfig.from_json_file(os.path.join(directory, "config.json"))
        state = cls.read_weights(directory)
        config.check_weights(state, os.path.join(directory, "model.safetensors"))
        model = cls(config)
        model.load_state_dict(state)
        return model.to(device)

    @staticmethod
    def read_weights(directory):
        """The state dict in directory/model.safetensors, with any 'transformer.' prefix taken off
        and the tied lm_head.weight and causal-mask buffers left out; weights that are NaN or infinite,
        which no step or prediction can use, are refused (check_finite)."""
        state = {}
        for key, array in load_file(os.path.join(directory, "model.safetensors")).items():
            key = key.removeprefix("transformer.")
            if key != "lm_head.weight" and not key.endswith((".attn.bias", ".attn.masked_bias")):
                state[key] = array
        return check_finite(directory, state)

    @classmethod
    def from_openai(cls, directory, config=None):
        """GPT-1 from the original release: params_shapes.json and params_0.npy ... params_9.npy,
        flat pieces joined and cut by the shapes (positions, tokens, then each block's c_attn,
        c_proj, ln_1, c_fc, mlp c_proj, ln_2; conv weights stored as [1, in, out])."""
        if not os.path.isdir(directory):
            raise FileNotFoundError(
                f"GPT.from_openai: {directory}: no such folder (of params_shapes.json and params_*.npy)"
            )
        shapes_path = os.path.join(directory, "params_shapes.json")
        shapes = _read_shapes(shapes_path)
        pieces, i = [], 0
        while os.path.exists(os.path.join(directory, f"params_{i}.npy")):
            pieces.append(_read_piece(os.path.join(directory, f"params_{i}.npy")))
            i += 1
        flat = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
        sizes = [int(np.prod(shape)) for shape in shapes]
        if sum(sizes) != flat.size:
            raise ValueError(
                f"{directory}: the shapes need {sum(sizes)} numbers, the params_*.npy files hold {flat.size}"
            )
        arrays = [piece.reshape(shape) for piece, shape in zip(np.split(flat, np.cumsum(sizes)[:-1]), shapes)]
        if len(arrays) < 14 or (len(arrays) - 2) % 12 or arrays[0].ndim != 2 or arrays[1].ndim != 2:
            raise ValueError(
                f"{shapes_path}: {len(arrays)} shapes are not two 2-D embeddings and blocks of 12"
            )
        n_layer = (len(arrays) - 2) // 12
        one_block = GPTConfig(n_layer=1).parameter_shapes()
        block = [name.removeprefix("h.0.") for name in one_block if name.startswith("h.0.")]
        names = ["positions_embed.weight", "tokens_embed.weight"]  # the release's order
        names += [f"h.{layer}.{name}" for layer in range(n_layer) for name in block]
        state = {name: a[0] if a.shape[:1] == (1,) and a.ndim == 3 else a for name, a in zip(names, arrays)}
        try:
            (n_ctx, n_embd), vocab_size = arrays[0].shape, arrays[1].shape[0]
            config = config or GPTConfig(vocab_size=vocab_size, n_ctx=n_ctx, n_embd=n_embd, n_layer=n_layer)
            model = cls(config)
            model.load_state_dict(state)
        except ValueError as error:
            raise ValueError(f"{shapes_path}: {error}") from None
        return model


def check_finite(folder, state):
    """`state` {name: array}; a ValueError, naming the folder, where a weight is NaN or infinite."""
    for name, array in state.items():
        if not np.isfinite(array).all():
            raise ValueError(f"{folder}: not a usable checkpoint: {name} holds NaN or infinite weights")
    return state


def _read_shapes(path):
    """The array shapes listed in params_shapes.json, or a ValueError naming the file."""
    with open(path, encoding="utf-8") as f:
        try:
            shapes = json.load(f)
        except ValueError as error:
            raise ValueError(f"{path}: not JSON ({error})") from None
    if not isinstance(shapes, list):
        raise ValueError(f"{path}: must hold a list of shapes, not a {type(shapes).__name__}")
    for i, shape in enumerate(shapes):
        if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
            raise ValueError(f"{path}: shape {i} is {shape!r}, not a list of integers >= 0")
    return shapes


def _read_piece(path):
    """One params_{i}.npy: a flat array of floats, or a ValueError naming the file."""
    try:
        piece = np.load(path, allow_pickle=False)
    except ValueError as error:
        raise ValueError(f"{path}: not a NumPy array file ({error})") from None
    if piece.ndim != 1 or piece.dtype.kind != "f":
        what = f"a {piece.dtype} array of shape {piece.shape}"
        raise ValueError(f"{path}: holds {what}, not a flat one of floats")
    return piece
