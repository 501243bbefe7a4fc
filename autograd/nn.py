"""Modules: layers that own Parameters (the general ones: GPT-1's own are in tinygpt/model.py).

A Module finds its parameters by looking at its attributes: a Parameter, a Module, or a list of
Modules, in the order they were assigned. Their dotted paths ("h.0.attn.c_attn.weight") are the
names used by `state_dict` and `load_state_dict`.
"""

from collections.abc import Mapping

import numpy as np

from . import backend, precision, random
from . import functional as F
from .tensor import Tensor


class Parameter(Tensor):
    """A tensor a Module trains: it requires grad unless told otherwise."""

    def __init__(self, data, requires_grad=True):
        super().__init__(data, requires_grad=requires_grad)


def normal(shape, std):
    """A float32 Parameter drawn from N(0, std^2) with the CPU's default (seeded) generator."""
    return Parameter(random.default_generator("cpu").standard_normal(shape, dtype=np.float32) * std)


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
