"""TF32 in the tests. Where the process set CUPY_TF32=1, or inside a tf32 block, a GPU's float32
products of two matrices (CuPy's, and the emulated device's as CuPy's) read their inputs rounded
to TF32, 10 mantissa bits. A reference must not inherit the precision under test: it is computed
on the host or with TF32 `off`, and a result made with TF32 products is held to TF32's `tolerance`."""

import contextlib

import numpy as np

from autograd import emulator, products

# The error of a TF32 product: each input rounded by 2**-11 at most, so 2**-10 of the sum of the
# terms' sizes; four times that leaves room for float32's sums and for errors carried on.
RELATIVE_ERROR = 2.0**-8


def linalgs(device):
    """The routines that hold the compute type of `device`'s float32 products (none on the CPU)."""
    if device == emulator.NAME:
        return [emulator.Linalg]
    return [products._linalg()] if device.startswith("cuda") else []


def on(device):
    """True where `device`'s float32 matrix products run in TF32 now."""
    return any(linalg.get_compute_type(np.float32) == linalg.COMPUTE_TYPE_TF32 for linalg in linalgs(device))


@contextlib.contextmanager
def off(device):
    """A block in which `device`'s float32 products are float32's, whatever the process asked for."""
    before = [(linalg, linalg.get_compute_type(np.float32)) for linalg in linalgs(device)]
    for linalg, _ in before:
        linalg.set_compute_type(np.float32, linalg.COMPUTE_TYPE_DEFAULT)
    try:
        yield
    finally:
        for linalg, compute_type in before:
            linalg.set_compute_type(np.float32, compute_type)


def tolerance(device, rtol, atol, scale=1.0):
    """assert_allclose's rtol and atol for a float32 result of `device`: those given, and where its
    products run in TF32, an atol of at least RELATIVE_ERROR of `scale`, the size of the largest
    terms summed into an entry (a cancellation leaves a small entry the error of large terms)."""
    return dict(rtol=rtol, atol=max(atol, RELATIVE_ERROR * scale) if on(device) else atol)
