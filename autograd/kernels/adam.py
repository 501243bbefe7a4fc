"""Adam and global-norm clipping on a GPU in a few launches (autograd/kernels/cuda/adam.cu).

autograd/optim.py writes Adam.step and clip_grad_norm as whole-array formulas, one CuPy launch
per operator and per parameter: GPT-1's 146 parameters make about 1,850 launches a step in Adam
and 300 in clipping. Here all the parameters go through each kernel together: it reads tables of
the tensors' device pointers and sizes, cut into chunks of CHUNK numbers, one block per chunk.

Launches per step, whatever the number of parameters:

    Adam.step        1 upload (the gradients' pointers) + 1 kernel
    clip_grad_norm   1 upload (the gradients' pointers) + 3 kernels: each chunk's sum of squares;
                     the norm and the clip factor, on the device (no host read); the scaling

Under bf16 a parameter keeps a bfloat16 copy for the products (precision.kept_cast): Adam's kernel
writes it in the pass that updates the parameter, so the next forward casts no weight.

The gradients are new arrays each step, so their pointers go up each time (an upload, no read
back). The other tables (the pointers of parameters, moments and copies, sizes, the chunks) are
uploaded on the first step and again only when those arrays change, as after load_state_dict. An
array not in C order (the kernels index flat) costs one copy more, and one back where a kernel
writes to it.

optim.py keeps its own code as the reference: it runs wherever `takes` says no.
"""

import functools
import math
from typing import NamedTuple

import numpy as np

from .. import backend, kernels
from . import sources

CHUNK = 4096  # numbers per block; a chunk lies in one tensor
THREADS = 256  # threads per block: CLIP_THREADS of adam.cu, where the tree sums start halving


def takes(arrays):
    """Whether the kernels take these arrays, by the rule of kernels.choose: a GPU's fast path where it
    is allowed (kernels.fast_path_allowed) and fits, here float32 arrays all on a GPU; anything else
    runs optim.py's code."""
    fits = len(arrays) > 0 and all(backend.on_gpu(a) and a.dtype == np.float32 for a in arrays)
    return fits and kernels.fast_path_allowed("gpu", {a.dtype for a in arrays})


class Chunks(NamedTuple):
    """Tensors of `sizes` cut into chunks of CHUNK numbers: chunk b is the numbers from start[b]
    of tensor tensor[b]. All but `count` are device arrays."""

    count: int
    sizes: object  # int64, one per tensor
    tensor: object  # int32, one per chunk
    start: object  # int64, one per chunk


