"""The CUDA fast paths' plumbing: each source of autograd/kernels/cuda, with the shared headers
(HEADERS) in front, compiled once per process and device by NVRTC and loaded as a CUDA module.

A source defines each kernel once as a template over the storage type (float, or bf16: bfloat16
as its 16 bits) and exports it as `<name>_f32` and `<name>_bf16`; `kernel` picks the one for an
array's dtype. Every source compiles under NVRTC in CI, where there is no GPU, with the options
used here (tests/autograd/test_cuda_sources.py). A user's op brings CUDA code of its own the same
way, as a CudaSource.

The sources are compiled here rather than by cupy.RawModule, because CuPy appends -ftz=true to
the options of every compile it makes: subnormal floats would become zero, and the kernels would
no longer give their references' numbers (Adam's second moments go subnormal). NVRTC's own
default keeps them.
"""

import functools
import hashlib
import json  # a path as a C string literal: JSON escapes it the same way
import os
import re
import threading
from pathlib import Path

import numpy as np

from .. import backend, emulator
from ..precision import bfloat16

SOURCES = (Path(__file__).parent / "cuda").absolute()
OPTIONS = ("-std=c++17",)
THREADS = 256  # threads per block of the elementwise kernels
SUFFIXES = {np.dtype(np.float32): "f32", bfloat16: "bf16"}
CACHE = Path(os.environ.get("CUPY_CACHE_DIR", "~/.cupy/kernel_cache")).expanduser()  # CuPy's own
HEADERS = ("common.cuh", "partial_sums.cuh", "mma.cuh")  # in front of every source


class CudaSource:
    """CUDA code of a user's op, compiled as the project's sources are (the HEADERS in front, OPTIONS) once
    per process and device, and kept on disk. Its kernels are called as CuPy's RawKernel: on the emulated
    device they are the emulator's (autograd/emulator/kernels.py); on a GPU each launch is checked first
    (argument_problems) unless `checked` is False (the project's own: CI checks them on the emulator).

        CudaSource(text, name="swish").kernel("swish_forward")((blocks,), (256,), (x, y, np.int64(x.size)))
    """

    def __init__(self, text, name="source", path=None, checked=True):
        self.name, self.text, self.checked = name, headed(text, path or f"{name}.cu"), checked

    @classmethod
    def from_file(cls, path, checked=True):
        """The code of a file (a str or a Path), named by its stem: compilers and gdb name the file."""
        path = Path(path).absolute()
        return cls(path.read_text(), path.stem, path, checked)

    def kernel(self, function, dtype=None):
        """The extern "C" __global__ `function` on the current device; given a dtype, the one exported for
        it as f"{function}_f32" or "_bf16" (SUFFIXES), as the project's sources export theirs."""
        function = function if dtype is None else exported(self.name, function, dtype)
        if emulator.current():  # the same text, built for the CPU
            from ..emulator import kernels as emulator_kernels

            return emulator_kernels.build(self.text, self.name).kernel(function)
        try:
            device = backend.cupy.cuda.Device().id
        except (AttributeError, RuntimeError) as error:  # no CuPy, or no GPU
            raise RuntimeError(
                f"{self.name}.{function}: no CUDA device is current: an op makes its arrays' current; "
                "elsewhere, launch inside `with autograd.backend.device_scope(array):` (for any GPU array)"
            ) from error
        return loaded(self, function, device)


@functools.cache
def loaded(source, function, device):
    """A CudaSource's kernel on a GPU: CuPy's Function, behind argument checks where the source is checked."""
    get_function = module(source.text, source.name, device).get_function
    if not source.checked:
        return get_function(function)
    arch = "compute_" + architecture(device).split("_")[1]
    entries = ptx_entries(cached_compile(source.text, source.name, arch).decode())
    if function not in entries:
        raise ValueError(f"{source.name}.cu has no kernel {function} (it has {', '.join(entries)})")
    launch, params = get_function(function), entries[function]

    def checked(grid, block, args, shared_mem=0, **options):
        problems = argument_problems(params, args := tuple(args), backend.cupy.ndarray, device)
        if problems:
            raise TypeError(f"{function}: " + "; ".join(problems))
        launch(grid, block, args, shared_mem=shared_mem, **options)

    return checked


@functools.cache  # the files do not change while the process runs; a launch asks each time
def own(name):
    """autograd/kernels/cuda/<name>.cu."""
    return CudaSource.from_file(SOURCES / f"{name}.cu", checked=False)


def source(name):
    """The text NVRTC compiles for autograd/kernels/cuda/<name>.cu."""
    return own(name).text


