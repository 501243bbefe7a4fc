"""A stand-in for CuPy on a machine without a GPU, for the tests of the GPU path's Python side.

Its arrays are NumPy arrays tagged with the GPU they live on; there are several GPUs and a current
one, and, as in CuPy, an operation whose arrays do not live on the current device is an error.
Its matrix products behave as CuPy 14's: a product of more than two dimensions of bfloat16 raises
(its batched matmul has no bfloat16), a product of bfloat16 matrices is rounded to bfloat16, and
each product is recorded in `GpuArray.products` with the compute type of float32 products then.

The engine's GPU code runs on it unchanged (`backend.cupy` is replaced): placement, the choice of
paths, the launchers. Its kernels do not run: `gpu.kernel` hands back a recorder, and each launch
is kept in `launches` (kernel, grid, block, arguments, the device current then), its outputs
zeros. With `use_reference(True)` no kernel is launched and the numbers are real.
"""

import functools
import types
from typing import NamedTuple

import numpy as np

import autograd as ag
from autograd import backend
from autograd.kernels import adam, gpu

DEVICES = 2


class Device:
    """cupy.cuda.Device: an index, and a context that makes it the current device."""

    current = 0
    stack = []
    compute_capability = "90"

    def __init__(self, device=None):
        self.id = Device.current if device is None else int(device)

    def __enter__(self):
        Device.stack.append(Device.current)
        Device.current = self.id
        return self

    def __exit__(self, *exc_info):
        Device.current = Device.stack.pop()

    def use(self):
        Device.current = self.id

    def synchronize(self):
        pass


class Memory(NamedTuple):
    ptr: int


class Product(NamedTuple):
    shapes: tuple
    dtypes: tuple  # the inputs' and the result's
    compute_type: int  # of float32 products, when it was made


class GpuArray(np.ndarray):
    """A NumPy array that lives on GPU `device_id` (the current device where it was made)."""

    products = []

    def __array_finalize__(self, source):
        self.device_id = getattr(source, "device_id", Device.current)

    device = property(lambda self: Device(self.device_id))
    data = property(lambda self: Memory(self.ctypes.data))  # cupy's a.data.ptr

    def get(self):
        return np.array(self.view(np.ndarray))

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        arrays = [*inputs, *(out or ())]
        check_current(f"np.{ufunc.__name__}", arrays)
        raw = [a.view(np.ndarray) if isinstance(a, GpuArray) else a for a in inputs]
        if out is not None:
            kwargs["out"] = tuple(a.view(np.ndarray) for a in out)
        result = getattr(ufunc, method)(*raw, **kwargs)
        if ufunc is np.matmul:
            result = as_cupy_multiplies(*raw, result)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return on_current(result)

    def __array_function__(self, function, types, args, kwargs):
        check_current(f"np.{function.__name__}", [*args, *kwargs.values()])
        return on_current(super().__array_function__(function, types, args, kwargs))


def as_cupy_multiplies(a, b, result):
    """NumPy's a @ b as CuPy 14 gives it, recorded in GpuArray.products."""
    bfloat16_in = a.dtype == b.dtype == ag.bfloat16
    if bfloat16_in and max(a.ndim, b.ndim) > 2:
        raise TypeError("data type 'E' not understood")  # CuPy 14's batched matmul, for bfloat16
    if bfloat16_in:
        result = result.astype(ag.bfloat16)  # cuBLAS writes the inputs' type
    GpuArray.products.append(
        Product((a.shape, b.shape), (a.dtype, b.dtype, result.dtype), FakeLinalg.compute_type)
    )
    return result


def bfloat16_matmul_to_float32(a, b):
    """backend's cuBLAS product of bfloat16 matrices written in float32, recorded as a product."""
    raw_a, raw_b = a.view(np.ndarray), b.view(np.ndarray)
    result = raw_a @ raw_b  # NumPy's product of bfloat16 is float32
    GpuArray.products.append(
        Product((a.shape, b.shape), (a.dtype, b.dtype, result.dtype), FakeLinalg.compute_type)
    )
    return on_current(result)


def check_current(what, values):
    """CuPy's rule: every array of an operation lives on the current device."""
    for value in values:
        for a in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(a, GpuArray) and a.device_id != Device.current:
                raise ValueError(
                    f"{what}: an array of GPU {a.device_id} used while GPU {Device.current} is current"
                )


