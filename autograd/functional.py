"""The layers' arithmetic as functionals: each one Function with a hand-written backward.

Import as `from autograd import functional as F`. Inputs are Tensors; token ids and targets may
also be plain integer arrays. Each Function's forward and backward are its reference, written
as whole-array formulas under the math they compute; the heavy ones name their fast paths
(autograd/kernels) beside them.
"""

import functools
import math

import numpy as np

from . import backend, masks, precision, products, random
from .attention import (  # noqa: F401 (offered as F.* with the rest)
    MultiHeadAttention,
    ScaledDotProductAttention,
    attention_weights,
    multi_head_attention,
    scaled_dot_product_attention,
)
from .backend import get_array_module
from .kernels import cross_entropy as cross_entropy_kernels
from .kernels import dropout as dropout_kernels
from .kernels import embedding as embedding_kernels
from .kernels import gelu as gelu_kernels
from .kernels import linear as linear_kernels
from .layer_norm import LayerNorm, ResidualLayerNorm, layer_norm, residual_layer_norm  # noqa: F401 (as F.*)
from .precision import widened
from .tensor import Function, Tensor

IGNORE_INDEX = -100  # a target that cross_entropy leaves out (padding, positions not predicted)


def _indices(ids):
    """Integer indices as a raw array, where they are: a list, a NumPy array or a CPU tensor gives
    a NumPy array, for the caller to check on the host before copying it to the device; a GPU
    array or tensor gives its GPU array, unchecked (reading it would make the host wait)."""
    ids = ids._data if isinstance(ids, Tensor) else ids
    if not backend.on_gpu(ids):
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

    The product is in x's type: it reads `weight_cast`, W in that type (under bf16, the copy W keeps:
    precision.kept_cast); dW and db are in W's own type. Every product is of two matrices, x's rows
    stacked (rows, in): the form a GPU multiplies in bfloat16 and TF32 (products.matmul).
    """

    returns_new_arrays = True
    mixes_floats = True
    forward_cpu, backward_cpu = linear_kernels.forward_cpu, linear_kernels.backward_cpu

    @staticmethod
    def forward(ctx, x, weight, bias, weight_cast):
        ctx.x2 = x.reshape(-1, x.shape[-1])  # (rows, in)
        ctx.x_shape, ctx.weight_dtype, ctx.weight = x.shape, weight.dtype, weight_cast
        out = products.matmul(ctx.x2, ctx.weight)  # (rows, out), in x's type
        if bias is not None:
            out += bias
        return out.reshape(*x.shape[:-1], weight.shape[1])

    @staticmethod
    def backward(ctx, grad, *, column_sums=lambda rows: widened(rows).sum(axis=0)):
        need_x, need_w, need_b = ctx.needs_input_grad
        grad2 = grad.reshape(-1, grad.shape[-1])  # (rows, out)
        return (
            products.matmul(grad2, ctx.weight.T).reshape(ctx.x_shape) if need_x else None,
            products.matmul(ctx.x2.T, grad2, dtype=ctx.weight_dtype) if need_w else None,
            column_sums(grad2).astype(ctx.weight_dtype, copy=False) if need_b else None,
        )

    forward_gpu = forward  # the GPU's: the reference, with db summed in one kernel (column_sums.cu)
    backward_gpu = staticmethod(functools.partial(backward, column_sums=linear_kernels.column_sums))


def linear(x, weight, bias=None, weight_cast=None):
    """x @ weight + bias, with weight shaped (in, out). weight_cast: weight's array in x's type where the
    caller keeps one (the tied LM head: the embedding's, transposed); by default precision.kept_cast's."""
    if weight.ndim != 2:
        raise ValueError(f"linear: weight must be 2-D (in, out), got shape {weight.shape}")
    n_in, n_out = weight.shape
    if x.shape[-1] != n_in:
        raise ValueError(f"linear: input has {x.shape[-1]} features, weight {weight.shape} expects {n_in}")
    if bias is not None and bias.shape != (n_out,):
        expected = f"({n_out},) for weight {weight.shape}"
        raise ValueError(f"linear: bias has shape {bias.shape}, expected {expected}")
    weight_cast = precision.kept_cast(weight, x.dtype) if weight_cast is None else weight_cast
    if weight_cast.shape != weight.shape or weight_cast.dtype != x.dtype:
        raise ValueError(f"linear: weight_cast must be the weight {weight.shape} in x's type {x.dtype}")
    return Linear.apply(x, weight, bias, weight_cast=weight_cast)


# ----------------------------------------------------------------------------------------------
class Embedding(Function):
    """y = W[ids]: one row of the table per id. dW adds dy's vectors into the rows they came
    from, so an id that appears twice gets both. y is in `dtype`: where a bf16 model's
    activations start (autograd/precision.py)."""

    returns_new_arrays = True
    mixes_floats = True
    forward_gpu, backward_gpu = embedding_kernels.forward_gpu, embedding_kernels.backward_gpu

    @staticmethod
    def forward(ctx, ids, weight, dtype):
        ctx.ids, ctx.weight_shape, ctx.weight_dtype = ids, weight.shape, weight.dtype
        return weight[ids].astype(dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        rows = grad.reshape(-1, ctx.weight_shape[1]).astype(ctx.weight_dtype, copy=False)
        return None, backend.scatter_add(ctx.weight_shape, ctx.ids.reshape(-1), rows)


def embedding(ids, weight):
    """weight[ids]: ids of any shape give vectors of shape ids.shape + (weight.shape[1],). Ids on
    the host (a list, a NumPy array, a CPU tensor) are checked to lie in [0, rows) before they are
    copied to the weight's device; ids already on a GPU are not, as that would wait for the GPU."""
    ids = _indices(ids)
    n_rows = weight.shape[0]
    if not backend.on_gpu(ids) and ids.size and (ids.min() < 0 or ids.max() >= n_rows):
        raise IndexError(f"embedding: ids must lie in [0, {n_rows}), got {int(ids.min())}..{int(ids.max())}")
    ids = backend.to_device(ids, weight.device)
    return Embedding.apply(ids, weight, dtype=precision.activation_dtype(weight.dtype))


# ----------------------------------------------------------------------------------------------
class Softmax(Function):
    """y = exp(x - max x) / sum(exp(x - max x)) along an axis (the shift keeps exp from
    overflowing and cancels out);  dx = y (dy - sum(dy y)). In float32 for bfloat16 x."""

    @staticmethod
    def forward(ctx, x, axis):
        xp, x32 = get_array_module(x), widened(x)
        exp = xp.exp(x32 - x32.max(axis=axis, keepdims=True))
        ctx.out, ctx.axis = exp / exp.sum(axis=axis, keepdims=True), axis
        return ctx.out.astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        out, grad32 = ctx.out, widened(grad)
        dx = out * (grad32 - (grad32 * out).sum(axis=ctx.axis, keepdims=True))
        return dx.astype(grad.dtype, copy=False)


def softmax(x, axis=-1):
    """exp(x) / sum(exp(x)) along `axis`, shifted by the maximum so it never overflows."""
    return Softmax.apply(x, axis=axis)


class LogSoftmax(Function):
    """y = x - logsumexp(x) = (x - max x) - log sum(exp(x - max x)) along an axis;
    dx = dy - exp(y) sum(dy). In float32 for bfloat16 x."""

    @staticmethod
    def forward(ctx, x, axis):
        shifted, log_sum = _shift_and_log_sum(x, axis)
        ctx.out, ctx.axis = shifted - log_sum, axis
        return ctx.out.astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        xp, grad32 = get_array_module(grad), widened(grad)
        dx = grad32 - xp.exp(ctx.out) * grad32.sum(axis=ctx.axis, keepdims=True)
        return dx.astype(grad.dtype, copy=False)


def _shift_and_log_sum(x, axis):
    """(x - max x, log sum(exp(x - max x))) along `axis`, the sum kept as an axis of 1: the
    largest shifted value is 0, so exp never overflows, and logsumexp(x) = max x + the log sum.
    Both in float32 for bfloat16 x."""
    xp, x = get_array_module(x), widened(x)
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

    then reduced: "none" keeps one loss per row, "sum" adds them, "mean" divides their sum by the
    number of rows that count (by 1 when none does). bfloat16 logits give float32 losses (and
    bfloat16 gradients): the sums are float32 throughout.
    """

    mixes_floats = True
    forward_cpu, backward_cpu = cross_entropy_kernels.forward_cpu, cross_entropy_kernels.backward_cpu
    forward_gpu, backward_gpu = cross_entropy_kernels.forward_gpu, cross_entropy_kernels.backward_gpu

    @staticmethod
    def forward(ctx, logits, targets, ignore_index, reduction):
        xp = get_array_module(logits)
        z, log_sum = _shift_and_log_sum(logits.reshape(-1, logits.shape[-1]), axis=1)  # (rows, C), (rows, 1)
        counted = targets.reshape(-1) != ignore_index  # (rows,)
        t = xp.where(counted, targets.reshape(-1), 0)  # an ignored row points at class 0, counted as 0
        rows = xp.arange(len(t))
        ctx.z, ctx.log_sum, ctx.rows, ctx.t, ctx.counted = z, log_sum, rows, t, counted
        ctx.logits_dtype, ctx.shape = logits.dtype, logits.shape
        losses = (log_sum[:, 0] - z[rows, t]) * counted
        return cross_entropy_kernels.reduced(ctx, losses, reduction, targets.shape)

    @staticmethod
    def backward(ctx, grad):
        xp = get_array_module(grad)
        weight = grad.reshape(-1) / ctx.divisor * ctx.counted  # (rows,): each row's loss gradient or 0
        grad_z = xp.exp(ctx.z - ctx.log_sum) * weight[:, None]  # softmax(z), weighted
        grad_z[ctx.rows, ctx.t] -= weight  # minus the one-hot
        return grad_z.reshape(ctx.shape).astype(ctx.logits_dtype, copy=False), None


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
        shapes = f"targets of shape {targets.shape} do not match logits {logits.shape}"
        raise ValueError(f"cross_entropy: {shapes}")
    n_classes = logits.shape[-1]
    on_host = not backend.on_gpu(targets)
    if on_host and (((targets < 0) | (targets >= n_classes)) & (targets != ignore_index)).any():
        raise IndexError(
            f"cross_entropy: targets must lie in [0, {n_classes}) or equal ignore_index={ignore_index}"
        )
    targets = backend.to_device(targets, logits.device)
    return CrossEntropy.apply(logits, targets, ignore_index=ignore_index, reduction=reduction)


# ----------------------------------------------------------------------------------------------
SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


class GELU(Function):
    """GPT-1's GELU, the tanh approximation of v Phi(v), of v = x + b: b a bias over x's last axis, or 0.

    With t = tanh(sqrt(2/pi) (v + 0.044715 v^3)):
        y = 0.5 v (1 + t)
        dx = dy (0.5 (1 + t) + 0.5 v (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 v^2)),   db = the sum of dx's rows
    """

    mixes_floats = True  # bfloat16 x, float32 bias
    forward_cpu, backward_cpu = gelu_kernels.forward_cpu, gelu_kernels.backward_cpu
    forward_gpu, backward_gpu = gelu_kernels.forward_gpu, gelu_kernels.backward_gpu

    @staticmethod
    def forward(ctx, x, bias):
        xp, v = get_array_module(x), widened(x)  # float32 math for bfloat16 x
        v = v if bias is None else v + widened(bias)
        ctx.v, ctx.t, ctx.bias = v, xp.tanh(SQRT_2_OVER_PI * (v + 0.044715 * v**3)), bias
        return (0.5 * v * (1 + ctx.t)).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        v, t = ctx.v, ctx.t
        slope = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * SQRT_2_OVER_PI * (1 + 3 * 0.044715 * v * v)
        grad_x = widened(grad) * slope  # float32 for bfloat16 x: db adds it up before its rounding
        grad_bias = None
        if ctx.needs_input_grad[1]:  # dx as (rows, width), summed over the rows
            grad_bias = grad_x.reshape(-1, v.shape[-1]).sum(axis=0).astype(ctx.bias.dtype, copy=False)
        return grad_x.astype(grad.dtype, copy=False), grad_bias


class ExactGELU(Function):
    """The exact GELU, x Phi(x).

    With the normal distribution's cdf Phi and density phi:
        y = x Phi(x),   Phi(x) = 0.5 (1 + erf(x / sqrt(2)))
        dy/dx = Phi(x) + x phi(x),   phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
    """

    @staticmethod
    def forward(ctx, x):
        ctx.x = x
        x32 = widened(x)  # float32 math for bfloat16 x
        return (x32 * _normal_cdf(x32)).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        xp, x = get_array_module(grad), widened(ctx.x)
        slope = _normal_cdf(x) + x * xp.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        return (widened(grad) * slope).astype(grad.dtype, copy=False)


def _normal_cdf(x):
    return 0.5 * (1 + backend.erf(x / math.sqrt(2)))


def gelu(x, approximate="tanh", bias=None):
    """GELU of x + bias (a linear layer's, fused in); approximate "tanh" (GPT-1's) or "none" (exact, erf)."""
    if approximate not in ("tanh", "none"):
        raise ValueError(f"gelu: approximate must be 'tanh' or 'none', got {approximate!r}")
    if bias is not None and (bias.ndim != 1 or bias.shape != x.shape[-1:]):
        raise ValueError(f"gelu: bias has shape {bias.shape}, expected (width,) for x of shape {x.shape}")
    return GELU.apply(x, bias) if approximate == "tanh" else ExactGELU.apply(x if bias is None else x + bias)


# ----------------------------------------------------------------------------------------------
class Dropout(Function):
    """y = x keep / (1 - p), with keep a random mask of entries kept with probability 1 - p
    (inverted dropout: the mean is unchanged);  dx = dy keep / (1 - p)."""

    forward_gpu, backward_gpu = dropout_kernels.forward_gpu, dropout_kernels.backward_gpu

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
