"""The emulated CUDA device, "cuda-emulated": a GPU on the CPU, for the tests and for reading the
kernels. Its arrays are NumPy arrays of a subclass that the engine takes for a GPU's, so every op
runs its GPU path (forward_gpu, backward_gpu, unchanged), and `sources.kernel` hands back the CUDA
sources built for the CPU (autograd/emulator/kernels.py) while an op of this device runs. What is
CuPy's own on a GPU (cuBLAS's products, memory pools, streams, NCCL) is NumPy's here, its products
reading TF32 inputs where CuPy's would (CUPY_TF32=1 or a tf32 block: Linalg, as_cupy_reads).

`xp` is the device's array module, as `cupy` is a GPU's: NumPy's functions, whose arrays it makes
on the device (a NumPy scalar result becomes a 0-d array, as CuPy gives them)."""

import functools
import os
import types

import numpy as np

NAME = "cuda-emulated"
counter = None  # while autograd.gpu_costs counts launches, its Count: told each operation of the device


def counted(operation):
    """`operation` (of the device's arrays or array module), told to the counter while one counts: the
    counter records what CuPy would launch for it on a GPU, and computes it (or, for a product, may not)."""

    @functools.wraps(operation)
    def told(*args, **kwargs):
        if counter is None:
            return operation(*args, **kwargs)
        return counter.operation(operation.__name__, args, kwargs, lambda: operation(*args, **kwargs))

    return told


class Device:
    """The emulated device as a context: an op inside `with Device():` launches emulated kernels.
    `id` tells its caches from those of real GPUs."""

    id = -1
    _depth = 0

    def __enter__(self):
        Device._depth += 1
        return self

    def __exit__(self, *exc_info):
        Device._depth -= 1


def current():
    """True inside an op of the emulated device: where sources.kernel gives emulated kernels."""
    return Device._depth > 0


class Pointer(types.SimpleNamespace):
    """An array's memory as CuPy names it (`a.data.ptr`): here the host address."""


class Linalg:
    """The compute type of the device's float32 matrix products, kept as CuPy keeps it: TF32 where
    CUPY_TF32=1, read the first time it is asked for; set_compute_type changes it (products.set_tf32)."""

    COMPUTE_TYPE_DEFAULT, COMPUTE_TYPE_TF32 = 1, 7  # CuPy's numbers
    compute_type = None  # not read yet

    @classmethod
    def get_compute_type(cls, dtype):
        if cls.compute_type is None:
            asked = int(os.environ.get("CUPY_TF32", "0")) > 0
            cls.compute_type = cls.COMPUTE_TYPE_TF32 if asked else cls.COMPUTE_TYPE_DEFAULT
        return cls.compute_type

    @classmethod
    def set_compute_type(cls, dtype, compute_type):
        cls.compute_type = compute_type


