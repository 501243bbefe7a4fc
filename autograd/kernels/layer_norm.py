"""Layer norm's fast paths. The CPU's: rows normalised in cache-sized blocks, on all cores, each
block's passes made while it is in cache. The GPU's (autograd/kernels/cuda/layer_norm.cu): a warp
per row (a block for wide rows) holding the row in registers, and dw, db summed in a fixed order."""

import numpy as np

from .. import backend, buffers, parallel
from . import gpu


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


# ----- the CUDA path (autograd/kernels/cuda/layer_norm.cu)

WARP, WARP_PER_THREAD, BLOCK_PER_THREAD = 32, 32, 16  # as in layer_norm.cu
WARP_WIDTH = WARP * WARP_PER_THREAD  # rows up to 1024 wide: a warp per row, in registers
BLOCK_WIDTH = 1024 * BLOCK_PER_THREAD  # up to 16384 wide: a block per row; wider ones take the reference
ROWS_PER_CHUNK = 32  # dw and db: each block of their first pass sums this many rows, in order


def _row_kernel(direction, rows, width, dtype):
    """The row kernel ("forward" or "backward") of layer_norm.cu for this width, with its grid and
    block: blocks of THREADS threads with a warp per row, or a block per row of just enough warps."""
    if width <= WARP_WIDTH:
        kernel = gpu.kernel("layer_norm", f"layer_norm_{direction}_warps", dtype)
        return kernel, (-(-rows // (gpu.THREADS // WARP)),), (gpu.THREADS,)
    kernel = gpu.kernel("layer_norm", f"layer_norm_{direction}_blocks", dtype)
    return kernel, (rows,), (WARP * -(-width // (WARP * BLOCK_PER_THREAD)),)


def _float32_or_null(xp, p):
    """A weight or bias as float32 for the kernels (bfloat16 ones widened, as the reference's
    float32 math reads them), or a null pointer where there is none."""
    return np.uintp(0) if p is None else xp.ascontiguousarray(p, dtype=np.float32)


def fits_gpu(x, weight, bias, eps):
    """The kernels take rows up to BLOCK_WIDTH wide, of an x that is not empty."""
    return x.size > 0 and x.shape[-1] <= BLOCK_WIDTH


def forward_gpu(ctx, x, weight, bias, eps):
    """The forward kernel keeps mean and rstd (float32, one of each per row) and the backward reads
    x again with them, where the reference keeps the float32 normalised values: x is kept by the
    graph anyway."""
    width = x.shape[-1]
    xp = backend.get_array_module(x)
    rows = x.size // width
    x = xp.ascontiguousarray(x)
    out = xp.empty_like(x)
    ctx.mean, ctx.rstd = xp.empty(rows, np.float32), xp.empty(rows, np.float32)
    ctx.x, ctx.weight = x, _float32_or_null(xp, weight)
    ctx.param_dtype = next((p.dtype for p in (weight, bias) if p is not None), x.dtype)
    kernel, grid, block = _row_kernel("forward", rows, width, x.dtype)
    args = (x, ctx.weight, _float32_or_null(xp, bias), out, ctx.mean, ctx.rstd, np.int64(rows))
    kernel(grid, block, args + (np.int32(width), np.float32(eps)))
    return out


def backward_gpu(ctx, grad):
    """dx a row at a time; dw and db summed over the rows in an order fixed by the shapes."""
    need_x, need_w, need_b = ctx.needs_input_grad
    xp, x = backend.get_array_module(grad), ctx.x
    rows, width = x.size // x.shape[-1], x.shape[-1]
    grad = xp.ascontiguousarray(grad, dtype=x.dtype)
    grad_x = grad_weight = grad_bias = None
    if need_x:
        grad_x = xp.empty_like(x)
        kernel, grid, block = _row_kernel("backward", rows, width, x.dtype)
        args = (x, grad, ctx.weight, ctx.mean, ctx.rstd, grad_x, np.int64(rows), np.int32(width))
        kernel(grid, block, args)
    if need_w or need_b:
        sum_w, sum_b = _column_sums(xp, x, grad, ctx.mean, ctx.rstd)
        grad_weight = sum_w.astype(ctx.param_dtype, copy=False) if need_w else None
        grad_bias = sum_b.astype(ctx.param_dtype, copy=False) if need_b else None
    return grad_x, grad_weight, grad_bias


def _column_sums(xp, x, grad, mean, rstd):
    """(sum over rows of dy n, sum over rows of dy), float32, in two passes: each block of the
    first sums ROWS_PER_CHUNK rows, the second adds the chunks' sums in order. No atomics: a run
    repeats bit for bit."""
    rows, width = x.size // x.shape[-1], x.shape[-1]
    chunks = -(-rows // ROWS_PER_CHUNK)
    partial_w, partial_b = xp.empty((chunks, width), np.float32), xp.empty((chunks, width), np.float32)
    args = (
        x,
        grad,
        mean,
        rstd,
        partial_w,
        partial_b,
        np.int64(rows),
        np.int32(width),
        np.int32(ROWS_PER_CHUNK),
    )
    kernel = gpu.kernel("layer_norm", "layer_norm_column_partials", x.dtype)
    kernel((chunks, -(-width // gpu.THREADS)), (gpu.THREADS,), args)
    sum_w, sum_b = xp.empty(width, np.float32), xp.empty(width, np.float32)
    args = (partial_w, partial_b, sum_w, sum_b, np.int32(chunks), np.int32(width))
    gpu.kernel("layer_norm", "layer_norm_column_sums", np.float32)((gpu.blocks(width),), (gpu.THREADS,), args)
    return sum_w, sum_b
