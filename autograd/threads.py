"""The CPU's cores for NumPy work cut into independent pieces.

NumPy lets go of the GIL inside its loops and its BLAS calls, so pieces handed to different
threads run at the same time. autograd shares out among the cores both its elementwise work,
which NumPy does on one core, and its matrix products, each piece with BLAS at one thread: BLAS's
own threads keep spinning for a while after each product, taking the cores from the elementwise
work that follows, and a small product split over BLAS's threads waits for all of them each time
(slow, and very slow when another process takes a core). The BLAS libraries loaded with numpy are
told to use one thread while such pieces run, through threadpoolctl; where it finds none it can
set, pieces that multiply run one after another, with BLAS as it is.

The number of threads is set_num_threads(n); by default OMP_NUM_THREADS or OPENBLAS_NUM_THREADS
where set, else the number of cores.
"""

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from threadpoolctl import ThreadpoolController

from . import buffers
from .backend import get_array_module


def _default_threads():
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        if os.environ.get(name, "").isdigit() and int(os.environ[name]) > 0:
            return int(os.environ[name])
    return os.cpu_count() or 1


def _blas_libraries():
    """threadpoolctl's controllers of the BLAS libraries loaded so far (numpy's among them), or
    None where it finds none it can set."""
    return ThreadpoolController().select(user_api="blas").lib_controllers or None


BLOCK = 1 << 18  # numbers in a piece of elementwise work: enough to keep a thread busy for a
# while, few enough that a piece's several passes stay in the core's cache


def blocks(n, size, xp=np):
    """Slices that cut n items of `size` numbers each into pieces of about BLOCK numbers. A GPU
    (xp other than numpy) gets one piece: it wants its work in few, large launches."""
    step = max(1, BLOCK // max(size, 1)) if xp is np else max(1, n)
    return [slice(start, start + step) for start in range(0, n, step)]


def split(n, xp=np):
    """Slices that cut n items into one run per thread (a GPU: one run for all)."""
    k = min(_threads, n) if xp is np else 1
    return [slice(i * n // k, (i + 1) * n // k) for i in range(k)]


_threads = _default_threads()
_blas = _blas_libraries()
_pool, _pool_pid = None, None
_inside = threading.local()  # .piece: this thread is running a piece


def set_num_threads(n):
    """Use n threads (1: everything on the calling thread)."""
    global _threads, _pool
    if int(n) < 1:
        raise ValueError(f"set_num_threads: need at least 1 thread, got {n}")
    _threads = int(n)
    if _pool is not None:
        _pool.shutdown()
        _pool = None


def get_num_threads():
    return _threads


def _get_pool():
    """The worker threads (one fewer than _threads: the caller works too); a new pool after a
    fork, whose child has none of its parent's threads."""
    global _pool, _pool_pid
    if _pool is None or _pool_pid != os.getpid():
        _pool, _pool_pid = ThreadPoolExecutor(_threads - 1, thread_name_prefix="autograd"), os.getpid()
    return _pool


def for_each(work, pieces, multiplies=False):
    """work(piece) for every piece, the pieces shared out among the threads; returns once all are
    done. `multiplies`: the work calls BLAS, so it runs with BLAS at one thread, or, where that
    cannot be set, one piece after another on this thread with BLAS as it is."""
    n = min(_threads, len(pieces))
    if multiplies and _blas is None:
        n = 1  # products on several threads at once would each want all of BLAS's threads
    if getattr(_inside, "piece", False):
        n = 1  # the pieces of a piece: the pool's threads are busy with its siblings
    # BLAS at one thread through each library's own get and set: 2 us a call, where threadpoolctl's
    # `with controller.limit(limits=1)` takes 5.5 (some 5% of the training step of a 32-token toy model)
    blas = _blas if multiplies and _blas else []
    before = [lib.num_threads for lib in blas]
    for lib in blas:
        lib.set_num_threads(1)
    try:
        groups = [pieces[i::n] for i in range(n)]  # interleaved: neighbouring pieces cost alike
        futures = [_get_pool().submit(_each, work, group) for group in groups[1:]]
        try:
            _each(work, groups[0] if groups else [])
        finally:
            for future in futures:
                future.result()
    finally:
        for lib, threads in zip(blas, before):
            lib.set_num_threads(threads)


def _each(work, pieces):
    outer, _inside.piece = getattr(_inside, "piece", False), True
    try:
        for piece in pieces:
            work(piece)
    finally:
        _inside.piece = outer


def matmul(a, b, bias=None):
    """a @ b (+ bias) for 2-D arrays. A large product is cut along the rows of a, one run per
    thread with BLAS at one thread (see above), and the bias is added to each run while it is
    still in cache."""
    xp = get_array_module(a)
    pieces = split(a.shape[0], xp)
    if len(pieces) < 2 or a.shape[0] * a.shape[1] * b.shape[1] < 1 << 22:
        pieces = [slice(None)]  # too small to be worth the threads' wake-up
    out = buffers.empty((a.shape[0], b.shape[1]), xp.result_type(a, b), xp)

    def multiply(rows):
        xp.matmul(a[rows], b, out=out[rows])
        if bias is not None:
            out[rows] += bias

    for_each(multiply, pieces, multiplies=True)
    return out
