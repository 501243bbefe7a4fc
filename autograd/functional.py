"""The layers' arithmetic as fused functionals: each one Function with a hand-written backward.

Import as `from autograd import functional as F`. Inputs are Tensors; token ids and targets may
also be plain integer arrays.
"""
import math

import numpy as np

from . import backend, buffers, parallel
from .backend import get_array_module
from .tensor import Function, Tensor

IGNORE_INDEX = -100  # a target that cross_entropy leaves out (padding, positions not predicted)


def _indices(ids, like):
    """Integer indices as a raw array on the same device as the tensor `like`."""
    ids = ids.data if isinstance(ids, Tensor) else like.xp.asarray(ids)
    if ids.size == 0:
        ids = ids.astype(np.int64)  # an empty list arrives as float
    if ids.dtype.kind not in "iu":
        raise TypeError(f"indices must be integers, got {ids.dtype}")
    return ids


# ----------------------------------------------------------------------------------------------
class Linear(Function):
    """x @ weight + bias over the last axis of x, as one 2-D matrix product."""

    new_grads = True

    @staticmethod
    def forward(ctx, x, weight, bias):
        if weight.ndim != 2:
            raise ValueError(f"linear: weight must be 2-D (in, out), got shape {weight.shape}")
        n_in, n_out = weight.shape
        if x.shape[-1] != n_in:
            raise ValueError(f"linear: input has {x.shape[-1]} features, weight {weight.shape} expects {n_in}")
        if bias is not None and bias.shape != (n_out,):
            raise ValueError(f"linear: bias has shape {bias.shape}, expected ({n_out},) for weight {weight.shape}")
        x2 = x.reshape(-1, n_in)
        out = parallel.matmul(x2, weight, bias)
        ctx.x2, ctx.weight, ctx.x_shape = x2, weight, x.shape
        return out.reshape(*x.shape[:-1], n_out)

    @staticmethod
    def backward(ctx, grad):
        need_x, need_w, need_b = ctx.needs_input_grad
        x2, weight = ctx.x2, ctx.weight
        g2 = grad.reshape(-1, weight.shape[1])
        grad_weight = None
        if need_w:  # in the weight's own memory order: a transposed table (the tied LM head) gets a
            # transposed gradient, so the table's own gradient comes out contiguous, not strided
            grad_weight = parallel.matmul(g2.T, x2).T if _is_transposed(weight) else parallel.matmul(x2.T, g2)
        return (parallel.matmul(g2, weight.T).reshape(ctx.x_shape) if need_x else None,
                grad_weight,
                g2.sum(axis=0) if need_b else None)


def _is_transposed(a):
    """True for a 2-D array laid out column by column (the .T of a row-major one)."""
    return a.flags.f_contiguous and not a.flags.c_contiguous


def linear(x, weight, bias=None):
    """x @ weight + bias, with weight shaped (in, out)."""
    return Linear.apply(x, weight, bias)


# ----------------------------------------------------------------------------------------------
class Embedding(Function):
    """Rows of a table picked by integer ids; the backward scatter-adds into the picked rows."""

    new_grads = True

    @staticmethod
    def forward(ctx, ids, weight):
        n_rows = weight.shape[0]
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= n_rows):
            raise IndexError(f"embedding: ids must lie in [0, {n_rows}), got {int(ids.min())}..{int(ids.max())}")
        ctx.ids, ctx.weight_shape = ids, weight.shape
        return weight[ids]

    @staticmethod
    def backward(ctx, grad):
        xp = get_array_module(grad)
        grad_weight = xp.zeros(ctx.weight_shape, dtype=grad.dtype)
        xp.add.at(grad_weight, ctx.ids.reshape(-1), grad.reshape(-1, ctx.weight_shape[1]))
        return None, grad_weight


def embedding(ids, weight):
    """weight[ids]: ids of any shape give vectors of shape ids.shape + (weight.shape[1],)."""
    return Embedding.apply(_indices(ids, weight), weight)


