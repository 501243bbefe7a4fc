"""The one place that knows about NumPy versus CuPy.

Everything else writes `xp = get_array_module(array)` and calls `xp.exp`, `xp.matmul`, ...
so one piece of code runs on the CPU (NumPy) and on an NVIDIA GPU (CuPy).
"""

import math

import numpy as np

try:
    import cupy
except ImportError:  # CuPy is optional: without it only the CPU is available.
    cupy = None

CUDA_INSTALL_HINT = "pip install 'tinygpt[cuda12]' (or 'tinygpt[cuda13]' for CUDA 13)"


def cuda_available():
    """True when CuPy is installed and sees at least one CUDA device."""
    return device_count() > 0


def device_count():
    """How many CUDA devices CuPy sees: 0 without CuPy or without a driver it can talk to."""
    if cupy is None:
        return 0
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no driver, or a driver CuPy cannot talk to
        return 0


def use_device(index):
    """Make CUDA device `index` the current one of this process (where new arrays go)."""
    _require_cuda()
    cupy.cuda.Device(index).use()


def current_stream():
    """The raw pointer of the current CUDA stream, for libraries that take one (NCCL)."""
    return cupy.cuda.get_current_stream().ptr


def nccl():
    """CuPy's NCCL bindings (cupy.cuda.nccl); ImportError where CuPy or NCCL is missing. Without
    NCCL, CuPy's module still imports, but with `available` false and none of its functions."""
    if cupy is None:
        raise ImportError(f"CuPy is not installed: {CUDA_INSTALL_HINT}")
    from cupy.cuda import nccl as bindings

    if not bindings.available:
        raise ImportError("CuPy found no NCCL library")
    return bindings


def _require_cuda():
    if cupy is None:
        raise RuntimeError(f"device 'cuda' needs CuPy, which is not installed: {CUDA_INSTALL_HINT}")
    if not cuda_available():
        raise RuntimeError(
            "device 'cuda' needs an NVIDIA GPU, but CuPy found no CUDA device "
            "(check the driver with nvidia-smi), or use device='cpu'"
        )


def parse_device(device):
    """Normalise a device name: None or 'cpu' -> 'cpu'; 'cuda', 'cuda:N'; 'auto' picks a GPU if any."""
    if device is None or device == "cpu":
        return "cpu"
    if device == "auto":
        return "cuda:0" if cuda_available() else "cpu"
    if not isinstance(device, str) or not (device == "cuda" or device.startswith("cuda:")):
        raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N' or 'auto', got {device!r}")
    index = 0 if device == "cuda" else device[len("cuda:") :]
    if not str(index).isdigit():
        raise ValueError(f"device {device!r}: the GPU index after 'cuda:' must be a number")
    _require_cuda()
    index = int(index)
    if index >= cupy.cuda.runtime.getDeviceCount():
        raise ValueError(
            f"device {device!r}: only {cupy.cuda.runtime.getDeviceCount()} CUDA device(s) present"
        )
    return f"cuda:{index}"


def get_array_module(*arrays):
    """numpy, or cupy when any of the arrays lives on a GPU."""
    if cupy is not None:
        for a in arrays:
            if isinstance(a, cupy.ndarray):
                return cupy
    return np


def device_of(array):
    """The device name of an array: 'cpu' or 'cuda:N'."""
    if cupy is not None and isinstance(array, cupy.ndarray):
        return f"cuda:{array.device.id}"
    return "cpu"


def to_device(array, device, dtype=None):
    """The array on `device` (a parsed name), with `dtype` if given; copies only when it must."""
    if device == "cpu":
        if cupy is not None and isinstance(array, cupy.ndarray):
            array = array.get()
        return np.asarray(array, dtype=dtype)
    with cupy.cuda.Device(int(device.split(":")[1])):
        return cupy.asarray(array, dtype=dtype)


def to_numpy(array):
    """A host (NumPy) array with the same values."""
    if cupy is not None and isinstance(array, cupy.ndarray):
        return array.get()
    return np.asarray(array)


# Random numbers: one generator per device, seeded together by manual_seed.
_generators = {}
_seed = None


def manual_seed(seed):
    """Seed every device's default generator, so dropout and init are reproducible."""
    global _seed
    _seed = int(seed)
    _generators.clear()


def default_generator(device):
    """The default random generator of a device: numpy's or cupy's `Generator`."""
    if device not in _generators:
        _generators[device] = new_generator(_seed, device)
    return _generators[device]


def new_generator(seed, device="cpu"):
    """A fresh random generator on `device`; the same seed gives the same numbers each time."""
    if device == "cpu":
        return np.random.default_rng(seed)
    with cupy.cuda.Device(int(device.split(":")[1])):
        return cupy.random.default_rng(seed)


def erf(x):
    """The error function, elementwise. NumPy has none, so the CPU path goes through math.erf."""
    if get_array_module(x) is not np:
        import cupyx.scipy.special

        return cupyx.scipy.special.erf(x)
    return np.asarray(np.frompyfunc(math.erf, 1, 1)(x), dtype=x.dtype)