def tf32(x):
    """float32 values rounded to TF32, as tensor cores read a TF32 product's inputs: 10 of the 23
    mantissa bits kept, to the nearest, ties away from zero (PTX's cvt.rna.tf32.f32). The sign is a
    bit apart: adding half the last bit kept and clearing the 13 below rounds the magnitude."""
    x = np.asarray(x, np.float32)
    rounded = (x.view(np.uint32) + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
    return np.where(np.isnan(x), x, rounded.view(np.float32))  # NaN stays NaN


def as_cupy_reads(linalg, function, a, b):
    """The operands of np.matmul or np.dot as CuPy reads them: rounded to TF32 where cuBLAS's gemm
    makes a float32 result under TF32. Not in a matmul of stacks (more than two dimensions: a batched
    gemm, as einsum's) nor in a dot of two vectors (one entry out: a reduction), both in float32."""
    a, b = np.asarray(a), np.asarray(b)
    gemm = min(a.ndim, b.ndim) > 0 and not a.size == b.size == a.shape[-1]
    batched = function is np.matmul and max(a.ndim, b.ndim) > 2
    in_tf32 = linalg.get_compute_type(np.float32) == linalg.COMPUTE_TYPE_TF32
    rounds = in_tf32 and gemm and not batched and np.result_type(a, b) == np.float32
    return (tf32(a), tf32(b)) if rounds else (a, b)


class EmulatedArray(np.ndarray):
    """An array of the emulated device: NumPy's, and what NumPy computes from it is the device's."""

    device = property(lambda self: Device())
    linalg = Linalg  # whose compute type its float32 products follow, as CuPy's
    data = property(lambda self: Pointer(ptr=self.ctypes.data))
    # what CuPy may launch a kernel for (a copy, a cast, a fill): told to the counter of gpu_costs
    astype, copy, fill = counted(np.ndarray.astype), counted(np.ndarray.copy), counted(np.ndarray.fill)
    reshape, ravel = counted(np.ndarray.reshape), counted(np.ndarray.ravel)
    __setitem__ = counted(np.ndarray.__setitem__)

    @property
    def base(self):
        """The array this one is a view of, as CuPy's `base`; None for one that holds memory of its own,
        a plain NumPy array that owns it: Gradients copies only views, as on a GPU."""
        base = super().base
        return None if type(base) is np.ndarray and base.flags.owndata else base

    @counted
    def get(self):
        """A host copy, as CuPy's get()."""
        return np.array(self.view(np.ndarray))

    @counted
    def __getitem__(self, index):  # an entry is a 0-d array, as CuPy's
        return on_device(super().__getitem__(index), type(self))

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    @counted
    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        raw = [host_view(a) for a in inputs]
        if ufunc is np.matmul:
            raw = as_cupy_reads(self.linalg, ufunc, *raw)
        if out is not None:
            kwargs["out"] = tuple(host_view(a) for a in out)
        result = getattr(ufunc, method)(*raw, **kwargs)
        return out[0] if out is not None and len(out) == 1 else on_device(result, type(self))

    @counted
    def __array_function__(self, function, types, args, kwargs):
        if function is np.dot:
            args = (*as_cupy_reads(self.linalg, function, *args[:2]), *args[2:])
        return on_device(super().__array_function__(function, types, args, kwargs), type(self))


def host_view(a):
    """The same memory as a plain NumPy array (anything else as it is)."""
    return a.view(np.ndarray) if isinstance(a, EmulatedArray) else a


def on_device(result, kind=EmulatedArray):
    """NumPy's result as the device's: arrays viewed as `kind`, scalars as 0-d arrays."""
    if isinstance(result, tuple):
        return tuple(on_device(r, kind) for r in result)
    if isinstance(result, np.generic):
        result = np.asarray(result)
    return result.view(kind) if type(result) is np.ndarray else result


class ArrayModule(types.ModuleType):
    """The device's `cupy`: NumPy's functions and types, new arrays made on the device."""

    ndarray = EmulatedArray

    @counted
    def asarray(self, a, dtype=None):
        if isinstance(a, self.ndarray) and (dtype is None or a.dtype == np.dtype(dtype)):
            return a
        return np.array(host_view(a), dtype=dtype).view(self.ndarray)

    @counted
    def array(self, a, dtype=None, order="K"):
        return np.array(host_view(a), dtype=dtype, order=order).view(self.ndarray)

    @counted
    def ascontiguousarray(self, a, dtype=None):
        return on_device(np.ascontiguousarray(host_view(a), dtype=dtype), self.ndarray)

    def empty(self, shape, dtype=float):
        """Every bit set (NaN in a floating type, True in bool), never zeros by luck as np.empty's
        fresh pages are: an entry that a kernel leaves unwritten shows, as in shared memory."""
        out = np.empty(shape, dtype)  # its own memory, as a GPU's empty (EmulatedArray.base)
        out.reshape(-1).view(np.uint8)[...] = 1 if out.dtype.kind == "b" else 255
        return out.view(self.ndarray)

    def empty_like(self, a, dtype=None):
        return self.empty(a.shape, a.dtype if dtype is None else dtype)

    def __getattr__(self, name):
        found = getattr(np, name)
        if isinstance(found, type) or not callable(found):
            return found  # dtypes (xp.float32) and constants

        @counted
        @functools.wraps(found)
        def made_on_device(*args, **kwargs):
            return on_device(found(*args, **kwargs), self.ndarray)

        return made_on_device


@counted
def product(a, b, dtype):
    """products.matmul's a @ b in `dtype`: one cuBLAS call on a GPU (bfloat16 in and float32 out
    included), NumPy's product and a cast here."""
    return (a @ b).astype(dtype, copy=False)


xp = ArrayModule("cuda_emulated")