def on_current(result):
    """A result of NumPy's as an array of the current device: a NumPy scalar as a 0-d array, as CuPy
    gives them (Python numbers and other objects as they are)."""
    if isinstance(result, tuple):
        return tuple(on_current(r) for r in result)
    if isinstance(result, np.generic):
        result = np.asarray(result)
    if type(result) is np.ndarray:
        return result.view(GpuArray)  # __array_finalize__ tags it with the current device
    return result


class FakeCupy(types.ModuleType):
    """The module `cupy` as the engine uses it: NumPy's functions, whose new arrays are made on the
    current device; a host array is copied there by asarray, a device array stays where it is."""

    ndarray = GpuArray

    def __init__(self):
        super().__init__("cupy")
        runtime = types.SimpleNamespace(getDeviceCount=lambda: DEVICES)
        self.cuda = types.SimpleNamespace(Device=Device, runtime=runtime, get_current_stream=lambda: None)

    def asarray(self, a, dtype=None, order=None):
        if isinstance(a, GpuArray) and (dtype is None or a.dtype == np.dtype(dtype)):
            return a
        return np.array(np.asarray(a), dtype=dtype, order=order or "K").view(GpuArray)

    def array(self, a, dtype=None, order="K", copy=True):
        return np.array(a.view(np.ndarray) if isinstance(a, GpuArray) else a, dtype, order=order).view(
            GpuArray
        )

    def empty(self, shape, dtype=float):
        return self.zeros(shape, dtype)

    def empty_like(self, a, dtype=None):
        return self.zeros_like(a, dtype)

    def ascontiguousarray(self, a, dtype=None):
        contiguous = np.ascontiguousarray(a, dtype=dtype)
        return contiguous if isinstance(contiguous, GpuArray) else contiguous.view(GpuArray)

    def __getattr__(self, name):
        found = getattr(np, name)
        if isinstance(found, type) or not callable(found):
            return found  # dtypes (cupy.float32), constants

        def on_device(*args, **kwargs):
            return on_current(found(*args, **kwargs))

        return on_device


class Launch(NamedTuple):
    source: str  # autograd/kernels/cuda/<source>.cu
    kernel: str  # the exported name, with its dtype suffix
    grid: tuple
    block: tuple
    args: tuple
    shared_mem: int
    device: int  # the current device at the launch


def recording_kernel(launches):
    """A stand-in for gpu.kernel whose kernels append their launches to `launches`, after checking
    that every array argument lives on the current device, as a real launch needs."""

    def kernel(name, function, dtype):
        exported = f"{function}_{gpu.SUFFIXES[np.dtype(dtype)]}"

        def launch(grid, block, args, shared_mem=0):
            check_current(exported, args)
            launches.append(
                Launch(name, exported, tuple(grid), tuple(block), tuple(args), shared_mem, Device.current)
            )

        return launch

    return kernel


def install(monkeypatch):
    """Put the stand-in in place of CuPy for one test: returns the list that records its launches."""
    launches = []
    monkeypatch.setattr(Device, "current", 0)
    monkeypatch.setattr(Device, "stack", [])
    monkeypatch.setattr(backend, "cupy", FakeCupy())
    monkeypatch.setattr(backend, "_linalg", lambda: FakeLinalg, raising=False)
    monkeypatch.setattr(backend, "_bfloat16_matmul_to_float32", bfloat16_matmul_to_float32, raising=False)
    monkeypatch.setattr(FakeLinalg, "compute_type", FakeLinalg.COMPUTE_TYPE_DEFAULT)
    monkeypatch.setattr(GpuArray, "products", [])
    # the launchers' caches keep device arrays and modules: the stand-in's own, for this test only
    for owner, name in ((adam, "chunks"), (adam, "table"), (gpu, "module")):
        cached = getattr(owner, name)
        monkeypatch.setattr(owner, name, functools.lru_cache(cached.cache_info().maxsize)(cached.__wrapped__))
    monkeypatch.setattr(gpu, "kernel", recording_kernel(launches))
    return launches


class FakeLinalg:
    """CuPy's matrix-product routines as far as the compute type of float32 products goes."""

    COMPUTE_TYPE_DEFAULT, COMPUTE_TYPE_TF32 = 1, 7
    compute_type = COMPUTE_TYPE_DEFAULT

    @classmethod
    def get_compute_type(cls, dtype):
        return cls.compute_type

    @classmethod
    def set_compute_type(cls, dtype, compute_type):
        cls.compute_type = compute_type
