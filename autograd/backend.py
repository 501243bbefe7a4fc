"""The one place that knows about NumPy versus CuPy.

Everything else writes `xp = get_array_module(array)` and calls `xp.exp`, `xp.matmul`, ...
so one piece of code runs on the CPU (NumPy) and on an NVIDIA GPU (CuPy).
"""

import contextlib
import importlib
import math

import numpy as np

from . import emulator, host_reads

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


def use_device(device):
    """Make `device` (any name parse_device takes) the current one of this process: where the
    arrays that no input places go (CuPy's zeros, arange, random numbers). 'cpu' and
    'cuda-emulated', whose arrays always go where their module makes them, change nothing."""
    device = parse_device(device)
    if device not in ("cpu", emulator.NAME):
        cupy.cuda.Device(gpu_index(device)).use()


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
    """Normalise a device name: None or 'cpu' -> 'cpu'; 'cuda', 'cuda:N'; 'auto' picks a GPU if any;
    'cuda-emulated', the CUDA kernels run on the CPU (autograd/emulator/__init__.py)."""
    if device is None or device == "cpu":
        return "cpu"
    if device == emulator.NAME:
        return device
    if device == "auto":
        return "cuda:0" if cuda_available() else "cpu"
    if not isinstance(device, str) or not (device == "cuda" or device.startswith("cuda:")):
        raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N', 'auto' or 'cuda-emulated', got {device!r}")
    index = 0 if device == "cuda" else device[len("cuda:") :]
    if not str(index).isdigit():
        raise ValueError(f"device {device!r}: the GPU index after 'cuda:' must be a number")
    _require_cuda()
    index = int(index)
    if index >= (count := cupy.cuda.runtime.getDeviceCount()):
        raise ValueError(f"device {device!r}: only {count} CUDA device(s) present")
    return f"cuda:{index}"


def gpu_index(device):
    """The GPU number of a parsed 'cuda:N' name."""
    return int(device.removeprefix("cuda:"))


def get_array_module(*arrays):
    """numpy, or the array module of the GPU where any of the arrays lives (cupy, or the emulated
    device's)."""
    for a in arrays:
        if cupy is not None and isinstance(a, cupy.ndarray):
            return cupy
        if isinstance(a, emulator.EmulatedArray):
            return emulator.xp
    return np


def on_gpu(array):
    """True for an array of a GPU: CuPy's, or the emulated device's."""
    return cupy is not None and isinstance(array, cupy.ndarray) or isinstance(array, emulator.EmulatedArray)


def device_of(array):
    """The device name of an array: 'cpu' or 'cuda:N'."""
    if cupy is not None and isinstance(array, cupy.ndarray):
        return f"cuda:{array.device.id}"
    return emulator.NAME if isinstance(array, emulator.EmulatedArray) else "cpu"


def device_scope(array):
    """`with device_scope(array):` makes the array's GPU the current device inside the block, where
    CuPy allocates and launches (nothing for a NumPy array). Every op runs inside the scope of its
    inputs, so a model on cuda:1 computes on GPU 1 whichever device is current."""
    return array.device if on_gpu(array) else contextlib.nullcontext()


def to_device(array, device, dtype=None):
    """The array on `device` (any name parse_device takes), with `dtype` if given; copies only
    when it must."""
    device, source = parse_device(device), device_of(array)
    between_gpus = source.startswith("cuda:") and device.startswith("cuda:")  # CuPy copies those itself
    if source not in ("cpu", device) and not between_gpus:
        array = to_host(array)
    if device == "cpu":
        return np.asarray(array, dtype=dtype)
    if device == emulator.NAME:
        return emulator.xp.asarray(array, dtype=dtype)
    with cupy.cuda.Device(gpu_index(device)):
        return cupy.asarray(array, dtype=dtype)


def to_host(array):
    """A host (NumPy) array with the same values. Every call counts as one read (autograd/host_reads.py),
    whatever the array's device: a test on the CPU sees the reads that a run on a GPU would make."""
    host_reads.one_more()
    if on_gpu(array):
        return array.get()
    return np.asarray(array)


