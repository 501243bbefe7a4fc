"""Dropout's CUDA path (autograd/kernels/cuda/dropout.cu): the mask drawn in the kernel, with the
bits autograd/random.py draws, and applied in the same pass."""

import numpy as np

from .. import backend, masks
from . import launching, sources


def forward_gpu(ctx, x, p, generator):
    xp = backend.get_array_module(x)
    x = xp.ascontiguousarray(x).reshape(x.shape)  # (ascontiguousarray makes a 0-d x 1-d)
    seed, step, site, first_example, threshold = generator.next_key(p)
    n = x.size
    per_example = n // x.shape[0] if x.ndim >= 2 and x.shape[0] else n  # an array of < 2 axes: one example
    out, ctx.keep = xp.empty_like(x), xp.empty(x.shape, dtype=xp.uint8)
    ctx.scale = masks.keep_scale(p)
    key = (np.uint64(seed), *map(np.uint32, (step, site, first_example, threshold)))
    args = (x, out, ctx.keep, np.int64(n), np.int64(max(per_example, 1)), *key, np.float32(ctx.scale))
    sources.kernel("dropout", "dropout_forward", x.dtype)((launching.blocks(n),), (launching.THREADS,), args)
    return out


def backward_gpu(ctx, grad):
    xp = backend.get_array_module(grad)
    grad, out = xp.ascontiguousarray(grad), xp.empty(grad.shape, grad.dtype)
    args = (grad, ctx.keep, out, np.int64(grad.size), np.float32(ctx.scale))
    sources.kernel("dropout", "dropout_backward", grad.dtype)(
        (launching.blocks(grad.size),), (launching.THREADS,), args
    )
    return out
