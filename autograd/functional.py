"""The layers' arithmetic as functionals: each one Function with a hand-written backward.

Import as `from autograd import functional as F`. Inputs are Tensors; token ids and targets may
also be plain integer arrays. Each Function's forward and backward are its reference, written
as whole-array formulas under the math they compute; the heavy ones name their fast paths
(autograd/kernels) beside them.
"""

import math

import numpy as np

from . import backend, masks, random
from .attention import (  # noqa: F401 (offered as F.* with the rest)
    MultiHeadAttention,
    ScaledDotProductAttention,
    multi_head_attention,
    scaled_dot_product_attention,
)
from .backend import get_array_module
from .kernels import cross_entropy as cross_entropy_kernels
from .kernels import gelu as gelu_kernels
from .kernels import layer_norm as layer_norm_kernels
from .kernels import linear as linear_kernels
from .tensor import Function, Tensor

IGNORE_INDEX = -100  # a target that cross_entropy leaves out (padding, positions not predicted)


def _indices(ids):
    """Integer indices as a raw array, where they are: a list, a NumPy array or a CPU tensor gives
    a NumPy array, for the caller to check on the host before copying it to the device; a GPU
    array or tensor gives its GPU array, unchecked (reading it would make the host wait)."""
    ids = ids.data if isinstance(ids, Tensor) else ids
    if backend.device_of(ids) == "cpu":
        ids = np.asarray(ids)
    if ids.size == 0:
        ids = ids.astype(np.int64)  # an empty list arrives as float
    if ids.dtype.kind not in "iu":
        raise TypeError(f"indices must be integers, got {ids.dtype}")
    return ids


# ----------------------------------------------------------------------------------------------
class Linear(Function):
    """y = x W + b over the last axis of x, with W shaped (in, out).

    Over the rows of x and dy:
        dx = dy W^T,   dW = x^T dy,   db = the sum of dy's rows
    """

    returns_new_arrays = True
    forward_cpu, backward_cpu = linear_kernels.forward_cpu, linear_kernels.backward_cpu

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.x, ctx.weight = x, weight
        out = x @ weight  # (..., out)
        if bias is not None:
            out += bias
        return out

    @staticmethod
    def backward(ctx, grad):
        need_x, need_w, need_b = ctx.needs_input_grad
        x2 = ctx.x.reshape(-1, ctx.x.shape[-1])  # (rows, in)
        grad2 = grad.reshape(-1, grad.shape[-1])  # (rows, out)
        return (
            grad @ ctx.weight.T if need_x else None,
            x2.T @ grad2 if need_w else None,
            grad2.sum(axis=0) if need_b else None,
        )


def linear(x, weight, bias=None):
    """x @ weight + bias, with weight shaped (in, out)."""
    if weight.ndim != 2:
        raise ValueError(f"linear: weight must be 2-D (in, out), got shape {weight.shape}")
    n_in, n_out = weight.shape
    if x.shape[-1] != n_in:
        raise ValueError(f"linear: input has {x.shape[-1]} features, weight {weight.shape} expects {n_in}")
    if bias is not None and bias.shape != (n_out,):
        raise ValueError(
            f"linear: bias has shape {bias.shape}, expected ({n_out},) for weight {weight.shape}"
        )
    return Linear.apply(x, weight, bias)


# ----------------------------------------------------------------------------------------------
class Embedding(Function):
    """y = W[ids]: one row of the table per id. dW adds dy's vectors into the rows they came
    from, so an id that appears twice gets both."""

    returns_new_arrays = True

    @staticmethod
    def forward(ctx, ids, weight):
        ctx.ids, ctx.weight_shape = ids, weight.shape
        return weight[ids]

    @staticmethod
    def backward(ctx, grad):
        rows = grad.reshape(-1, ctx.weight_shape[1])
        return None, backend.scatter_add(ctx.weight_shape, ctx.ids.reshape(-1), rows)


def embedding(ids, weight):
    """weight[ids]: ids of any shape give vectors of shape ids.shape + (weight.shape[1],). Ids on
    the host (a list, a NumPy array, a CPU tensor) are checked to lie in [0, rows) before they are
    copied to the weight's device; ids already on a GPU are not, as that would wait for the GPU."""
    ids = _indices(ids)
    n_rows = weight.shape[0]
    if isinstance(ids, np.ndarray) and ids.size and (ids.min() < 0 or ids.max() >= n_rows):
        raise IndexError(f"embedding: ids must lie in [0, {n_rows}), got {int(ids.min())}..{int(ids.max())}")
    return Embedding.apply(weight.xp.asarray(ids), weight)


