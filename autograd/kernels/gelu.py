"""GELU's fast paths (the tanh form) of v = x + b, b the bias of the linear layer before it: b added as
the numbers go through rather than by a pass of its own, and its gradient (the sum of dx's rows)
added up from dx as it is made rather than read back. Both see x as rows of b's width (without a
bias, as rows of the width that suits them).

The CPU's: cache-sized blocks of whole rows, on all cores, in place in the output; db from each
block's column sums, added in block order. The GPU's (autograd/kernels/cuda/gelu.cu): one pass over
the entries each way, db's chunks of rows added in the same launch (partial_sums.cuh). Either way db
repeats bit for bit.
Both backwards compute the tanh again rather than keeping a second array that size: the forward keeps
x alone."""

import math

import numpy as np

from .. import backend, buffers, threads
from . import launching, sources
from . import linear as linear_kernels

SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
ROWS_PER_CHUNK = 32  # rows a block of the GPU kernels walks: a GPT-1 step's 4,096 give 128 chunks of db


def _tanh_inner(v, t):
    """t = tanh(sqrt(2/pi) (v + 0.044715 v^3)), written into the array t (shaped like v)."""
    np.multiply(v, v, out=t)
    t *= 0.044715
    t += 1
    t *= v  # v + 0.044715 v^3
    t *= SQRT_2_OVER_PI
    return np.tanh(t, out=t)


def _cpu_rows(x, bias):
    """x as the CPU's (rows, width): without a bias, one entry a row, so that blocks cut it anywhere."""
    return x.reshape(-1, 1 if bias is None else bias.shape[0])


def _plus_bias(x_rows, bias):
    """v = x + b for a block of rows (x itself where there is no bias)."""
    return x_rows if bias is None else np.add(x_rows, bias)


def forward_cpu(ctx, x, bias):
    x2 = _cpu_rows(x, bias)
    ctx.x2, ctx.bias, ctx.x_shape = x2, bias, x.shape
    out = buffers.empty(x2.shape, x.dtype)

    def gelu(rows):  # 0.5 v (1 + t)
        v, y = _plus_bias(x2[rows], bias), out[rows]
        _tanh_inner(v, y)
        y += 1
        y *= v
        y *= 0.5

    threads.for_each(gelu, threads.blocks(*x2.shape))
    return out.reshape(x.shape)


def backward_cpu(ctx, grad):
    need_x, need_bias = ctx.needs_input_grad
    x2, bias = ctx.x2, ctx.bias
    grad2 = grad.reshape(x2.shape)
    grad_x = buffers.empty(x2.shape, x2.dtype)
    blocks = threads.blocks(*x2.shape)
    block_sums = np.empty((len(blocks), x2.shape[1]), x2.dtype) if need_bias else None

    def slope_times_grad(numbered_block):
        # slope = 0.5 (1 + t) + 0.5 v (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 v^2)
        n, rows = numbered_block
        v, slope = _plus_bias(x2[rows], bias), grad_x[rows]
        t = _tanh_inner(v, np.empty_like(v))
        np.multiply(t, t, out=slope)
        np.subtract(1, slope, out=slope)
        slope *= v
        inner = np.multiply(v, v, out=None if bias is None else v)  # x + b's block is ours: v's last use
        inner *= 0.5 * SQRT_2_OVER_PI * 3 * 0.044715
        inner += 0.5 * SQRT_2_OVER_PI
        slope *= inner
        np.multiply(t, 0.5, out=inner)
        inner += 0.5
        slope += inner
        slope *= grad2[rows]
        if need_bias:
            slope.sum(axis=0, out=block_sums[n])

    threads.for_each(slope_times_grad, list(enumerate(blocks)))
    grad_bias = block_sums.sum(axis=0).astype(bias.dtype, copy=False) if need_bias else None
    return grad_x.reshape(ctx.x_shape) if need_x else None, grad_bias


def _gpu_rows(x, bias):
    """x's (rows, width) for the kernels: without a bias, one row of all its entries, which the
    columns' grid-stride loop shares out among the threads."""
    return (1, x.size) if bias is None else (math.prod(x.shape[:-1]), x.shape[-1])


def _grid(rows, width):
    """A block per chunk of ROWS_PER_CHUNK rows and per THREADS columns, at most 65535 of those (a
    grid's y limit): in a wider row each thread takes several columns."""
    return (max(1, -(-rows // ROWS_PER_CHUNK)), launching.blocks(width))


def forward_gpu(ctx, x, bias):
    xp = backend.get_array_module(x)
    ctx.x = x = xp.ascontiguousarray(x).reshape(x.shape)  # (ascontiguousarray makes a 0-d x 1-d)
    ctx.bias, ctx.bias_dtype = launching.float32_or_null(xp, bias), getattr(bias, "dtype", None)
    ctx.rows, ctx.width = rows, width = _gpu_rows(x, bias)
    out = xp.empty_like(x)
    args = (x, ctx.bias, out, np.int64(rows), np.int64(width), np.int32(ROWS_PER_CHUNK))
    sources.kernel("gelu", "gelu_forward", x.dtype)(_grid(rows, width), (launching.THREADS,), args)
    return out


def backward_gpu(ctx, grad):
    """dx, and where db is wanted its column sums, in one launch."""
    need_x, need_bias = ctx.needs_input_grad
    xp, x = backend.get_array_module(grad), ctx.x
    grad = xp.ascontiguousarray(grad, dtype=x.dtype)
    rows, width = ctx.rows, ctx.width
    grid, grad_x = _grid(rows, width), xp.empty_like(x)
    sums = linear_kernels.partial_sums(xp, grid[0], width, trees=grid[1]) if need_bias else (np.uintp(0),) * 3
    args = (x, ctx.bias, grad, grad_x, *sums, np.int64(rows), np.int64(width), np.int32(ROWS_PER_CHUNK))
    sources.kernel("gelu", "gelu_backward", x.dtype)(grid, (launching.THREADS,), args)
    grad_bias = sums[2].astype(ctx.bias_dtype, copy=False) if need_bias else None
    return grad_x if need_x else None, grad_bias
