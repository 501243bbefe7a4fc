"""Layer normalisation, and the end of a post-LN sublayer as one Function: its last product's bias,
its residual dropout, the residual add and the layer norm, which a GPU then makes in one pass over the
rows (and back in one more, with the column sums). Import both from autograd.functional."""

import functools
import operator

from . import masks, random
from .backend import get_array_module
from .kernels import layer_norm as kernels
from .precision import widened
from .tensor import Context, Function


class LayerNorm(Function):
    """Each row over the last axis normalised, then scaled and shifted:

        n = (x - mean) / sqrt(var + eps),   y = n w + b      (var: the biased variance)

    and back, with g = dy w (dy alone without a weight), means over the row:

        dx = (g - mean(g) - n mean(g n)) / sqrt(var + eps),   dw = sum over rows of dy n,
        db = sum over rows of dy

    The statistics, and with them y, are float32 for bfloat16 x (y is then cast to bfloat16);
    dw and db are in the weights' own type.
    """

    mixes_floats = returns_new_arrays = True
    forward_cpu, backward_cpu = kernels.forward_cpu, kernels.backward_cpu
    forward_gpu, backward_gpu = kernels.forward_gpu, kernels.backward_gpu
    fits_gpu = kernels.fits_gpu

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        xp, x32 = get_array_module(x), widened(x)
        centered = x32 - x32.mean(axis=-1, keepdims=True)  # (..., D)
        ctx.rstd = 1 / xp.sqrt((centered * centered).mean(axis=-1, keepdims=True) + eps)  # (..., 1)
        ctx.normed, ctx.weight, ctx.x_dtype = centered * ctx.rstd, weight, x.dtype
        ctx.param_dtype = next((p.dtype for p in (weight, bias) if p is not None), x.dtype)
        out = ctx.normed if weight is None else ctx.normed * weight
        return (out if bias is None else out + bias).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        need_x, need_w, need_b = ctx.needs_input_grad
        normed, width, grad = ctx.normed, grad.shape[-1], widened(grad)
        g = grad if ctx.weight is None else grad * ctx.weight
        grad_x = None
        if need_x:
            row_mean = g.mean(axis=-1, keepdims=True)
            grad_x = (g - row_mean - normed * (g * normed).mean(axis=-1, keepdims=True)) * ctx.rstd
            grad_x = grad_x.astype(ctx.x_dtype, copy=False)
        grad2, normed2 = grad.reshape(-1, width), normed.reshape(-1, width)  # (rows, D)
        return (
            grad_x,
            (grad2 * normed2).sum(axis=0).astype(ctx.param_dtype, copy=False) if need_w else None,
            grad2.sum(axis=0).astype(ctx.param_dtype, copy=False) if need_b else None,
        )


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    """Layer normalisation over the last axis, eps inside the square root, as in GPT-1."""
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and p.shape != x.shape[-1:]:
            raise ValueError(f"layer_norm: {name} has shape {p.shape}, expected {x.shape[-1:]}")
    return LayerNorm.apply(x, weight, bias, eps=eps)


class ResidualLayerNorm(Function):
    """With x the residual stream and y the sublayer's last product (its bias b not yet added):

        h = x + dropout(y + b),   out = layer_norm(h) w + c

    and back, with dout the sum of the gradients of out's uses (it takes them apart: a block uses
    its n twice, and the sum is made in the backward's own pass), dh from layer norm's backward
    (LayerNorm) and the same mask:

        dx = dh,   dy = dropout(dh),   db = sum over rows of dy

    h is float32 for bfloat16 x and y, as layer norm's statistics are; out, dx and dy are in x's
    type, the parameters' gradients in their own.
    """

    mixes_floats = True  # bfloat16 x and y, float32 parameters
    returns_new_arrays = True  # dy is a copy of dx even without dropout
    sums_gradients = True
    forward_cpu, backward_cpu = kernels.residual_forward_cpu, kernels.residual_backward_cpu
    forward_gpu, backward_gpu = kernels.residual_forward_gpu, kernels.residual_backward_gpu
    fits_cpu, fits_gpu = kernels.residual_fits_cpu, kernels.residual_fits_gpu

    @staticmethod
    def forward(ctx, x, y, bias, weight, ln_bias, eps, dropout_p, generator):
        xp = get_array_module(y)
        branch = widened(y) if bias is None else widened(y) + bias
        ctx.keep = masks.keep_mask(generator, y.shape, dropout_p, xp) if dropout_p > 0 else None
        ctx.scale, ctx.dtypes = masks.keep_scale(dropout_p), (x.dtype, y.dtype, getattr(bias, "dtype", None))
        if ctx.keep is not None:
            branch = masks.drop(branch, ctx.keep, ctx.scale)
        ctx.norm = Context(needs_input_grad=None)  # the layer norm's own; backward says what it needs
        out = LayerNorm.forward(ctx.norm, widened(x) + branch, weight, ln_bias, eps)
        return out.astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, grads):
        grad = functools.reduce(operator.add, grads)  # dout: its uses' gradients, in the order they came
        need_x, need_y, need_bias, need_w, need_b = ctx.needs_input_grad
        ctx.norm.needs_input_grad = (True, need_w, need_b)
        grad_h, grad_w, grad_b = LayerNorm.backward(ctx.norm, grad)  # grad_h: float32 for bfloat16 grad
        x_dtype, y_dtype, bias_dtype = ctx.dtypes
        grad_y = grad_h.copy() if ctx.keep is None else masks.drop(grad_h, ctx.keep, ctx.scale)
        grad_y = grad_y.astype(y_dtype, copy=False)  # db sums dy as it is stored, as a linear layer's does
        rows = widened(grad_y).reshape(-1, grad_y.shape[-1])
        grad_bias = rows.sum(axis=0).astype(bias_dtype, copy=False) if need_bias else None
        grad_x = grad_h.astype(x_dtype, copy=False) if need_x else None
        return grad_x, grad_y if need_y else None, grad_bias, grad_w, grad_b


def residual_layer_norm(x, y, bias, weight, ln_bias, eps=1e-5, dropout_p=0.0, training=True, generator=None):
    """layer_norm(x + dropout(y + bias)) with the norm's weight and ln_bias: how a post-LN block
    ends each sublayer (x its input, y the sublayer's last product). Dropout is on while training
    with dropout_p > 0, its mask the next draw of `generator` (by default the current stream), as
    functional.dropout's."""
    masks.check_probability("residual_layer_norm: dropout_p", dropout_p)
    if y.shape != x.shape:
        raise ValueError(f"residual_layer_norm: y has shape {y.shape}, the residual x {x.shape}")
    if y.dtype != x.dtype:
        raise TypeError(f"residual_layer_norm: y is {y.dtype}, the residual x {x.dtype}: give both one type")
    for name, p in (("bias", bias), ("weight", weight), ("ln_bias", ln_bias)):
        if p is not None and p.shape != x.shape[-1:]:
            raise ValueError(f"residual_layer_norm: {name} has shape {p.shape}, expected {x.shape[-1:]}")
    dropout_p = dropout_p if training else 0.0
    generator = generator if generator is not None or dropout_p == 0 else random.current()
    return ResidualLayerNorm.apply(
        x, y, bias, weight, ln_bias, eps=eps, dropout_p=dropout_p, generator=generator
    )
