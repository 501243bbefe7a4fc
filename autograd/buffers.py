"""Large arrays reused from one training step to the next instead of fresh from the system.

A fresh array of megabytes comes from the kernel page by page, each page zeroed on first touch,
and malloc hands freed memory of that size back to the system (always above 32 MB, often below,
when it trims its heap): a training step's activations, logits and their gradients cost more
that way than the arithmetic on them (far more on a virtual machine). So empty(shape, dtype)
hands out arrays of at least MIN_BYTES from buffers kept here, each reused once nothing refers
to it any more. CPython counts references exactly, and every view of an array refers to the
buffer it lives in, so a buffer that only this module refers to is free.
"""

import sys
import threading

import numpy as np

MIN_BYTES = 1 << 20  # 1 MiB; smaller arrays come from malloc, which reuses freed memory itself
MAX_KEPT = 64  # buffers kept at most: a small GPT step uses some fifty

_kept = []  # raw uint8 arrays
_lock = threading.Lock()  # two graphs built on two threads at once must not take one buffer


def empty(shape, dtype, xp=np):
    """An uninitialised array, from a kept buffer when it is a large NumPy one."""
    dtype = np.dtype(dtype)
    size = dtype.itemsize
    for n in shape:
        size *= n
    if xp is not np or size < MIN_BYTES:
        return xp.empty(shape, dtype)
    with _lock:
        # the smallest free buffer that fits (free: referred to by _kept, by `raw` and by
        # getrefcount's argument), not more than twice the size asked for
        fits = [raw for raw in _kept if size <= raw.size <= 2 * size and sys.getrefcount(raw) == 3]
        if fits:
            return min(fits, key=len)[:size].view(dtype).reshape(shape)
        raw = np.empty(size, np.uint8)
        _kept.append(raw)
        if len(_kept) > MAX_KEPT:  # let go of a free one (or else the oldest: its user keeps it)
            _kept.pop(next((i for i, old in enumerate(_kept) if sys.getrefcount(old) == 3), 0))
        return raw.view(dtype).reshape(shape)
