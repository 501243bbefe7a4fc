"""Adam with L2 regularisation (GPT-1's decoupled rule, or classic L2), gradient clipping, and
the learning-rate schedules of GPT-1's original code."""

import math

import numpy as np

from . import backend, threads
from .backend import get_array_module
from .kernels import adam as adam_kernels
from .tensor import no_grad


class Adam:
    """Adam over a list of Parameters. `lr` may be changed between steps (schedules do that).

    l2_mode="decoupled" is GPT-1's rule, with t counted from 1:
        m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
        lr_t = lr sqrt(1 - b2^t) / (1 - b1^t)
        p -= lr_t (m / (sqrt(v) + eps) + l2 p)
    where the l2 term applies only to tensors of two or more dimensions (vectors too with
    vector_l2); t is one count for all parameters, as in GPT-1's code. l2_mode="coupled" is
    classic L2, g += l2 p before the moments, then the usual Adam step: the numbers of
    torch.optim.Adam(weight_decay=l2), on every parameter.
    """

    def __init__(
        self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, l2=0.0, l2_mode="decoupled", vector_l2=False
    ):
        if l2_mode not in ("decoupled", "coupled"):
            raise ValueError(f"Adam: l2_mode must be 'decoupled' or 'coupled', got {l2_mode!r}")
        for name, value in (
            ("lr", lr),
            ("eps", eps),
            ("l2", l2),
            ("betas[0]", betas[0]),
            ("betas[1]", betas[1]),
        ):
            if not value >= 0 or (name.startswith("betas") and value >= 1):  # `not >=` refuses NaN too
                raise ValueError(f"Adam: {name}={value} is out of range")
        self.params = list(params)
        self.lr, self.betas, self.eps, self.l2 = lr, tuple(betas), eps, l2
        self.l2_mode, self.vector_l2 = l2_mode, vector_l2
        self.step_count = 0
        self.m = [_zeros_beside(p) for p in self.params]
        self.v = [_zeros_beside(p) for p in self.params]

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @no_grad()
    def step(self):
        """Update every parameter that has a gradient.

        On the CPU the parameters are cut into blocks of a few ten thousand numbers, shared out
        among the cores: the update is a dozen passes over p, g, m and v, and on a block they run
        in the cache rather than in main memory (three times faster on GPT-1's embedding). On a
        GPU, float32 parameters go through one multi-tensor kernel (autograd/kernels/adam.py);
        other arrays of a GPU go whole, one launch per operator.
        """
        self.step_count += 1
        grads = [p.grad for p in self.params if p.grad is not None]
        for p in self.params:
            p._version += p.grad is not None  # a graph made before the step cannot backpropagate after
        if adam_kernels.takes([*(p._data for p in self.params), *self.m, *self.v, *grads]):
            return adam_kernels.adam_step(self)
        blocks = []
        with backend.device_scope(grads[0] if grads else None):  # the parameters' GPU
            for p, m, v in zip(self.params, self.m, self.v):
                if p.grad is None:
                    continue
                if get_array_module(p._data) is np and p._data.flags.c_contiguous:
                    flat = [a.reshape(-1) for a in (p._data, p.grad, m, v)]  # views (a strided grad: a copy)
                    blocks += [(p.ndim, *(a[block] for a in flat)) for block in threads.blocks(p.size, 1)]
                else:
                    self._update(p.ndim, p._data, p.grad, m, v)
        threads.for_each(lambda block: self._update(*block), blocks)

    def _update(self, ndim, p, g, m, v):
        """The Adam step on arrays p (updated in place), its gradient g, and its moments m, v."""
        xp, t, (b1, b2) = get_array_module(p), self.step_count, self.betas
        if self.l2_mode == "coupled" and self.l2:
            g = g + self.l2 * p
        m *= b1
        m += (1 - b1) * g
        v *= b2
        v += (1 - b2) * g * g
        if self.l2_mode == "decoupled":
            update = m / (xp.sqrt(v) + self.eps)
            if self.l2 and (ndim > 1 or self.vector_l2):
                update += self.l2 * p
            update *= self.lr * math.sqrt(1 - b2**t) / (1 - b1**t)
        else:
            update = m / (xp.sqrt(v) / math.sqrt(1 - b2**t) + self.eps)
            update *= self.lr / (1 - b1**t)
        p -= update

    def state_dict(self):
        """The optimizer's state: step count, hyper-parameters and the moment arrays m and v
        (the live arrays, not copies: save them before the next step)."""
        return {
            "step": self.step_count,
            "lr": self.lr,
            "betas": list(self.betas),
            "eps": self.eps,
            "l2": self.l2,
            "l2_mode": self.l2_mode,
            "vector_l2": self.vector_l2,
            "m": list(self.m),
            "v": list(self.v),
        }

    def load_state_dict(self, state):
        """Restore a state_dict() onto an optimizer made over parameters of the same shapes."""
        for key in ("m", "v"):
            if len(state[key]) != len(self.params):
                raise ValueError(
                    f"Adam.load_state_dict: {len(state[key])} {key} arrays for {len(self.params)} parameters"
                )
            for i, (array, p) in enumerate(zip(state[key], self.params)):
                if tuple(array.shape) != p.shape:
                    shapes = f"{key}[{i}] has shape {tuple(array.shape)}, parameter {p.shape}"
                    raise ValueError(f"Adam.load_state_dict: {shapes}")
        self.step_count = int(state["step"])
        self.lr, self.betas, self.eps, self.l2 = state["lr"], tuple(state["betas"]), state["eps"], state["l2"]
        self.l2_mode, self.vector_l2 = state["l2_mode"], state["vector_l2"]
        self.m = [_copy_beside(p, a) for a, p in zip(state["m"], self.params)]
        self.v = [_copy_beside(p, a) for a, p in zip(state["v"], self.params)]


