"""Linear's fast paths. The CPU's: the matrix products cut into one run of rows per core
(threads.matmul), the bias added while each run is still in cache. The GPU's: the reference's
products (cuBLAS), and the bias gradient summed from the output gradient's own storage type in one
launch of autograd/kernels/cuda/column_sums.cu, with no float32 copy of it."""

import numpy as np

from .. import backend, threads
from . import launching, sources

ROWS_PER_CHUNK = 32  # rows a block of column_sums' first pass adds: a GPT-1 step's 4,096 give 128 chunks


def forward_cpu(ctx, x, weight, bias, weight_cast):
    n_in, n_out = weight.shape
    x2 = x.reshape(-1, n_in)
    ctx.x2, ctx.weight, ctx.x_shape = x2, weight_cast, x.shape
    return threads.matmul(x2, weight_cast, bias).reshape(*x.shape[:-1], n_out)


def backward_cpu(ctx, grad):
    need_x, need_w, need_b = ctx.needs_input_grad
    x2, weight = ctx.x2, ctx.weight
    g2 = grad.reshape(-1, weight.shape[1])
    grad_weight = None
    if need_w:  # in the weight's own memory order: a transposed table (the tied LM head) gets a
        # transposed gradient, so the table's own gradient comes out contiguous, not strided
        grad_weight = threads.matmul(g2.T, x2).T if _is_transposed(weight) else threads.matmul(x2.T, g2)
    return (
        threads.matmul(g2, weight.T).reshape(ctx.x_shape) if need_x else None,
        grad_weight,
        g2.sum(axis=0) if need_b else None,
    )


def column_sums(x):
    """The sums of the columns of a (rows, width) GPU array, float32, in one launch: each block adds
    ROWS_PER_CHUNK rows, and the blocks that finish last add the chunks' sums in a tree fixed by the
    shape (partial_sums.cuh). No atomic additions: a run repeats bit for bit."""
    xp = backend.get_array_module(x)
    x = xp.ascontiguousarray(x)
    (rows, width), chunks = x.shape, max(1, -(-x.shape[0] // ROWS_PER_CHUNK))
    if not width:
        return xp.empty(width, np.float32)
    column_blocks = min(-(-width // launching.THREADS), 65535)
    scratch, counters, sums = partial_sums(xp, chunks, width, trees=column_blocks)
    args = (x, scratch, counters, sums, np.int64(rows), np.int64(width), np.int32(ROWS_PER_CHUNK))
    sources.kernel("column_sums", "column_sums", x.dtype)((chunks, column_blocks), (launching.THREADS,), args)
    return sums


FAN_IN = 8  # partial_sums.cuh's: the rows each addition of its tree takes


def partial_sums(xp, items, width, trees=1):
    """What a kernel ending in partial_sums.cuh's finish_sums takes beside its inputs: the float32 scratch
    for `items` rows of `width` partial sums and the rows of the tree's levels above them, the zeroed
    counters of `trees` such trees (one per block of columns), and the float32 sums (width,)."""
    rows, counters, level = items, 0, items
    while True:  # up the tree, to the level of one group
        level = -(-level // FAN_IN)
        counters += level
        if level <= 1:
            break
        rows += level
    scratch, sums = xp.empty((rows, width), np.float32), xp.empty(width, np.float32)
    return scratch, launching.counters(xp, trees * counters), sums


def _is_transposed(a):
    """True for a 2-D array laid out column by column (the .T of a row-major one)."""
    return a.flags.f_contiguous and not a.flags.c_contiguous
