"""The layers' arithmetic as fused functionals: each one Function with a hand-written backward.

Import as `from autograd import functional as F`. Inputs are Tensors; token ids and targets may
also be plain integer arrays.
"""
import math

import numpy as np

from . import backend
from .backend import get_array_module
from .ops import unbroadcast
from .tensor import Function, Tensor


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
        out = x2 @ weight
        if bias is not None:
            out += bias
        ctx.x2, ctx.weight, ctx.x_shape = x2, weight, x.shape
        return out.reshape(*x.shape[:-1], n_out)

    @staticmethod
    def backward(ctx, grad):
        need_x, need_w, need_b = ctx.needs_input_grad
        g2 = grad.reshape(-1, ctx.weight.shape[1])
        return ((g2 @ ctx.weight.T).reshape(ctx.x_shape) if need_x else None,
                ctx.x2.T @ g2 if need_w else None,
                g2.sum(axis=0) if need_b else None)


def linear(x, weight, bias=None):
    """x @ weight + bias, with weight shaped (in, out)."""
    return Linear.apply(x, weight, bias)


# ----------------------------------------------------------------------------------------------
class Embedding(Function):
    """Rows of a table picked by integer ids; the backward scatter-adds into the picked rows."""

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

    The backward is softmax(logits) - onehot(target), built in one array the size of the logits.
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

        row_max = logits2.max(axis=1, keepdims=True)
        shifted = logits2 - row_max
        picked = shifted[rows, safe_targets]
        xp.exp(shifted, out=shifted)
        log_sum = xp.log(shifted.sum(axis=1))
        losses = (log_sum - picked) * counted

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
        probs = ctx.logits2 - ctx.row_max
        probs -= ctx.log_sum[:, None]
        xp.exp(probs, out=probs)
        probs[ctx.rows, ctx.targets] -= 1
        if ctx.reduction == "none":
            weight = grad.reshape(-1) * ctx.counted
        elif ctx.reduction == "sum":
            weight = grad * ctx.counted
        else:
            weight = (grad / ctx.count) * ctx.counted
        probs *= weight[:, None]
        return probs.reshape(ctx.shape), None


def cross_entropy(logits, targets, ignore_index=-100, reduction="mean"):
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


class GELU(Function):
    """x * Phi(x). "tanh" is GPT-1's approximation, "none" the exact form with erf."""

    @staticmethod
    def forward(ctx, x, approximate):
        xp = get_array_module(x)
        ctx.x, ctx.approximate = x, approximate
        if approximate == "tanh":
            return 0.5 * x * (1 + xp.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))
        return 0.5 * x * (1 + backend.erf(x * _INV_SQRT_2))

    @staticmethod
    def backward(ctx, grad):
        xp, x = get_array_module(grad), ctx.x
        if ctx.approximate == "tanh":
            t = xp.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))
            slope = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x)
        else:
            slope = 0.5 * (1 + backend.erf(x * _INV_SQRT_2)) + x * _INV_SQRT_2PI * xp.exp(-0.5 * x * x)
        return grad * slope


def gelu(x, approximate="tanh"):
    """The GELU activation; approximate="tanh" (GPT-1's) or "none" (exact, with erf)."""
    if approximate not in ("tanh", "none"):
        raise ValueError(f"gelu: approximate must be 'tanh' or 'none', got {approximate!r}")
    return GELU.apply(x, approximate=approximate)


