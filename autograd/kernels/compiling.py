"""What a GPU and the emulated device both take of a CUDA source: its text (the shared HEADERS in front),
the names it exports (each kernel is a template over the storage type, float or bf16: bfloat16 as its 16
bits, exported as `<name>_f32` and `<name>_bf16`), and NVRTC's compile of it, which every source passes in
CI, where there is no GPU (tests/autograd/test_cuda_sources.py). NVRTC is called here rather than through
cupy.RawModule, which appends -ftz=true to the options of every compile: subnormal floats would become
zero (Adam's second moments go subnormal), and the kernels would no longer give their references' numbers."""

import functools
import hashlib
import json  # a path as a C string literal: JSON escapes it the same way
import os
import re
from pathlib import Path

import numpy as np

from ..precision import bfloat16

SOURCES = (Path(__file__).parent / "cuda").absolute()
HEADERS = ("common.cuh", "partial_sums.cuh", "mma.cuh")  # in front of every source
OPTIONS = ("-std=c++17",)
SUFFIXES = {np.dtype(np.float32): "f32", bfloat16: "bf16"}
CACHE = Path(os.environ.get("CUPY_CACHE_DIR", "~/.cupy/kernel_cache")).expanduser()  # CuPy's own


@functools.cache  # the files do not change while the process runs; a launch asks each time
def text(name):
    """The text NVRTC and g++ compile for autograd/kernels/cuda/<name>.cu."""
    path = SOURCES / f"{name}.cu"
    return headed(path.read_text(), path)


def headed(code, path):
    """`code` as NVRTC compiles it: the HEADERS, then the code, each after a #line naming its file (`path`
    for the code), so that compilers' messages and gdb name each file and its own lines."""
    parts = [(SOURCES / header, (SOURCES / header).read_text()) for header in HEADERS] + [(path, code)]
    return "".join(f"#line 1 {json.dumps(str(file))}\n{part}\n" for file, part in parts)


def exported(name, function, dtype):
    """The name a source exports `function` under for arrays of `dtype`."""
    dtype = np.dtype(dtype)
    if dtype not in SUFFIXES:
        raise TypeError(f"{name}.{function}: the CUDA path takes float32 or bfloat16, not {dtype}")
    return f"{function}_{SUFFIXES[dtype]}"


def compiled(text, name, arch):
    """`text` (named `name`) compiled by NVRTC with OPTIONS for `arch`: PTX for a virtual architecture
    ("compute_90"), a binary for a real one ("sm_90")."""
    from cupy_backends.cuda.libs import nvrtc

    program = nvrtc.createProgram(text, f"{name}.cu", [], [])
    try:
        nvrtc.compileProgram(program, [f"--gpu-architecture={arch}", *OPTIONS])
        return nvrtc.getCUBIN(program) if arch.startswith("sm_") else nvrtc.getPTX(program)
    except nvrtc.NVRTCError as error:
        raise RuntimeError(f"{name}.cu does not compile:\n{nvrtc.getProgramLog(program)}") from error
    finally:
        nvrtc.destroyProgram(program)


def cached(text, name, arch):
    """`compiled`, kept on disk in CuPy's kernel cache folder under a hash of the text, the options, the
    architecture and NVRTC's version (the attention source takes seconds to compile). A folder that
    cannot be written only means compiling again next time."""
    from cupy_backends.cuda.libs import nvrtc

    key = repr((text, OPTIONS, arch, nvrtc.getVersion())).encode()
    path = CACHE / f"autograd-{name}-{hashlib.sha256(key).hexdigest()[:32]}.bin"
    if path.is_file():
        return path.read_bytes()
    binary = compiled(text, name, arch)
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


def write_whole(path, data):
    """Write bytes or text (as UTF-8) to `path` (a Path) whole or not at all, through a .partial-<pid>
    file: another process may read it at the same time."""
    partial = path.with_name(f"{path.name}.partial-{os.getpid()}")
    partial.write_bytes(data if isinstance(data, bytes) else data.encode())
    partial.replace(path)
