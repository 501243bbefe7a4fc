"""Layer norm's CPU path: rows normalised in cache-sized blocks, on all cores, each block's
passes made while it is in cache."""

import numpy as np

from .. import buffers, parallel


def _row_dot(a, b):
    """sum(a * b) over the last axis, kept as an axis of 1, without an a * b temporary."""
    return np.einsum("...i,...i->...", a, b)[..., None]


def forward_cpu(ctx, x, weight, bias, eps):
    width = x.shape[-1]
    x2 = x.reshape(-1, width)
    normed, out = buffers.empty(x2.shape, x.dtype), buffers.empty(x2.shape, x.dtype)
    rstd = np.empty((len(x2), 1), x.dtype)

    def normalise(rows):
        n = np.subtract(x2[rows], x2[rows].mean(axis=1, keepdims=True), out=normed[rows])
        rstd[rows] = 1 / np.sqrt(_row_dot(n, n) / width + eps)
        n *= rstd[rows]
        if weight is not None:
            np.multiply(n, weight, out=out[rows])
        else:
            out[rows] = n
        if bias is not None:
            out[rows] += bias

    parallel.run(normalise, parallel.blocks(len(x2), width))
    ctx.normed, ctx.rstd, ctx.weight = normed, rstd, weight
    return out.reshape(x.shape)


def backward_cpu(ctx, grad):
    need_x, need_w, need_b = ctx.needs_input_grad
    normed, rstd, weight = ctx.normed, ctx.rstd, ctx.weight
    width = normed.shape[1]
    grad2 = grad.reshape(-1, width)
    grad_weight = np.einsum("ni,ni->i", grad2, normed) if need_w else None
    grad_x = buffers.empty(normed.shape, grad.dtype) if need_x else None

    def input_gradient(rows):  # rstd (g - mean(g) - normed mean(g normed)), g = grad * weight
        g = grad2[rows] * weight if weight is not None else grad2[rows]
        gx = np.subtract(g, g.mean(axis=1, keepdims=True), out=grad_x[rows])
        n = normed[rows]
        n *= _row_dot(g, n) / width  # normed is not needed after this
        gx -= n
        gx *= rstd[rows]

    if need_x:
        parallel.run(input_gradient, parallel.blocks(len(normed), width))
    return (
        None if grad_x is None else grad_x.reshape(grad.shape),
        grad_weight,
        grad2.sum(axis=0) if need_b else None,
    )
