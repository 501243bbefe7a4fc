"""What the launchers of autograd/kernels pass a kernel besides their arrays: grids, weights, counters."""

import functools
import threading

import numpy as np

from .. import backend, emulator

THREADS = 256  # threads per block of the elementwise kernels


def blocks(n):
    """Blocks of THREADS for a grid-stride loop over n items (capped: each thread takes several)."""
    return max(1, min(-(-n // THREADS), 65535))


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
