"""The embedding's CUDA path (autograd/kernels/cuda/embedding.cu): the rows gathered and cast to
the output's type in one pass; the table's gradient summed without atomics, so that it repeats
bit for bit. A stable sort of the ids puts the positions that picked each table row side by
side, in their order, and one block per table row adds their gradients one after another."""

import numpy as np

from .. import backend
from . import gpu


def _kernel(function, read_dtype, write_dtype):
    """The kernel `<function>_<read>_<write>` of embedding.cu: reads read_dtype, writes write_dtype."""
    return gpu.kernel("embedding", f"{function}_{gpu.SUFFIXES[np.dtype(read_dtype)]}", write_dtype)


def forward_gpu(ctx, ids, weight, dtype):
    xp = backend.get_array_module(weight)
    n_rows, dim = weight.shape
    # an id outside [0, n_rows) wraps around, as CuPy's weight[ids] and the reference's gradient read it
    ctx.rows = ids.reshape(-1).astype(xp.int64) % n_rows
    ctx.weight_shape, ctx.weight_dtype = weight.shape, weight.dtype
    out = xp.empty((len(ctx.rows), dim), dtype)
    if out.size:
        args = (xp.ascontiguousarray(weight), ctx.rows, out, np.int64(len(ctx.rows)), np.int64(dim))
        _kernel("embedding_forward", weight.dtype, dtype)((gpu.blocks(out.size),), (gpu.THREADS,), args)
    return out.reshape(*ids.shape, dim)


def backward_gpu(ctx, grad):
    xp = backend.get_array_module(grad)
    n_rows, dim = ctx.weight_shape
    grad = xp.ascontiguousarray(grad).reshape(-1, dim)
    order = xp.argsort(ctx.rows, kind="stable")  # the positions, grouped by table row, in their order
    bounds = xp.searchsorted(ctx.rows[order], xp.arange(n_rows + 1))  # row r's: order[bounds[r]:bounds[r+1]]
    grad_weight = xp.empty(ctx.weight_shape, ctx.weight_dtype)
    if grad_weight.size:
        args = (grad, order, bounds, grad_weight, np.int64(dim))
        _kernel("embedding_backward", grad.dtype, ctx.weight_dtype)((n_rows,), (gpu.THREADS,), args)
    return None, grad_weight
