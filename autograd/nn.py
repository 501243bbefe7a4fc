"""Modules: layers that own Parameters, and the layers GPT-1 is made of.

A Module finds its parameters by looking at its attributes: a Parameter, a Module, or a list of
Modules, in the order they were assigned. Their dotted paths ("h.0.attn.c_attn.weight") are the
names used by `state_dict` and `load_state_dict`.
"""

from collections.abc import Mapping

import numpy as np

from . import backend, precision
from . import functional as F
from .ops import Concat
from .tensor import Tensor


class Parameter(Tensor):
    """A tensor a Module trains: it requires grad unless told otherwise."""

    def __init__(self, data, requires_grad=True):
        super().__init__(data, requires_grad=requires_grad)


def normal(shape, std):
    """A float32 Parameter drawn from N(0, std^2) with the CPU's default (seeded) generator."""
    return Parameter(backend.default_generator("cpu").standard_normal(shape, dtype=np.float32) * std)


class Module:
    """Base class of layers. Subclasses assign Parameters and sub-Modules in __init__ and
    define forward(); calling the module calls forward, under the module's `precision` policy
    ("fp32", "tf32", "bf16": autograd/precision.py) when one is set."""

    training = True
    precision = None  # None: the policy in force where the module is called

    def __call__(self, *args, **kwargs):
        if self.precision is None:
            return self.forward(*args, **kwargs)
        with precision.use_precision(self.precision):
            return self.forward(*args, **kwargs)

    def _members(self):
        """(name, value) for each attribute, lists and tuples opened up as name.0, name.1, ..."""
        for name, value in vars(self).items():
            if isinstance(value, (list, tuple)):
                yield from ((f"{name}.{i}", item) for i, item in enumerate(value))
            else:
                yield name, value

    def named_modules(self, prefix=""):
        """(path, module) for this module and every module below it, parents first."""
        yield prefix, self
        for name, value in self._members():
            if isinstance(value, Module):
                yield from value.named_modules(f"{prefix}{name}.")

    def named_parameters(self, prefix=""):
        """(dotted name, Parameter) for every parameter, in the order they were assigned."""
        for name, value in self._members():
            if isinstance(value, Parameter):
                yield prefix + name, value
            elif isinstance(value, Module):
                yield from value.named_parameters(f"{prefix}{name}.")

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def num_parameters(self):
        return sum(p.size for p in self.parameters())

    def zero_grad(self):
        for p in self.parameters():
            p.grad = None

    def train(self, mode=True):
        """Set training mode (dropout on) for this module and all below it; returns self."""
        for _, module in self.named_modules():
            module.training = mode
        return self

    def eval(self):
        return self.train(False)

    def to(self, device):
        """Move every parameter (and its gradient) to `device`; returns self."""
        device = backend.parse_device(device)
        for p in self.parameters():
            p.data = backend.to_device(p._data, device)
            if p.grad is not None:
                p.grad = backend.to_device(p.grad, device)
        return self

    def state_dict(self):
        """{dotted name: array} of every parameter (the arrays themselves, not copies)."""
        return {name: p.data for name, p in self.named_parameters()}

    def load_state_dict(self, state, strict=True):
        """Copy arrays from `state` into the parameters of the same names, keeping their dtype
        and device. With strict, any missing, unexpected or mis-shaped key is an error that
        lists them all, and nothing is changed."""
        state = _arrays(state)
        params = dict(self.named_parameters())
        missing = [k for k in params if k not in state]
        unexpected = [str(k) for k in state if k not in params]
        misshaped = [
            f"{k}: checkpoint {tuple(state[k].shape)}, model {p.shape}"
            for k, p in params.items()
            if k in state and tuple(state[k].shape) != p.shape
        ]
        problems = [
            (what, keys)
            for what, keys in (
                ("missing keys", missing),
                ("unexpected keys", unexpected),
                ("mis-shaped keys", misshaped),
            )
            if keys and (strict or what == "mis-shaped keys")
        ]
        if problems:
            raise ValueError(
                "load_state_dict: " + "; ".join(f"{what}: {', '.join(keys)}" for what, keys in problems)
            )
        for name, p in params.items():
            if name in state:
                array = backend.to_device(state[name], p.device, p.dtype)
                p.data = array.copy() if array is state[name] else array
        return missing, unexpected

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} defines no forward()")


