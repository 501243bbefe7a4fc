"""The embedding's CUDA path (autograd/kernels/cuda/embedding.cu): the rows gathered and cast to
the output's type in one pass; the table's gradient summed without atomics, so that it repeats
bit for bit: each block of the backward takes a few table rows, goes through the positions in
order and adds the gradients of those that picked its rows, one after another. One launch each
way, reading the ids as they are: no sort, no copy of them (an int64 array of ids is kept as the
reference keeps it: changed in place before the backward, it changes the gradient). Every block
reads all the ids: (rows / 8) x positions reads, which a GPU's L2 serves (166 MB at GPT-1's batch
of 8 x 512), growing with the batch where a sort would grow as n log n."""

import numpy as np

from .. import backend
from . import compiling, launching, sources

ROWS_PER_BLOCK = 8  # embedding.cu's: the table rows a block of the backward sums at once


def _kernel(function, read_dtype, write_dtype):
    """The kernel `<function>_<read>_<write>` of embedding.cu: reads read_dtype, writes write_dtype."""
    return sources.kernel("embedding", f"{function}_{compiling.SUFFIXES[np.dtype(read_dtype)]}", write_dtype)


def forward_gpu(ctx, ids, weight, dtype):
    xp = backend.get_array_module(weight)
    n_rows, dim = weight.shape
    # an id outside [0, n_rows) wraps around in the kernels, as CuPy's weight[ids] and the reference read it
    ctx.ids = xp.ascontiguousarray(ids.reshape(-1), dtype=xp.int64)
    ctx.weight_shape, ctx.weight_dtype = weight.shape, weight.dtype
    out = xp.empty((len(ctx.ids), dim), dtype)
    if out.size:
        sizes = (np.int64(len(ctx.ids)), np.int64(n_rows), np.int64(dim))
        args = (xp.ascontiguousarray(weight), ctx.ids, out, *sizes)
        kernel = _kernel("embedding_forward", weight.dtype, dtype)
        kernel((launching.blocks(out.size),), (launching.THREADS,), args)
    return out.reshape(*ids.shape, dim)


def backward_gpu(ctx, grad):
    xp = backend.get_array_module(grad)
    n_rows, dim = ctx.weight_shape
    grad = xp.ascontiguousarray(grad).reshape(-1, dim)
    grad_weight = xp.empty(ctx.weight_shape, ctx.weight_dtype)
    if grad_weight.size:
        args = (grad, ctx.ids, grad_weight, np.int64(len(ctx.ids)), np.int64(n_rows), np.int64(dim))
        grid = (min(-(-n_rows // ROWS_PER_BLOCK), 2**31 - 1),)
        _kernel("embedding_backward", grad.dtype, ctx.weight_dtype)(grid, (launching.THREADS,), args)
    return None, grad_weight