# ----------------------------------------------------------------------------------------------
class Softmax(Function):
    """y = exp(x - max x) / sum(exp(x - max x)) along an axis (the shift keeps exp from
    overflowing and cancels out);  dx = y (dy - sum(dy y))."""

    @staticmethod
    def forward(ctx, x, axis):
        xp = get_array_module(x)
        exp = xp.exp(x - x.max(axis=axis, keepdims=True))
        ctx.out, ctx.axis = exp / exp.sum(axis=axis, keepdims=True), axis
        return ctx.out

    @staticmethod
    def backward(ctx, grad):
        out = ctx.out
        return out * (grad - (grad * out).sum(axis=ctx.axis, keepdims=True))


def softmax(x, axis=-1):
    """exp(x) / sum(exp(x)) along `axis`, shifted by the maximum so it never overflows."""
    return Softmax.apply(x, axis=axis)


class LogSoftmax(Function):
    """y = x - logsumexp(x) = (x - max x) - log sum(exp(x - max x)) along an axis;
    dx = dy - exp(y) sum(dy)."""

    @staticmethod
    def forward(ctx, x, axis):
        shifted, log_sum = _shift_and_log_sum(x, axis)
        ctx.out, ctx.axis = shifted - log_sum, axis
        return ctx.out

    @staticmethod
    def backward(ctx, grad):
        xp = get_array_module(grad)
        return grad - xp.exp(ctx.out) * grad.sum(axis=ctx.axis, keepdims=True)


def _shift_and_log_sum(x, axis):
    """(x - max x, log sum(exp(x - max x))) along `axis`, the sum kept as an axis of 1: the
    largest shifted value is 0, so exp never overflows, and logsumexp(x) = max x + the log sum."""
    xp = get_array_module(x)
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted, xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True))


def log_softmax(x, axis=-1):
    """x - logsumexp(x) along `axis`: the log of softmax, without its underflow."""
    return LogSoftmax.apply(x, axis=axis)


# ----------------------------------------------------------------------------------------------
class CrossEntropy(Function):
    """The loss of each row of logits z (C classes) at its target t, never making a one-hot
    (z is shifted by its row's maximum first, which changes neither):

        loss_i = logsumexp(z_i) - z_i[t_i]      (0 where t_i is ignored)
        dloss_i / dz_i = softmax(z_i) - onehot(t_i)
    """

    forward_cpu, backward_cpu = cross_entropy_kernels.forward_cpu, cross_entropy_kernels.backward_cpu

    @staticmethod
    def forward(ctx, logits, targets, ignore_index):
        xp = get_array_module(logits)
        z, log_sum = _shift_and_log_sum(logits.reshape(-1, logits.shape[-1]), axis=1)  # (rows, C), (rows, 1)
        counted = targets.reshape(-1) != ignore_index  # (rows,)
        t = xp.where(counted, targets.reshape(-1), 0)  # an ignored row points at class 0, counted as 0
        rows = xp.arange(len(t))
        ctx.z, ctx.log_sum, ctx.rows, ctx.t, ctx.counted = z, log_sum, rows, t, counted
        return ((log_sum[:, 0] - z[rows, t]) * counted).reshape(targets.shape)

    @staticmethod
    def backward(ctx, grad):
        xp = get_array_module(grad)
        weight = grad.reshape(-1) * ctx.counted  # (rows,): each row's loss gradient, 0 where ignored
        grad_z = xp.exp(ctx.z - ctx.log_sum) * weight[:, None]  # softmax(z), weighted
        grad_z[ctx.rows, ctx.t] -= weight  # minus the one-hot
        return grad_z.reshape(*grad.shape, -1), None


def cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="mean"):
    """Cross-entropy of logits (..., C) against integer targets (...).

    Targets equal to `ignore_index` add nothing. reduction: "mean" over the targets that count
    (0, with a zero gradient, when none do), "sum", or "none" for one loss per target.
    Targets that arrive on the host (a list, a NumPy array, a CPU tensor) are checked before they
    are copied to the logits' device; targets already on a GPU are not (see embedding).
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    targets = _indices(targets)
    if targets.shape != logits.shape[:-1]:
        raise ValueError(
            f"cross_entropy: targets of shape {targets.shape} do not match logits {logits.shape}"
        )
    n_classes = logits.shape[-1]
    on_host = isinstance(targets, np.ndarray)
    if on_host and (((targets < 0) | (targets >= n_classes)) & (targets != ignore_index)).any():
        raise IndexError(
            f"cross_entropy: targets must lie in [0, {n_classes}) or equal ignore_index={ignore_index}"
        )
    targets = logits.xp.asarray(targets)
    losses = CrossEntropy.apply(logits, targets, ignore_index=ignore_index)
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    counted = (targets != ignore_index).sum(dtype=logits.dtype)
    return losses.sum() / logits.xp.maximum(counted, 1)  # none counted: 0 / 1


# ----------------------------------------------------------------------------------------------
SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


class GELU(Function):
    """GPT-1's GELU, the tanh approximation of x Phi(x).

    With t = tanh(sqrt(2/pi) (x + 0.044715 x^3)):
        y = 0.5 x (1 + t)
        dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
    """

    forward_cpu, backward_cpu = gelu_kernels.forward_cpu, gelu_kernels.backward_cpu

    @staticmethod
    def forward(ctx, x):
        xp = get_array_module(x)
        ctx.x = x
        ctx.t = xp.tanh(SQRT_2_OVER_PI * (x + 0.044715 * x**3))
        return 0.5 * x * (1 + ctx.t)

    @staticmethod
    def backward(ctx, grad):
        x, t = ctx.x, ctx.t
        return grad * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x))


class ExactGELU(Function):
    """The exact GELU, x Phi(x).

    With the normal distribution's cdf Phi and density phi:
        y = x Phi(x),   Phi(x) = 0.5 (1 + erf(x / sqrt(2)))
        dy/dx = Phi(x) + x phi(x),   phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
    """

    @staticmethod
    def forward(ctx, x):
        ctx.x = x
        return x * _normal_cdf(x)

    @staticmethod
    def backward(ctx, grad):
        xp, x = get_array_module(grad), ctx.x
        return grad * (_normal_cdf(x) + x * xp.exp(-0.5 * x * x) / math.sqrt(2 * math.pi))


def _normal_cdf(x):
    return 0.5 * (1 + backend.erf(x / math.sqrt(2)))


def gelu(x, approximate="tanh"):
    """The GELU activation; approximate="tanh" (GPT-1's) or "none" (exact, with erf)."""
    if approximate not in ("tanh", "none"):
        raise ValueError(f"gelu: approximate must be 'tanh' or 'none', got {approximate!r}")
    return GELU.apply(x) if approximate == "tanh" else ExactGELU.apply(x)


# ----------------------------------------------------------------------------------------------
class LayerNorm(Function):
    """Each row over the last axis normalised, then scaled and shifted:

        n = (x - mean) / sqrt(var + eps),   y = n w + b      (var: the biased variance)

    and back, with g = dy w (dy alone without a weight), means over the row:

        dx = (g - mean(g) - n mean(g n)) / sqrt(var + eps),   dw = sum over rows of dy n,
        db = sum over rows of dy
    """

    forward_cpu, backward_cpu = layer_norm_kernels.forward_cpu, layer_norm_kernels.backward_cpu

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        xp = get_array_module(x)
        centered = x - x.mean(axis=-1, keepdims=True)  # (..., D)
        ctx.rstd = 1 / xp.sqrt((centered * centered).mean(axis=-1, keepdims=True) + eps)  # (..., 1)
        ctx.normed, ctx.weight = centered * ctx.rstd, weight
        out = ctx.normed if weight is None else ctx.normed * weight
        return out if bias is None else out + bias

    @staticmethod
    def backward(ctx, grad):
        need_x, need_w, need_b = ctx.needs_input_grad
        normed, width = ctx.normed, grad.shape[-1]
        g = grad if ctx.weight is None else grad * ctx.weight
        grad_x = None
        if need_x:
            row_mean = g.mean(axis=-1, keepdims=True)
            grad_x = (g - row_mean - normed * (g * normed).mean(axis=-1, keepdims=True)) * ctx.rstd
        grad2, normed2 = grad.reshape(-1, width), normed.reshape(-1, width)  # (rows, D)
        return (
            grad_x,
            (grad2 * normed2).sum(axis=0) if need_w else None,
            grad2.sum(axis=0) if need_b else None,
        )


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    """Layer normalisation over the last axis, eps inside the square root, as in GPT-1."""
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and p.shape != x.shape[-1:]:
            raise ValueError(f"layer_norm: {name} has shape {p.shape}, expected {x.shape[-1:]}")
    return LayerNorm.apply(x, weight, bias, eps=eps)


# ----------------------------------------------------------------------------------------------
class Dropout(Function):
    """y = x keep / (1 - p), with keep a random mask of entries kept with probability 1 - p
    (inverted dropout: the mean is unchanged);  dx = dy keep / (1 - p)."""

    @staticmethod
    def forward(ctx, x, p, generator):
        ctx.keep = masks.keep_mask(generator, x.shape, p, get_array_module(x))
        ctx.scale = masks.keep_scale(p)
        return masks.drop(x, ctx.keep, ctx.scale)

    @staticmethod
    def backward(ctx, grad):
        return masks.drop(grad, ctx.keep, ctx.scale)


def dropout(x, p=0.5, training=True, generator=None):
    """Inverted dropout. Off when not training or p == 0. The mask is the next draw of
    `generator`, an autograd.random.MaskStream (x's first axis its example axis), by default of
    the current stream (autograd.random.current)."""
    masks.check_probability("dropout: p", p)
    if not training or p == 0:
        return x
    return Dropout.apply(x, p=p, generator=generator if generator is not None else random.current())
