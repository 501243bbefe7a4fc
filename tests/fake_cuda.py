"""A stand-in for CuPy on a machine without a GPU, for the tests of the GPU path's Python side.

Its arrays are NumPy arrays tagged with the GPU they live on; there are several GPUs and a current
one, and, as in CuPy, an operation whose arrays do not live on the current device is an error.
Its matrix products behave as CuPy 14's: a product of more than two dimensions of bfloat16 raises
(its batched matmul has no bfloat16), a product of bfloat16 matrices is rounded to bfloat16, one of
float32 matrices reads its inputs rounded to TF32 under TF32 (as the emulated device's), and each
product is recorded in `GpuArray.products` with the compute type of float32 products then.

The engine's GPU code runs on it unchanged (`backend.cupy` is replaced): placement, the choice of
paths, the launchers. Its kernels do not run: `sources.kernel` hands back a recorder, and each launch
is kept in `launches` (kernel, grid, block, arguments, the device current then), its outputs left
as `empty` made them: NaN. With `use_reference(True)` no kernel is launched and the numbers are real.
"""

import functools
import types
from typing import NamedTuple

import numpy as np

import autograd as ag
from autograd import backend, products
from autograd.emulator import ArrayModule, EmulatedArray, Linalg, host_view, on_device
from autograd.kernels import adam, compiling, launching, sources

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


class Product(NamedTuple):
    shapes: tuple
    dtypes: tuple  # the inputs' and the result's
    compute_type: int  # of float32 products, when it was made


class GpuArray(EmulatedArray):
    """An array of the emulated device's kind that lives on GPU `device_id` (the current device where
    it was made), and whose operations follow CuPy's rules (check_current, as_cupy_multiplies)."""

    products = []
    linalg = property(lambda self: FakeLinalg)  # whose compute type its float32 products follow

    def __array_finalize__(self, source):
        self.device_id = getattr(source, "device_id", Device.current)

    device = property(lambda self: Device(self.device_id))

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        check_current(f"np.{ufunc.__name__}", [*inputs, *(out or ())])
        result = super().__array_ufunc__(ufunc, method, *inputs, out=out, **kwargs)
        return as_cupy_multiplies(*inputs, result) if ufunc is np.matmul else result

    def __array_function__(self, function, types, args, kwargs):
        check_current(f"np.{function.__name__}", [*args, *kwargs.values()])
        return super().__array_function__(function, types, args, kwargs)


def as_cupy_multiplies(a, b, result):
    """NumPy's a @ b as CuPy 14 gives it, recorded in GpuArray.products."""
    bfloat16_in = a.dtype == b.dtype == ag.bfloat16
    if bfloat16_in and max(a.ndim, b.ndim) > 2:
        raise TypeError("data type 'E' not understood")  # CuPy 14's batched matmul, for bfloat16
    if bfloat16_in:
        result = result.astype(ag.bfloat16)  # cuBLAS writes the inputs' type
    return recorded(a, b, result)


def bfloat16_matmul_to_float32(a, b):
    """backend's cuBLAS product of bfloat16 matrices written in float32, recorded as a product."""
    result = host_view(a) @ host_view(b)  # NumPy's product of bfloat16 is float32
    return recorded(a, b, on_device(result, GpuArray))


def recorded(a, b, result):
    """result, the product a @ b, once it is added to GpuArray.products."""
    GpuArray.products.append(
        Product((a.shape, b.shape), (a.dtype, b.dtype, result.dtype), FakeLinalg.compute_type)
    )
    return result


def check_current(what, values):
    """CuPy's rule: every array of an operation lives on the current device."""
    for value in values:
        for a in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(a, GpuArray) and a.device_id != Device.current:
                raise ValueError(
                    f"{what}: an array of GPU {a.device_id} used while GPU {Device.current} is current"
                )


class FakeCupy(ArrayModule):
    """The module `cupy` as the engine uses it: the emulated device's array module, its arrays
    GpuArrays; asarray copies a host array, or one of another GPU, to the current device, and keeps
    one of the current device as it is. Its `empty` is the emulated device's: every bit set (NaN in a
    floating type), so that what no kernel writes shows, never zeros by luck."""

    ndarray = GpuArray

    def __init__(self):
        super().__init__("cupy")
        runtime = types.SimpleNamespace(getDeviceCount=lambda: DEVICES)
        stream = types.SimpleNamespace(ptr=0)  # the one stream: launches run in turn
        self.cuda = types.SimpleNamespace(Device=Device, runtime=runtime, get_current_stream=lambda: stream)

    def asarray(self, a, dtype=None):
        if isinstance(a, GpuArray) and a.device_id != Device.current:  # copied, as CuPy copies between GPUs
            return self.array(a, dtype)
        return super().asarray(a, dtype)


class Launch(NamedTuple):
    source: str  # autograd/kernels/cuda/<source>.cu
    kernel: str  # the exported name, with its dtype suffix
    grid: tuple
    block: tuple
    args: tuple
    shared_mem: int
    device: int  # the current device at the launch


def recording_kernel(launches):
    """A stand-in for sources.kernel whose kernels append their launches to `launches`, after checking
    that every array argument lives on the current device, as a real launch needs."""

    def kernel(name, function, dtype):
        exported = f"{function}_{compiling.SUFFIXES[np.dtype(dtype)]}"

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
    monkeypatch.setattr(products, "_linalg", lambda: FakeLinalg, raising=False)
    monkeypatch.setattr(products, "_bfloat16_matmul_to_float32", bfloat16_matmul_to_float32, raising=False)
    monkeypatch.setattr(FakeLinalg, "compute_type", FakeLinalg.COMPUTE_TYPE_DEFAULT)
    monkeypatch.setattr(GpuArray, "products", [])
    # the launchers' caches keep device arrays and modules: the stand-in's own, for this test only
    caches = (
        (adam, "chunks"),
        (adam, "table"),
        (sources, "module"),
        (sources, "gpu_kernel"),
        (launching, "_counters"),
        (products, "_compute_capability"),
    )
    for owner, name in caches:
        cached = getattr(owner, name)
        monkeypatch.setattr(owner, name, functools.lru_cache(cached.cache_info().maxsize)(cached.__wrapped__))
    monkeypatch.setattr(sources, "kernel", recording_kernel(launches))
    return launches


class FakeLinalg(Linalg):
    """CuPy's matrix-product routines as far as the compute type of float32 products goes: the
    emulated device's, with a compute type of its own, CuPy's default until set."""

    compute_type = Linalg.COMPUTE_TYPE_DEFAULT
