"""The CUDA fast paths' kernels: a source of autograd/kernels/cuda, or a user's op's CUDA code (a
CudaSource), its text (autograd/kernels/compiling.py) compiled once per process and device: by NVRTC and
loaded as a CUDA module on a GPU, by g++ on the emulated device. `kernel` gives a launcher the one a
source exports for its arrays' dtype."""

import functools
from pathlib import Path

import numpy as np

from .. import backend, emulator
from ..emulator import kernels as emulator_kernels
from . import compiling


class CudaSource:
    """CUDA code of a user's op, compiled as the project's sources are (the HEADERS in front, OPTIONS) once
    per process and device, and kept on disk. Its kernels are called as CuPy's RawKernel: on the emulated
    device they are the emulator's (autograd/emulator/kernels.py); on a GPU each launch is checked first
    (argument_problems) unless `checked` is False (the project's own: CI checks them on the emulator).

        CudaSource(text, name="swish").kernel("swish_forward")((blocks,), (256,), (x, y, np.int64(x.size)))
    """

    def __init__(self, text, name="source", path=None, checked=True):
        self.name, self.text, self.checked = name, compiling.headed(text, path or f"{name}.cu"), checked

    @classmethod
    def from_file(cls, path, checked=True):
        """The code of a file (a str or a Path), named by its stem: compilers and gdb name the file."""
        path = Path(path).absolute()
        return cls(path.read_text(), path.stem, path, checked)

    def kernel(self, function, dtype=None):
        """The extern "C" __global__ `function` on the current device; given a dtype, the one exported for
        it as f"{function}_f32" or "_bf16" (compiling.exported), as the project's sources export theirs."""
        function = function if dtype is None else compiling.exported(self.name, function, dtype)
        if emulator.current():  # the same text, built for the CPU
            return emulator_kernels.build(self.text, self.name).kernel(function)
        try:
            device = backend.cupy.cuda.Device().id
        except (AttributeError, RuntimeError) as error:  # no CuPy, or no GPU
            raise RuntimeError(
                f"{self.name}.{function}: no CUDA device is current: an op makes its arrays' current; "
                "elsewhere, launch inside `with autograd.backend.device_scope(array):` (for any GPU array)"
            ) from error
        return gpu_kernel(self, function, device)


def kernel(name, function, dtype):
    """The kernel `function` of autograd/kernels/cuda/<name>.cu for arrays of `dtype`, on the current
    device: an op runs with its arrays' device current (backend.device_scope), the emulated one's included."""
    return source(name).kernel(function, dtype)


@functools.cache  # the files do not change while the process runs; a launch asks each time
def source(name):
    """autograd/kernels/cuda/<name>.cu, its launches unchecked."""
    return CudaSource.from_file(compiling.SOURCES / f"{name}.cu", checked=False)


@functools.cache
def gpu_kernel(source, function, device):
    """A CudaSource's kernel on a GPU: CuPy's Function, behind argument checks where the source is checked."""
    get_function = module(source.text, source.name, device).get_function
    if not source.checked:
        return get_function(function)
    arch = "compute_" + architecture(device).split("_")[1]
    entries = compiling.ptx_entries(compiling.cached(source.text, source.name, arch).decode())
    if function not in entries:
        raise ValueError(f"{source.name}.cu has no kernel {function} (it has {', '.join(entries)})")
    launch, params = get_function(function), entries[function]

    def checked(grid, block, args, shared_mem=0, **options):
        problems = argument_problems(params, args := tuple(args), backend.cupy.ndarray, device)
        if problems:
            raise TypeError(f"{function}: " + "; ".join(problems))
        launch(grid, block, args, shared_mem=shared_mem, **options)

    return checked


def architecture(device_id):
    """What NVRTC compiles for a device: a binary for its architecture where NVRTC knows it, else PTX
    for the newest one it knows, which the driver compiles on loading."""
    from cupy_backends.cuda.libs import nvrtc

    capability = int(backend.cupy.cuda.Device(device_id).compute_capability)
    known = nvrtc.getSupportedArchs()
    return f"sm_{capability}" if capability in known else f"compute_{max(known)}"


@functools.cache
def module(text, name, device_id):
    """The CUDA module of a source's text (named `name`) on one device."""
    cupy = backend.cupy
    with cupy.cuda.Device(device_id):
        cuda_module = cupy.cuda.Module()
        cuda_module.load(compiling.cached(text, name, architecture(device_id)))
    return cuda_module


def argument_problems(params, args, arrays=np.ndarray, device=None):
    """Why `args` do not fit a kernel's PTX parameters `params` (ptx_entries), in the emulator's words: their
    count; an array (of `arrays`, on `device` where given) only for a 64-bit integer (a pointer), NumPy
    scalars of the width and kind of the others. What a pointer points at, the PTX does not say."""
    problems = [f"{len(args)} arguments for {len(params)} parameters"] if len(args) != len(params) else []
    for i, (arg, (ptx, width)) in enumerate(zip(args, params)):
        if not isinstance(arg, (arrays, np.ndarray)):
            problem = emulator_kernels.argument_problem(arg, f"v{'f' if ptx[1] == 'f' else 'i'}{width}")
        elif ptx[1] == "f" or ptx[2:] != "64":
            problem = f"an array for the value {ptx}"
        else:  # a host array for a GPU's kernel, or one of another GPU
            on_device = isinstance(arg, arrays) and (device is None or arg.device.id == device)
            problem = None if on_device else f"an array not on the kernel's device {device}"
        problems += [f"argument {i}: {problem}"] if problem else []
    return problems
