"""The CUDA fast paths' plumbing: each source of autograd/kernels/cuda, with the shared header
common.cuh in front, compiled once per process and device by NVRTC and loaded as a CUDA module.

A source defines each kernel once as a template over the storage type (float, or bf16: bfloat16
as its 16 bits) and exports it as `<name>_f32` and `<name>_bf16`; `kernel` picks the one for an
array's dtype. Every source compiles under NVRTC in CI, where there is no GPU, with the options
used here (tests/autograd/test_cuda_sources.py).

The sources are compiled here rather than by cupy.RawModule, because CuPy appends -ftz=true to
the options of every compile it makes: subnormal floats would become zero, and the kernels would
no longer give their references' numbers (Adam's second moments go subnormal). NVRTC's own
default keeps them.
"""

import functools
import hashlib
import json  # a path as a C string literal: JSON escapes it the same way
import os
import threading
from pathlib import Path

import numpy as np

from .. import backend, emulated_gpu
from ..precision import bfloat16

SOURCES = Path(__file__).parent / "cuda"
OPTIONS = ("-std=c++17",)
THREADS = 256  # threads per block of the elementwise kernels
SUFFIXES = {np.dtype(np.float32): "f32", bfloat16: "bf16"}
CACHE = Path(os.environ.get("CUPY_CACHE_DIR", "~/.cupy/kernel_cache")).expanduser()  # CuPy's own
HEADERS = ("common.cuh", "partial_sums.cuh", "mma.cuh")  # in front of every source


@functools.cache  # the files do not change while the process runs; a launch on the emulator asks each time
def source(name):
    """The text NVRTC compiles for autograd/kernels/cuda/<name>.cu: the HEADERS, then the source, each after
    a #line with its absolute path, so that compilers' messages and gdb name each file and its own lines."""
    files = (*(SOURCES / header for header in HEADERS), SOURCES / f"{name}.cu")
    return "".join(f"#line 1 {json.dumps(str(file.absolute()))}\n{file.read_text()}\n" for file in files)


def compile_source(name, arch, text=None):
    """autograd/kernels/cuda/<name>.cu (or `text`, under that name) compiled by NVRTC with OPTIONS for
    `arch`: PTX for a virtual architecture ("compute_90"), a binary for a real one ("sm_90")."""
    from cupy_backends.cuda.libs import nvrtc

    program = nvrtc.createProgram(source(name) if text is None else text, f"{name}.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(program, [f"--gpu-architecture={arch}", *OPTIONS])
        except nvrtc.NVRTCError as error:
            raise RuntimeError(f"{name}.cu does not compile:\n{nvrtc.getProgramLog(program)}") from error
        return nvrtc.getCUBIN(program) if arch.startswith("sm_") else nvrtc.getPTX(program)
    finally:
        nvrtc.destroyProgram(program)


@functools.cache
def module(name, device_id):
    """The module of a source on one device: a binary for the device's architecture where NVRTC
    knows it, else PTX for the newest one it knows, which the driver compiles on loading."""
    from cupy_backends.cuda.libs import nvrtc

    cupy = backend.cupy
    with cupy.cuda.Device(device_id) as device:
        capability = int(device.compute_capability)
        known = nvrtc.getSupportedArchs()
        arch = f"sm_{capability}" if capability in known else f"compute_{max(known)}"
        loaded = cupy.cuda.Module()
        loaded.load(cached_compile(name, arch, nvrtc.getVersion()))
    return loaded


def cached_compile(name, arch, nvrtc_version):
    """compile_source, kept on disk in CuPy's kernel cache folder under a hash of the source, the
    options, the architecture and NVRTC's version (the attention source takes seconds to compile).
    A folder that cannot be written only means compiling again next time."""
    key = repr((source(name), OPTIONS, arch, nvrtc_version)).encode()
    path = CACHE / f"autograd-{name}-{hashlib.sha256(key).hexdigest()[:32]}.bin"
    if path.is_file():
        return path.read_bytes()
    binary = compile_source(name, arch)
    try:
        CACHE.mkdir(parents=True, exist_ok=True)
        write_whole(path, binary)
    except OSError:
        pass
    return binary


def write_whole(path, data):
    """Write bytes or text to `path` (a Path) whole or not at all, through a .partial-<pid> file:
    another process may read it at the same time."""
    partial = path.with_name(f"{path.name}.partial-{os.getpid()}")
    if isinstance(data, bytes):
        partial.write_bytes(data)
    else:
        partial.write_text(data)
    partial.replace(path)


def kernel(name, function, dtype):
    """The kernel `function` of autograd/kernels/cuda/<name>.cu for arrays of `dtype`, on the
    current device: an op runs with its arrays' device current (backend.device_scope), the
    emulated one's included."""
    if np.dtype(dtype) not in SUFFIXES:
        raise TypeError(f"{name}.{function}: the CUDA path takes float32 or bfloat16, not {dtype}")
    if emulated_gpu.current():  # the same source, built for the CPU
        from . import emulated

        return emulated.kernel(name, function, dtype)
    device = backend.cupy.cuda.Device().id
    return module(name, device).get_function(f"{function}_{SUFFIXES[np.dtype(dtype)]}")


def float32_or_null(xp, array):
    """A weight or bias as the kernels read it, float32 (a bfloat16 one widened, as the references'
    float32 math reads it), or a null pointer where there is none."""
    return np.uintp(0) if array is None else xp.ascontiguousarray(array, dtype=np.float32)


def counters(xp, n):
    """n uint32 counters at 0 on the current device, for a kernel whose blocks count their arrivals
    (partial_sums.cuh): the last block to arrive sets its counter back to 0, so the same counters
    serve each launch of a stream after another. Kept per device, stream, host thread (CuPy's
    per-thread default streams share one handle) and n."""
    thread = threading.get_ident()
    if emulated_gpu.current():
        return _counters(xp, emulated_gpu.NAME, 0, thread, n)
    cuda = backend.cupy.cuda
    return _counters(xp, cuda.Device().id, cuda.get_current_stream().ptr, thread, n)


@functools.lru_cache(maxsize=64)
def _counters(xp, device, stream, thread, n):
    return xp.zeros(n, np.uint32)


def blocks(n):
    """Blocks of THREADS for a grid-stride loop over n items (capped: each thread takes several)."""
    return max(1, min(-(-n // THREADS), 65535))
