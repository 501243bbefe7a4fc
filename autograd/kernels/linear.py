"""Linear's fast paths. The CPU's: the matrix products cut into one run of rows per core
(parallel.matmul), the bias added while each run is still in cache. The GPU's: the reference's
products (cuBLAS), and the bias gradient summed from the output gradient's own storage type by the
two passes of autograd/kernels/cuda/column_sums.cu, with no float32 copy of it."""

import numpy as np

from .. import backend, parallel
from . import gpu

ROWS_PER_CHUNK = 32  # rows a block of column_sums' first pass adds: a GPT-1 step's 4,096 give 128 chunks


def forward_cpu(ctx, x, weight, bias, weight_cast):
    n_in, n_out = weight.shape
    x2 = x.reshape(-1, n_in)
    ctx.x2, ctx.weight, ctx.x_shape = x2, weight_cast, x.shape
    return parallel.matmul(x2, weight_cast, bias).reshape(*x.shape[:-1], n_out)


def backward_cpu(ctx, grad):
    need_x, need_w, need_b = ctx.needs_input_grad
    x2, weight = ctx.x2, ctx.weight
    g2 = grad.reshape(-1, weight.shape[1])
    grad_weight = None
    if need_w:  # in the weight's own memory order: a transposed table (the tied LM head) gets a
        # transposed gradient, so the table's own gradient comes out contiguous, not strided
        grad_weight = parallel.matmul(g2.T, x2).T if _is_transposed(weight) else parallel.matmul(x2.T, g2)
    return (
        parallel.matmul(g2, weight.T).reshape(ctx.x_shape) if need_x else None,
        grad_weight,
        g2.sum(axis=0) if need_b else None,
    )


def backward_gpu(ctx, grad):
    need_x, need_w, need_b = ctx.needs_input_grad
    grad2 = grad.reshape(-1, grad.shape[-1])  # (rows, out)
    return (
        backend.matmul(grad2, ctx.weight.T).reshape(ctx.x_shape) if need_x else None,
        backend.matmul(ctx.x2.T, grad2, dtype=ctx.weight_dtype) if need_w else None,
        column_sums(grad2).astype(ctx.weight_dtype, copy=False) if need_b else None,
    )


def column_sums(x):
    """The sums of the columns of a (rows, width) GPU array, float32, in two passes: each block of
    the first adds ROWS_PER_CHUNK rows, the second adds the chunks' sums in order. No atomics: a run
    repeats bit for bit."""
    xp = backend.get_array_module(x)
    x = xp.ascontiguousarray(x)
    (rows, width), chunks = x.shape, max(1, -(-x.shape[0] // ROWS_PER_CHUNK))
    partial = xp.empty((chunks, width), np.float32)
    if not width:
        return xp.empty(width, np.float32)
    args = (x, partial, np.int64(rows), np.int32(width), np.int32(ROWS_PER_CHUNK))
    gpu.kernel("column_sums", "column_partials", x.dtype)(
        (chunks, -(-width // gpu.THREADS)), (gpu.THREADS,), args
    )
    return sum_of_chunks(partial)


def sum_of_chunks(partial):
    """The sum over its first axis of partial (chunks, ...), a GPU array of float32 sums of chunks of
    rows, the chunks added in order (column_sums.cu's second pass): column_sums' second pass, and that
    of the kernels that sum their chunks as they write a gradient (GELU's, layer norm's)."""
    xp = backend.get_array_module(partial)
    chunks, size = partial.shape[0], partial[0].size
    sums = xp.empty(partial.shape[1:], np.float32)
    args = (partial, sums, np.int32(chunks), np.int32(size))
    gpu.kernel("column_sums", "column_sums", np.float32)((gpu.blocks(size),), (gpu.THREADS,), args)
    return sums


def _is_transposed(a):
    """True for a 2-D array laid out column by column (the .T of a row-major one)."""
    return a.flags.f_contiguous and not a.flags.c_contiguous