def headed(code, path):
    """`code` as NVRTC compiles it: the HEADERS, then the code, each after a #line naming its file (`path`
    for the code), so that compilers' messages and gdb name each file and its own lines."""
    parts = [(SOURCES / header, (SOURCES / header).read_text()) for header in HEADERS] + [(path, code)]
    return "".join(f"#line 1 {json.dumps(str(file))}\n{text}\n" for file, text in parts)


def exported(name, function, dtype):
    """The name a source exports `function` under for arrays of `dtype`."""
    dtype = np.dtype(dtype)
    if dtype not in SUFFIXES:
        raise TypeError(f"{name}.{function}: the CUDA path takes float32 or bfloat16, not {dtype}")
    return f"{function}_{SUFFIXES[dtype]}"


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


def architecture(device_id):
    """What NVRTC compiles for a device: a binary for its architecture where NVRTC knows it, else PTX
    for the newest one it knows, which the driver compiles on loading."""
    from cupy_backends.cuda.libs import nvrtc

    capability = int(backend.cupy.cuda.Device(device_id).compute_capability)
    known = nvrtc.getSupportedArchs()
    return f"sm_{capability}" if capability in known else f"compute_{max(known)}"


@functools.cache
def module(text, name, device_id):
    """The module of a source's text (named `name`) on one device."""
    cupy = backend.cupy
    with cupy.cuda.Device(device_id):
        loaded = cupy.cuda.Module()
        loaded.load(cached_compile(text, name, architecture(device_id)))
    return loaded


def cached_compile(text, name, arch):
    """compile_source, kept on disk in CuPy's kernel cache folder under a hash of the text, the
    options, the architecture and NVRTC's version (the attention source takes seconds to compile).
    A folder that cannot be written only means compiling again next time."""
    from cupy_backends.cuda.libs import nvrtc

    key = repr((text, OPTIONS, arch, nvrtc.getVersion())).encode()
    path = CACHE / f"autograd-{name}-{hashlib.sha256(key).hexdigest()[:32]}.bin"
    if path.is_file():
        return path.read_bytes()
    binary = compile_source(name, arch, text)
    try:
        CACHE.mkdir(parents=True, exist_ok=True)
        write_whole(path, binary)
    except OSError:
        pass
    return binary


def ptx_entries(ptx):
    """{kernel: [(PTX type, width in bytes) of each parameter]} of the .entry functions of a PTX text; a
    struct passed by value is `.param .align N .b8 name[K]`: K bytes."""
    param = r"\.param\s+(?:\.align\s+\d+\s+)?\.([busf])(\d+)[^,\[]*(?:\[(\d+)\])?"
    entries = re.findall(r"\.entry\s+(\w+)\s*\(([^)]*)\)", ptx)
    return {
        name: [(f".{k}{b}", int(b) // 8 * int(n or 1)) for k, b, n in re.findall(param, p)]
        for name, p in entries
    }


def argument_problems(params, args, arrays=np.ndarray, device=None):
    """Why `args` do not fit a kernel's PTX parameters `params` (ptx_entries), in the emulator's words: their
    count; an array (of `arrays`, on `device` where given) only for a 64-bit integer (a pointer), NumPy
    scalars of the width and kind of the others. What a pointer points at, the PTX does not say."""
    from ..emulator.kernels import argument_problem

    problems = [f"{len(args)} arguments for {len(params)} parameters"] if len(args) != len(params) else []
    for i, (arg, (ptx, width)) in enumerate(zip(args, params)):
        if not isinstance(arg, (arrays, np.ndarray)):
            problem = argument_problem(arg, f"v{'f' if ptx[1] == 'f' else 'i'}{width}")
        elif ptx[1] == "f" or ptx[2:] != "64":
            problem = f"an array for the value {ptx}"
        else:  # a host array for a GPU's kernel, or one of another GPU
            on_device = isinstance(arg, arrays) and (device is None or arg.device.id == device)
            problem = None if on_device else f"an array not on the kernel's device {device}"
        problems += [f"argument {i}: {problem}"] if problem else []
    return problems


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
    return own(name).kernel(function, dtype)


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
    if emulator.current():
        return _counters(xp, emulator.NAME, 0, thread, n)
    cuda = backend.cupy.cuda
    return _counters(xp, cuda.Device().id, cuda.get_current_stream().ptr, thread, n)


@functools.lru_cache(maxsize=64)
def _counters(xp, device, stream, thread, n):
    return xp.zeros(n, np.uint32)


def blocks(n):
    """Blocks of THREADS for a grid-stride loop over n items (capped: each thread takes several)."""
    return max(1, min(-(-n // THREADS), 65535))