def chunk_layout(sizes):
    """For tensors of `sizes`: each chunk's tensor (int32) and first number there (int64), host arrays."""
    counts = np.array([-(-n // CHUNK) for n in sizes], dtype=np.int64)
    tensor = np.repeat(np.arange(len(sizes), dtype=np.int32), counts)
    first = np.cumsum(counts) - counts  # each tensor's first chunk
    start = (np.arange(len(tensor), dtype=np.int64) - np.repeat(first, counts)) * CHUNK
    return tensor, start


@functools.lru_cache(maxsize=16)
def chunks(sizes, xp, device_id):
    """The chunks of tensors of `sizes` (a tuple), uploaded to the current device, `device_id` of
    the array module xp, once per list of sizes."""
    tensor, start = chunk_layout(sizes)
    return Chunks(len(tensor), *map(xp.asarray, (np.array(sizes, np.int64), tensor, start)))


@functools.lru_cache(maxsize=16)
def table(values, dtype, xp, device_id):
    """`values` (a tuple: pointers, ranks) uploaded to the current device, `device_id` of xp, once
    while they do not change."""
    return xp.asarray(np.array(values, dtype=dtype))


def pointers(arrays):
    """The device pointers of `arrays` (0 for a None) as a tuple."""
    return tuple(0 if a is None else a.data.ptr for a in arrays)


def in_c_order(array):
    """`array` itself, or a copy in C order where it is strided: the kernels index it flat."""
    if array is None or array.flags.c_contiguous:
        return array
    return backend.get_array_module(array).ascontiguousarray(array)


def copy_back(arrays, copies):
    """What a kernel wrote into the C-order copy of a strided array, written into the array."""
    for array, copy in zip(arrays, copies):
        if copy is not array:
            array[...] = copy


def adam_step(opt):
    """One step of `opt`, an autograd.optim.Adam whose step_count already counts it, on every
    parameter with a gradient: one kernel (see optim.Adam for the math). A parameter whose grad
    is None gets a null pointer, and the kernel leaves it and its moments alone. A parameter that
    keeps a bfloat16 copy has it written too, and marked as made from the parameter's new version."""
    params = [p._data for p in opt.params]
    kept = [None if p._kept is None else p._kept[1] for p in opt.params]
    xp = backend.get_array_module(params[0])
    with params[0].device as device:
        arrays = [[in_c_order(a) for a in group] for group in (params, opt.m, opt.v, kept)]
        grads = [in_c_order(p.grad) for p in opt.params]
        parts = chunks(tuple(a.size for a in params), xp, device.id)
        if parts.count == 0:
            return
        tables = (table(pointers(group), np.uint64, xp, device.id) for group in arrays)
        p_table, m_table, v_table, copy_table = tables
        ranks = table(tuple(a.ndim for a in params), np.int32, xp, device.id)
        grad_table = xp.asarray(np.array(pointers(grads), dtype=np.uint64))

        t, (b1, b2), coupled = opt.step_count, opt.betas, opt.l2_mode == "coupled"
        if coupled:  # the reference's own expressions, in double, then float32
            root, step_size = math.sqrt(1 - b2**t), opt.lr / (1 - b1**t)
        else:
            root, step_size = 1.0, opt.lr * math.sqrt(1 - b2**t) / (1 - b1**t)
        decays = bool(opt.l2)
        args = (
            *(p_table, grad_table, m_table, v_table, copy_table),
            *(parts.sizes, ranks, parts.tensor, parts.start),
            np.int64(CHUNK),
            *map(np.float32, (b1, 1 - b1, b2, 1 - b2, opt.eps, opt.l2, step_size, root)),
            np.int32(coupled),
            np.int32(decays),  # tensors of two or more dimensions
            np.int32(decays and (coupled or opt.vector_l2)),  # the others
        )
        sources.kernel("adam", "adam_step", np.float32)((parts.count,), (THREADS,), args)
        for originals, copies in zip((params, opt.m, opt.v, kept), arrays):
            copy_back(originals, copies)
    for p in opt.params:
        if p._kept is not None and p.grad is not None:
            p._kept = (p._version, p._kept[1])


def clip_grad_norm(grads, max_norm):
    """optim.clip_grad_norm on float32 gradients of a GPU (at least one): the norm before
    clipping as a 0-d device array, every gradient scaled in place by
    min(1, max_norm / (norm + 1e-6)), all in three kernels and without a read from the device."""
    xp = backend.get_array_module(grads[0])
    with grads[0].device as device:
        copies = [in_c_order(g) for g in grads]
        parts = chunks(tuple(g.size for g in copies), xp, device.id)
        grad_table = xp.asarray(np.array(pointers(copies), dtype=np.uint64))
        partials = xp.empty(parts.count, dtype=np.float32)
        norm, scale = xp.empty((), dtype=np.float32), xp.empty((), dtype=np.float32)
        by_chunk = (grad_table, parts.sizes, parts.tensor, parts.start, np.int64(CHUNK))
        if parts.count:
            chunk_squares = sources.kernel("adam", "chunk_squares", np.float32)
            chunk_squares((parts.count,), (THREADS,), (*by_chunk, partials))
        factor_args = (partials, np.int64(parts.count), np.float32(max_norm), norm, scale)
        sources.kernel("adam", "clip_factor", np.float32)((1,), (THREADS,), factor_args)
        if parts.count:
            sources.kernel("adam", "scale_chunks", np.float32)((parts.count,), (THREADS,), (*by_chunk, scale))
        copy_back(grads, copies)
    return norm