# ----------------------------------------------------------------------------------------------
class LayerNorm(Function):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis (biased variance)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        xp = get_array_module(x)
        for name, p in (("weight", weight), ("bias", bias)):
            if p is not None and p.shape != x.shape[-1:]:
                raise ValueError(f"layer_norm: {name} has shape {p.shape}, expected {x.shape[-1:]}")
        normed = x - x.mean(axis=-1, keepdims=True)
        rstd = 1 / xp.sqrt((normed * normed).mean(axis=-1, keepdims=True) + eps)
        normed *= rstd
        ctx.normed, ctx.rstd, ctx.weight = normed, rstd, weight
        out = normed * weight if weight is not None else normed.copy()
        if bias is not None:
            out += bias
        return out

    @staticmethod
    def backward(ctx, grad):
        need_x, need_w, need_b = ctx.needs_input_grad
        normed, width = ctx.normed, ctx.normed.shape[-1]
        grad_x = None
        if need_x:
            g = grad * ctx.weight if ctx.weight is not None else grad
            grad_x = g - g.mean(axis=-1, keepdims=True)
            grad_x -= normed * (g * normed).mean(axis=-1, keepdims=True)
            grad_x *= ctx.rstd
        return (grad_x,
                (grad * normed).reshape(-1, width).sum(axis=0) if need_w else None,
                grad.reshape(-1, width).sum(axis=0) if need_b else None)


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
class ScaledDotProductAttention(Function):
    """softmax(q k^T / sqrt(d) + mask) v, with optional dropout on the attention weights.

    q: (..., T, d), k: (..., S, d), v: (..., S, e). The queries are the last T of the S
    positions, so the causal mask lets query i see keys 0 .. i + S - T (with T == S: 0 .. i).
    The backward keeps the attention weights of the forward rather than recomputing them.
    """

    @staticmethod
    def forward(ctx, q, k, v, causal, dropout_p, generator):
        xp = get_array_module(q)
        try:
            np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
            fits = q.shape[-1] == k.shape[-1] and k.shape[-2] == v.shape[-2]
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f"attention: shapes q {q.shape}, k {k.shape}, v {v.shape} do not fit together")
        scale = 1 / math.sqrt(q.shape[-1])
        scores = q @ xp.swapaxes(k, -1, -2)
        scores *= scale
        if causal:
            n_queries, n_keys = scores.shape[-2:]
            if n_queries > n_keys:
                raise ValueError(f"attention: causal with {n_queries} queries but only {n_keys} keys")
            scores += xp.triu(xp.full((n_queries, n_keys), -xp.inf, dtype=scores.dtype), k=1 + n_keys - n_queries)
        scores -= scores.max(axis=-1, keepdims=True)
        probs = xp.exp(scores, out=scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        ctx.keep = _keep_mask(generator, probs.shape, dropout_p) if dropout_p > 0 else None
        ctx.drop_scale = 0.0 if dropout_p == 1 else 1 / (1 - dropout_p)
        ctx.q, ctx.k, ctx.v, ctx.probs, ctx.scale = q, k, v, probs, scale
        return ScaledDotProductAttention._dropped(ctx, probs) @ v

    @staticmethod
    def _dropped(ctx, x):
        return x if ctx.keep is None else _drop(x, ctx.keep, ctx.drop_scale)

    @staticmethod
    def backward(ctx, grad):
        xp = get_array_module(grad)
        q, k, v, probs = ctx.q, ctx.k, ctx.v, ctx.probs
        need_q, need_k, need_v = ctx.needs_input_grad
        grad_v = None
        if need_v:
            weights = ScaledDotProductAttention._dropped(ctx, probs)
            grad_v = unbroadcast(xp.swapaxes(weights, -1, -2) @ grad, v.shape)
        grad_probs = ScaledDotProductAttention._dropped(ctx, grad @ xp.swapaxes(v, -1, -2))
        grad_scores = grad_probs - (grad_probs * probs).sum(axis=-1, keepdims=True)
        grad_scores *= probs
        grad_scores *= ctx.scale
        return (unbroadcast(grad_scores @ k, q.shape) if need_q else None,
                unbroadcast(xp.swapaxes(grad_scores, -1, -2) @ q, k.shape) if need_k else None,
                grad_v)


def scaled_dot_product_attention(q, k, v, causal=True, dropout_p=0.0, generator=None):
    """Attention of queries q over keys k and values v, heads in the leading axes.

    dropout_p applies to the attention weights whenever it is above 0 (pass 0.0 in evaluation).
    """
    _check_probability("scaled_dot_product_attention: dropout_p", dropout_p)
    if dropout_p > 0 and generator is None:
        generator = backend.default_generator(q.device)
    return ScaledDotProductAttention.apply(q, k, v, causal=causal, dropout_p=dropout_p, generator=generator)
