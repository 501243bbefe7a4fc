"""The emulated CUDA device, "cuda-emulated": a GPU on the CPU, for the tests and for reading the
kernels. Its arrays are NumPy arrays of a subclass that the engine takes for a GPU's, so every op
runs its GPU path (forward_gpu, backward_gpu, unchanged), and `gpu.kernel` hands back the CUDA
sources built for the CPU (autograd/kernels/emulated.py) while an op of this device runs. What is
CuPy's own on a GPU (cuBLAS's products, memory pools, streams, NCCL) is NumPy's here.

`xp` is the device's array module, as `cupy` is a GPU's: NumPy's functions, whose arrays it makes
on the device (a NumPy scalar result becomes a 0-d array, as CuPy gives them)."""

import types

import numpy as np

NAME = "cuda-emulated"


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
    """True inside an op of the emulated device: where gpu.kernel gives emulated kernels."""
    return Device._depth > 0


class Pointer(types.SimpleNamespace):
    """An array's memory as CuPy names it (`a.data.ptr`): here the host address."""


class EmulatedArray(np.ndarray):
    """An array of the emulated device: NumPy's, and what NumPy computes from it is the device's."""

    device = property(lambda self: Device())
    data = property(lambda self: Pointer(ptr=self.ctypes.data))

    def get(self):
        """A host copy, as CuPy's get()."""
        return np.array(self.view(np.ndarray))

    def __getitem__(self, index):  # an entry is a 0-d array, as CuPy's
        return on_device(super().__getitem__(index), type(self))

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        raw = [host_view(a) for a in inputs]
        if out is not None:
            kwargs["out"] = tuple(host_view(a) for a in out)
        result = getattr(ufunc, method)(*raw, **kwargs)
        return out[0] if out is not None and len(out) == 1 else on_device(result, type(self))

    def __array_function__(self, function, types, args, kwargs):
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

    def asarray(self, a, dtype=None):
        if isinstance(a, self.ndarray) and (dtype is None or a.dtype == np.dtype(dtype)):
            return a
        return np.array(host_view(a), dtype=dtype).view(self.ndarray)

    def array(self, a, dtype=None, order="K"):
        return np.array(host_view(a), dtype=dtype, order=order).view(self.ndarray)

    def ascontiguousarray(self, a, dtype=None):
        return on_device(np.ascontiguousarray(host_view(a), dtype=dtype), self.ndarray)

    def __getattr__(self, name):
        found = getattr(np, name)
        if isinstance(found, type) or not callable(found):
            return found  # dtypes (xp.float32) and constants

        def made_on_device(*args, **kwargs):
            return on_device(found(*args, **kwargs), self.ndarray)

        return made_on_device


xp = ArrayModule("cuda_emulated")