def erf(x):
    """The error function, elementwise. NumPy has none, so the CPU path goes through math.erf."""
    if get_array_module(x) is emulator.xp:
        return erf(x.view(np.ndarray)).view(emulator.EmulatedArray)
    if get_array_module(x) is not np:
        import cupyx.scipy.special

        return cupyx.scipy.special.erf(x)
    return np.asarray(np.frompyfunc(math.erf, 1, 1)(x), dtype=x.dtype)


# Scatter-add: rows added into a zero array at indices that may repeat (an embedding's
# gradient, the backward of x[ids]). NumPy's add.at adds one value after another, in their
# order, so it repeats bit for bit. CuPy's add.at adds with atomics, in an order that changes
# from run to run; float addition is not associative, so two GPU runs would differ in their last
# bits. There a sort fixes the order first.
def scatter_add(shape, index, values):
    """zeros(shape) with `values` (shaped like a[index]) added at [index], as np.add.at does: a
    position that the index names twice gets both values. Every run gives the same bits."""
    if get_array_module(values) is np:  # sequential, so repeatable; three times faster than sorting
        out = np.zeros(shape, values.dtype)
        np.add.at(out, index, values)
        return out
    return sorted_scatter_add(shape, index, values)


def sorted_scatter_add(shape, index, values):
    """scatter_add by segment_sum, in xp: what a GPU runs. An integer array picks whole rows of
    axis 0; any other index goes through the flat position of each entry (an array of `shape`)."""
    xp = get_array_module(values)
    if isinstance(index, xp.ndarray) and index.dtype.kind in "iu":
        rows = index.reshape(-1) % shape[0]  # negative indices count from the end
        return segment_sum(values.reshape(-1, *shape[1:]), rows, shape[0])
    size = math.prod(shape)
    positions = xp.arange(size).reshape(shape)[index]  # where each entry of `values` goes
    return segment_sum(values.reshape(-1), positions.reshape(-1), size).reshape(shape)


def segment_sum(values, segments, n_segments):
    """out[s] = the sum of the rows values[i] with segments[i] == s, for s in range(n_segments)
    (zero where there are none); values (n, ...), segments (n,) integers in [0, n_segments).

    The order of the additions depends on the segments alone. A stable sort puts each segment's
    rows side by side; then pass k adds to each row the row 2**k places before it if that one is
    of the same segment, so after ceil(log2 n) passes a segment's last row holds its sum. That is
    a tree ceil(log2 m) deep for m rows: an error of at most about ceil(log2 m) * 2**-24 * (the
    sum of the magnitudes) in float32, where np.add.at's one-after-another allows (m - 1) * 2**-24.
    """
    xp = get_array_module(values, segments)
    per_row = (-1,) + (1,) * (values.ndim - 1)  # a flag per row, broadcast over the row's entries
    if len(values) == 0:
        return xp.zeros((n_segments, *values.shape[1:]), values.dtype)
    order = xp.argsort(segments, kind="stable")
    segments, sums = segments[order], values[order]
    step = 1
    while step < len(sums):
        same = (segments[step:] == segments[:-step]).reshape(per_row)
        sums[step:] += xp.where(same, sums[:-step], 0)
        step *= 2
    every = xp.arange(n_segments)
    starts = xp.searchsorted(segments, every, side="left")
    ends = xp.searchsorted(segments, every, side="right")  # one past each segment's last row
    present = (ends > starts).reshape(per_row)
    return xp.where(present, sums[xp.maximum(ends - 1, 0)], 0)


# Names this module held before products and seeding had modules of their own: still importable here.
_MOVED = {name: "products" for name in ("matmul", "set_tf32", "tf32_asked", "tensor_cores")}
_MOVED.update({name: "random" for name in ("manual_seed", "default_generator")})


def __getattr__(name):
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"autograd.{_MOVED[name]}"), name)