def _arrays(state):
    """A state dict's arrays (a Tensor's own), or a TypeError naming the entries that are none."""
    if not isinstance(state, Mapping):
        raise TypeError(f"load_state_dict: state must be a dict of name -> array, not {type(state).__name__}")
    state = {k: v.data if isinstance(v, Tensor) else v for k, v in state.items()}
    kinds = {k: getattr(v, "dtype", type(v).__name__) for k, v in state.items()}
    wrong = [f"{k} ({kind})" for k, kind in kinds.items() if not precision.is_numeric(kind)]
    if wrong:
        raise TypeError(f"load_state_dict: these entries are not arrays of numbers: {', '.join(wrong)}")
    return state


class Linear(Module):
    """y = x @ weight + bias, weight shaped (n_in, n_out); weights N(0, std^2), bias zero."""

    def __init__(self, n_in, n_out, bias=True, std=0.02):
        self.weight = normal((n_in, n_out), std)
        self.bias = Parameter(np.zeros(n_out, dtype=np.float32)) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class Embedding(Module):
    """A table of n vectors of width d, looked up by integer ids."""

    def __init__(self, n, d, std=0.02):
        self.weight = normal((n, d), std)

    def forward(self, ids):
        return F.embedding(ids, self.weight)


class LayerNorm(Module):
    """Layer normalisation over the last axis with a learned gain (1) and bias (0)."""

    def __init__(self, d, eps=1e-5):
        self.weight = Parameter(np.ones(d, dtype=np.float32))
        self.bias = Parameter(np.zeros(d, dtype=np.float32))
        self.eps = eps

    def forward(self, x):
        return F.layer_norm(x, self.weight, self.bias, self.eps)

    def residual(self, x, y, bias, dropout):
        """self(x + dropout(y + bias)) as one op (F.residual_layer_norm): how a post-LN block ends a
        sublayer whose last product is y, its bias and its Dropout module `dropout` not yet applied."""
        return F.residual_layer_norm(
            x, y, bias, self.weight, self.bias, self.eps, dropout.p, dropout.training
        )


class Dropout(Module):
    """Inverted dropout while training, its masks drawn from the current stream (autograd.random,
    the input's first axis the example axis); the identity in eval mode."""

    def __init__(self, p):
        self.p = p

    def forward(self, x):
        return F.dropout(x, self.p, self.training)


class CausalSelfAttention(Module):
    """Masked multi-head self-attention: one projection to q, k, v (c_attn), heads attended
    in parallel, merged back and projected (c_proj), then residual dropout."""

    def __init__(self, n_embd, n_head, attn_pdrop=0.1, resid_pdrop=0.1, std=0.02):
        if n_embd % n_head:
            raise ValueError(f"n_embd={n_embd} is not divisible by n_head={n_head}")
        self.n_head = n_head
        self.attn_pdrop = attn_pdrop
        self.c_attn = Linear(n_embd, 3 * n_embd, std=std)
        self.c_proj = Linear(n_embd, n_embd, std=std)
        self.resid_dropout = Dropout(resid_pdrop)

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
        qkv = self.c_attn(x)  # (B, T, 3 D)
        batch, time, width = x.shape
        heads = qkv.reshape(batch, time, 3, self.n_head, width // self.n_head)  # (B, T, 3, H, D / H)
        q, k, v = (heads[:, :, i].transpose(0, 2, 1, 3) for i in range(3))  # each (B, H, T, D / H)
        k, v = cache.extend(self, k, v)  # (B, H, S, D / H): the S positions so far
        y = F.scaled_dot_product_attention(q, k, v, causal=True, dropout_p=dropout_p)  # (B, H, T, D / H)
        return y.transpose(0, 2, 1, 3).reshape(batch, time, width)  # heads merged: (B, T, D)


class KVCache:
    """The keys and values of the positions seen so far, for each attention layer, so that
    generating one more token costs attention over one new position, not the whole sequence."""

    def __init__(self):
        self.length = 0  # positions cached; the model advances it after each call
        self._keys, self._values = {}, {}

    def extend(self, layer, k, v):
        """Append this call's k and v (batch, head, time, width) for `layer`; return all so far."""
        if layer in self._keys:
            k = Concat.apply(self._keys[layer], k, axis=2)
            v = Concat.apply(self._values[layer], v, axis=2)
        self._keys[layer], self._values[layer] = k, v
        return k, v


class MLP(Module):
    """The position-wise feed-forward network: c_fc, GELU, c_proj, residual dropout."""

    def __init__(self, n_embd, n_inner, resid_pdrop=0.1, approximate="tanh", std=0.02):
        self.c_fc = Linear(n_embd, n_inner, std=std)
        self.c_proj = Linear(n_inner, n_embd, std=std)
        self.dropout = Dropout(resid_pdrop)
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
