"""The CUDA fast paths' plumbing: each source of autograd/kernels/cuda, with the shared header
common.cuh in front, compiled once per process and device through cupy.RawModule.

A source defines each kernel once as a template over the storage type (float, or bf16: bfloat16
as its 16 bits) and exports it as `<name>_f32` and `<name>_bf16`; `kernel` picks the one for an
array's dtype. Every source compiles under NVRTC in CI, where there is no GPU
(tests/autograd/test_cuda_sources.py).
"""

import functools
from pathlib import Path

import numpy as np

from .. import backend
from ..precision import bfloat16

SOURCES = Path(__file__).parent / "cuda"
OPTIONS = ("-std=c++17",)
THREADS = 256  # threads per block of the elementwise kernels
SUFFIXES = {np.dtype(np.float32): "f32", bfloat16: "bf16"}


def source(name):
    """The text NVRTC compiles for autograd/kernels/cuda/<name>.cu: common.cuh, then the source."""
    return (SOURCES / "common.cuh").read_text() + "\n" + (SOURCES / f"{name}.cu").read_text()


@functools.cache
def module(name, device_id):
    """The compiled module of a source on one device (CuPy also caches the binary on disk)."""
    return backend.cupy.RawModule(code=source(name), options=OPTIONS)


def kernel(name, function, dtype):
    """The kernel `function` of autograd/kernels/cuda/<name>.cu for arrays of `dtype`."""
    if np.dtype(dtype) not in SUFFIXES:
        raise TypeError(f"{name}.{function}: the CUDA path takes float32 or bfloat16, not {dtype}")
    device = backend.cupy.cuda.Device().id
    return module(name, device).get_function(f"{function}_{SUFFIXES[np.dtype(dtype)]}")


def blocks(n):
    """Blocks of THREADS for a grid-stride loop over n items (capped: each thread takes several)."""
    return max(1, min(-(-n // THREADS), 65535))