# ----------------------------------------------------------------------------------------------
class Softmax(Function):
    @staticmethod
    def forward(ctx, x, axis):
        xp = get_array_module(x)
        out = x - x.max(axis=axis, keepdims=True)
        xp.exp(out, out=out)
        out /= out.sum(axis=axis, keepdims=True)
        ctx.out, ctx.axis = out, axis
        return out

    @staticmethod
    def backward(ctx, grad):
        out = ctx.out
        return out * (grad - (grad * out).sum(axis=ctx.axis, keepdims=True))


def softmax(x, axis=-1):
    """exp(x) / sum(exp(x)) along `axis`, shifted by the maximum so it never overflows."""
    return Softmax.apply(x, axis=axis)


class LogSoftmax(Function):
    @staticmethod
    def forward(ctx, x, axis):
        xp = get_array_module(x)
        out = x - x.max(axis=axis, keepdims=True)
        out -= xp.log(xp.exp(out).sum(axis=axis, keepdims=True))
        ctx.out, ctx.axis = out, axis
        return out

    @staticmethod
    def backward(ctx, grad):
        xp = get_array_module(grad)
        return grad - xp.exp(ctx.out) * grad.sum(axis=ctx.axis, keepdims=True)


def log_softmax(x, axis=-1):
    """x - logsumexp(x) along `axis`: the log of softmax, without its underflow."""
    return LogSoftmax.apply(x, axis=axis)


# ----------------------------------------------------------------------------------------------
class CrossEntropy(Function):
    """Mean (or sum, or each) of -log softmax(logits)[target], fused so no one-hot is ever made.

    The forward goes through the logits in blocks of rows, so its exp lands in a small buffer,
    and keeps only each row's maximum and log-sum-exp. The backward writes
    softmax(logits) - onehot(target) straight into the one array it returns.
    """

    @staticmethod
    def forward(ctx, logits, targets, ignore_index, reduction):
        xp = get_array_module(logits)
        if targets.shape != logits.shape[:-1]:
            raise ValueError(f"cross_entropy: targets of shape {targets.shape} do not match logits {logits.shape}")
        n_classes = logits.shape[-1]
        logits2, targets = logits.reshape(-1, n_classes), targets.reshape(-1)
        counted = targets != ignore_index
        if bool(((targets < 0) | (targets >= n_classes))[counted].any()):
            raise IndexError(f"cross_entropy: targets must lie in [0, {n_classes}) or equal ignore_index={ignore_index}")
        safe_targets = xp.where(counted, targets, 0)
        rows = xp.arange(len(targets))

        row_max = logits2.max(axis=1, keepdims=True) if len(targets) else xp.zeros((0, 1), logits.dtype)
        log_sum = xp.empty_like(row_max)

        def log_sum_exp(rows):
            shifted = logits2[rows] - row_max[rows]  # the largest is 0, so exp never overflows
            log_sum[rows] = xp.log(xp.exp(shifted, out=shifted).sum(axis=1, keepdims=True))

        parallel.run(log_sum_exp, parallel.blocks(len(targets), n_classes, xp))
        losses = (log_sum[:, 0] - (logits2[rows, safe_targets] - row_max[:, 0])) * counted

        ctx.logits2, ctx.row_max, ctx.log_sum = logits2, row_max, log_sum
        ctx.rows, ctx.targets, ctx.counted = rows, safe_targets, counted
        ctx.reduction, ctx.shape = reduction, logits.shape
        if reduction == "none":
            return losses.reshape(logits.shape[:-1])
        if reduction == "sum":
            return losses.sum()
        ctx.count = xp.maximum(counted.sum(dtype=logits.dtype), 1)
        return losses.sum() / ctx.count

    @staticmethod
    def backward(ctx, grad):
        xp = get_array_module(grad)
        if ctx.reduction == "none":
            weight = grad.reshape(-1) * ctx.counted
        elif ctx.reduction == "sum":
            weight = grad * ctx.counted
        else:
            weight = (grad / ctx.count) * ctx.counted
        weight = weight[:, None]
        grad_logits = buffers.empty(ctx.logits2.shape, ctx.logits2.dtype, xp)

        def softmax_times_weight(rows):
            probs = xp.subtract(ctx.logits2[rows], ctx.row_max[rows], out=grad_logits[rows])
            probs -= ctx.log_sum[rows]
            xp.exp(probs, out=probs)
            probs *= weight[rows]

        parallel.run(softmax_times_weight, parallel.blocks(*grad_logits.shape, xp))
        grad_logits[ctx.rows, ctx.targets] -= weight[:, 0]
        return grad_logits.reshape(ctx.shape), None


def cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="mean"):
    """Cross-entropy of logits (..., C) against integer targets (...).

    Targets equal to `ignore_index` add nothing. reduction: "mean" over the targets that count
    (0, with a zero gradient, when none do), "sum", or "none" for one loss per target.
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    return CrossEntropy.apply(logits, _indices(targets, logits), ignore_index=ignore_index, reduction=reduction)


# ----------------------------------------------------------------------------------------------
_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_INV_SQRT_2 = 1 / math.sqrt(2)
_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)


def _tanh_inner(x, t):
    """t = tanh(sqrt(2/pi) (x + 0.044715 x^3)), written into the array t (shaped like x)."""
    xp = get_array_module(x)
    xp.multiply(x, x, out=t)
    t *= 0.044715
    t += 1
    t *= x  # x + 0.044715 x^3
    t *= _SQRT_2_OVER_PI
    return xp.tanh(t, out=t)


class GELU(Function):
    """x * Phi(x). "tanh" is GPT-1's approximation, "none" the exact form with erf.

    The tanh form goes through the numbers in cache-sized blocks, on all cores, in place in the
    output; the backward computes the tanh again rather than keeping a second array that size.
    """

    @staticmethod
    def forward(ctx, x, approximate):
        xp = get_array_module(x)
        ctx.x, ctx.approximate = x, approximate
        if approximate == "none":
            return 0.5 * x * (1 + backend.erf(x * _INV_SQRT_2))
        out = buffers.empty(x.shape, x.dtype, xp)
        flat_x, flat_out = x.reshape(-1), out.reshape(-1)

        def gelu(block):  # 0.5 x (1 + t)
            x, out = flat_x[block], flat_out[block]
            _tanh_inner(x, out)
            out += 1
            out *= x
            out *= 0.5

        parallel.run(gelu, parallel.blocks(x.size, 1, xp))
        return out

    @staticmethod
    def backward(ctx, grad):
        xp, x = get_array_module(grad), ctx.x
        if ctx.approximate == "none":
            return grad * (0.5 * (1 + backend.erf(x * _INV_SQRT_2)) + x * _INV_SQRT_2PI * xp.exp(-0.5 * x * x))
        grad_x = buffers.empty(x.shape, x.dtype, xp)
        flat_x, flat_grad, flat_grad_x = x.reshape(-1), grad.reshape(-1), grad_x.reshape(-1)

        def slope_times_grad(block):
            # slope = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
            x, slope = flat_x[block], flat_grad_x[block]
            t = _tanh_inner(x, xp.empty_like(x))
            xp.multiply(t, t, out=slope)
            xp.subtract(1, slope, out=slope)
            slope *= x
            inner = x * x
            inner *= 0.5 * _SQRT_2_OVER_PI * 3 * 0.044715
            inner += 0.5 * _SQRT_2_OVER_PI
            slope *= inner
            xp.multiply(t, 0.5, out=inner)
            inner += 0.5
            slope += inner
            slope *= flat_grad[block]

        parallel.run(slope_times_grad, parallel.blocks(x.size, 1, xp))
        return grad_x


def gelu(x, approximate="tanh"):
    """The GELU activation; approximate="tanh" (GPT-1's) or "none" (exact, with erf)."""
    if approximate not in ("tanh", "none"):
        raise ValueError(f"gelu: approximate must be 'tanh' or 'none', got {approximate!r}")
    return GELU.apply(x, approximate=approximate)


# ----------------------------------------------------------------------------------------------
def _row_dot(a, b):
    """sum(a * b) over the last axis, kept as an axis of 1, without an a * b temporary."""
    return get_array_module(a).einsum("...i,...i->...", a, b)[..., None]


class LayerNorm(Function):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis (biased variance).

    Rows are normalised in cache-sized blocks, on all cores."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        xp = get_array_module(x)
        for name, p in (("weight", weight), ("bias", bias)):
            if p is not None and p.shape != x.shape[-1:]:
                raise ValueError(f"layer_norm: {name} has shape {p.shape}, expected {x.shape[-1:]}")
        width = x.shape[-1]
        x2 = x.reshape(-1, width)
        normed, out = buffers.empty(x2.shape, x.dtype, xp), buffers.empty(x2.shape, x.dtype, xp)
        rstd = xp.empty((len(x2), 1), x.dtype)

        def normalise(rows):
            n = xp.subtract(x2[rows], x2[rows].mean(axis=1, keepdims=True), out=normed[rows])
            rstd[rows] = 1 / xp.sqrt(_row_dot(n, n) / width + eps)
            n *= rstd[rows]
            if weight is not None:
                xp.multiply(n, weight, out=out[rows])
            else:
                out[rows] = n
            if bias is not None:
                out[rows] += bias

        parallel.run(normalise, parallel.blocks(len(x2), width, xp))
        ctx.normed, ctx.rstd, ctx.weight = normed, rstd, weight
        return out.reshape(x.shape)

    @staticmethod
    def backward(ctx, grad):
        xp = get_array_module(grad)
        need_x, need_w, need_b = ctx.needs_input_grad
        normed, rstd, weight = ctx.normed, ctx.rstd, ctx.weight
        width = normed.shape[1]
        grad2 = grad.reshape(-1, width)
        grad_weight = xp.einsum("ni,ni->i", grad2, normed) if need_w else None
        grad_x = buffers.empty(normed.shape, grad.dtype, xp) if need_x else None

        def input_gradient(rows):  # rstd (g - mean(g) - normed mean(g normed)), g = grad * weight
            g = grad2[rows] * weight if weight is not None else grad2[rows]
            gx = xp.subtract(g, g.mean(axis=1, keepdims=True), out=grad_x[rows])
            n = normed[rows]
            n *= _row_dot(g, n) / width  # normed is not needed after this
            gx -= n
            gx *= rstd[rows]

        if need_x:
            parallel.run(input_gradient, parallel.blocks(len(normed), width, xp))
        return (None if grad_x is None else grad_x.reshape(grad.shape), grad_weight,
                grad2.sum(axis=0) if need_b else None)


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    """Layer normalisation over the last axis, eps inside the square root, as in GPT-1."""
    return LayerNorm.apply(x, weight, bias, eps=eps)


# ----------------------------------------------------------------------------------------------
def _keep_mask(generator, shape, p):
    """A boolean mask that keeps each entry with probability 1 - p."""
    return generator.random(shape, dtype=np.float32) >= p


def _drop(x, keep, scale):
    """x where keep is true, times scale; zero elsewhere."""
    out = x * keep
    out *= scale
    return out


class Dropout(Function):
    """Zero each entry with probability p and scale the rest by 1 / (1 - p) (inverted dropout)."""

    @staticmethod
    def forward(ctx, x, p, generator):
        ctx.keep, ctx.scale = _keep_mask(generator, x.shape, p), (0.0 if p == 1 else 1 / (1 - p))
        return _drop(x, ctx.keep, ctx.scale)

    @staticmethod
    def backward(ctx, grad):
        return _drop(grad, ctx.keep, ctx.scale)


def _check_probability(name, p):
    if not 0 <= p <= 1:
        raise ValueError(f"{name} must be a probability in [0, 1], got {p}")


def dropout(x, p=0.5, training=True, generator=None):
    """Inverted dropout. Off when not training or p == 0. `generator` (from
    autograd.backend.new_generator) makes the mask reproducible; by default the device's own,
    seeded by autograd.manual_seed."""
    _check_probability("dropout: p", p)
    if not training or p == 0:
        return x
    return Dropout.apply(x, p=p, generator=generator or backend.default_generator(x.device))


# ----------------------------------------------------------------------------------------------
# attention lives in its own file; it builds on the dropout mask above
from .attention import (MultiHeadAttention, ScaledDotProductAttention, multi_head_attention,  # noqa: E402
                        scaled_dot_product_attention)
