"""Matrix products and the precision they run in: the engine's products of two matrices (matmul),
bfloat16 products summed and written in float32 on a GPU (cuBLAS's gemmEx), and TF32 on the tensor
cores, asked for by the tf32 precision policy (autograd/precision.py)."""

import functools

import numpy as np

from . import backend, emulator

# TF32: CuPy keeps one compute type for its float32 matrix products, read from CUPY_TF32 the first
# time it is asked for, and so does the emulated device. set_tf32(True) sets each to TF32,
# set_tf32(False) gives each back what it was.
_tf32 = False
_compute_types_before = {}  # linalg (CuPy's routines, or the emulated device's): its compute type


def set_tf32(on):
    """Let the GPUs' float32 matrix products round their inputs to TF32 on tensor cores (on), or
    give them back the compute type the process had (its default, or TF32 where CUPY_TF32=1 asked
    for it); returns the setting before. CuPy honours it in products of two matrices only
    (matmul); the emulated device does as CuPy. On the CPU it changes nothing."""
    global _tf32
    before, _tf32 = _tf32, bool(on)
    if _tf32 and not before:
        for linalg in [emulator.Linalg, *([_linalg()] if backend.cuda_available() else [])]:
            _compute_types_before[linalg] = linalg.get_compute_type(np.float32)
            linalg.set_compute_type(np.float32, linalg.COMPUTE_TYPE_TF32)
    if before and not _tf32:
        for linalg, compute_type in _compute_types_before.items():
            linalg.set_compute_type(np.float32, compute_type)
        _compute_types_before.clear()
    return before


def tf32_asked():
    """True inside set_tf32(True) (the tf32 precision policy): the fused kernels' own products take TF32
    there, and only there; CUPY_TF32=1 is CuPy's, for its own products."""
    return _tf32


def tensor_cores(xp):
    """True where xp's device multiplies bfloat16 and tf32 on tensor cores: a GPU of sm_80 (Ampere) or
    later, and the emulated device."""
    return xp is emulator.xp or _compute_capability(backend.cupy.cuda.Device().id) >= 80


@functools.cache
def _compute_capability(device_id):
    return int(backend.cupy.cuda.Device(device_id).compute_capability)


def _linalg():
    """CuPy's matrix-product routines, which hold the compute type of its float32 products."""
    from cupy._core import _routines_linalg

    return _routines_linalg


# Matrix products. CuPy multiplies stacks of matrices (more than two dimensions) through cuBLAS's
# batched routines, which take no bfloat16 and ignore TF32; products of two matrices take both. So
# the engine's products go through matmul, with (B, T, C) activations as (B*T, C) matrices.
def matmul(a, b, dtype=None):
    """a @ b for matrices a (m, k) and b (k, n), summed in float32 (float64 for float64), in
    `dtype` (by default the inputs' type). Products of bfloat16 round once, at the end, on both
    devices: NumPy's product of bfloat16 is float32, and on a GPU cuBLAS writes float32 itself
    where `dtype` asks for it (a weight's gradient), where CuPy's a @ b would round to bfloat16."""
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"matmul: two matrices, not arrays of shapes {a.shape} and {b.shape}")
    dtype = np.dtype(dtype or a.dtype)
    bfloat16_in = a.dtype.name == b.dtype.name == "bfloat16"
    if bfloat16_in and dtype == np.float32 and backend.get_array_module(a, b) is backend.cupy:
        return _bfloat16_matmul_to_float32(a, b)
    if backend.get_array_module(a, b) is emulator.xp:  # one product, as cuBLAS makes it (gpu_costs counts it)
        return emulator.product(a, b, dtype)
    return (a @ b).astype(dtype, copy=False)


def _bfloat16_matmul_to_float32(a, b):
    """a @ b of bfloat16 matrices on a GPU, written in float32 by cuBLAS's gemmEx (bfloat16 in,
    float32 sums and result)."""
    from cupy_backends.cuda.api import runtime
    from cupy_backends.cuda.libs import cublas

    (m, k), n = a.shape, b.shape[1]
    if 0 in (m, n, k):
        return backend.cupy.zeros((m, n), np.float32)
    out = backend.cupy.empty((m, n), np.float32)
    # cuBLAS reads matrices column by column: out in rows is out^T in columns, which is b^T a^T
    (b, op_b, ld_b), (a, op_a, ld_a) = _as_columns(b), _as_columns(a)
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
    cublas.gemmEx(
        backend.cupy.cuda.device.get_cublas_handle(), op_b, op_a, n, m, k, one.ctypes.data,
        b.data.ptr, runtime.CUDA_R_16BF, ld_b, a.data.ptr, runtime.CUDA_R_16BF, ld_a,
        zero.ctypes.data, out.data.ptr, runtime.CUDA_R_32F, n,
        cublas.CUBLAS_COMPUTE_32F, cublas.CUBLAS_GEMM_DEFAULT_TENSOR_OP,
    )  # fmt: skip
    return out


def _as_columns(x):
    """(array, op, leading dimension) that give cuBLAS the transpose of the matrix x (r, c): x's own
    memory where it is in C order (read by columns, it is x^T) or Fortran order (it is x, so op T),
    else a copy in C order."""
    if x.flags.c_contiguous:
        return x, 0, x.shape[1]
    if x.flags.f_contiguous:
        return x, 1, x.shape[0]
    return backend.cupy.ascontiguousarray(x), 0, x.shape[1]