def _zeros_beside(p):
    """Zeros like parameter p, on p's device."""
    with backend.device_scope(p._data):
        return p.xp.zeros(p.shape, dtype=p.dtype)


def _copy_beside(p, array):
    """A copy of `array` in C order with p's dtype, on p's device."""
    with backend.device_scope(p._data):
        return p.xp.array(array, dtype=p.dtype, order="C")


@no_grad()
def clip_grad_norm(params, max_norm):
    """Scale all gradients together so their global L2 norm is at most max_norm.

    The norm, the factor and the scaling stay on the parameters' device: nothing waits for the
    GPU. Returns the norm before clipping, a 0-d array there (float() it to log it: a read); a
    0-d NumPy zero when no parameter has a gradient. Float32 gradients of a GPU go through three
    multi-tensor kernels (autograd/kernels/adam.py).
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return np.zeros((), np.float32)
    if adam_kernels.takes(grads):
        return adam_kernels.clip_grad_norm(grads, max_norm)
    xp = get_array_module(grads[0])
    with backend.device_scope(grads[0]):  # the gradients' GPU
        squares = xp.stack([xp.vdot(g.ravel(), g.ravel()) for g in grads])  # each one's sum of squares
        norm = xp.asarray(xp.sqrt(squares.sum()))  # a 0-d array (NumPy's sum gives a scalar)
        scale = xp.minimum(max_norm / (norm + 1e-6), 1.0).astype(grads[0].dtype)
        for g in grads:
            g *= scale
    return norm


# The schedules of GPT-1's code: a factor on the learning rate at progress x = step / total,
# rising linearly over the first `warmup` fraction of training (none when warmup is 0).
def warmup_cosine(x, warmup=0.002):
    return x / warmup if 0 < warmup and x <= warmup else 0.5 * (1 + math.cos(math.pi * x))


def warmup_constant(x, warmup=0.002):
    return x / warmup if 0 < warmup and x <= warmup else 1.0


def warmup_linear(x, warmup=0.002):
    return x / warmup * (1 - x) if 0 < warmup and x <= warmup else 1 - x
