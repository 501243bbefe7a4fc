"""autograd.buffers: large arrays handed out again once nothing refers to them."""

import numpy as np
import pytest

from autograd import buffers

BIG = (buffers.MIN_BYTES // 4 + 1,)  # float32 numbers: just above the size that is kept


def test_a_freed_buffer_is_reused():
    a = buffers.empty(BIG, np.float32)
    kept = len(buffers._kept)
    del a
    b = buffers.empty(BIG, np.float32)
    assert len(buffers._kept) == kept and any(b.base is raw for raw in buffers._kept)


@pytest.mark.parametrize("keep", ["the array", "a view of it", "a reshaped copy's source"])
def test_a_buffer_still_referred_to_is_not_handed_out(keep):
    a = buffers.empty(BIG, np.float32)
    a[:] = 1
    held = {"the array": a, "a view of it": a[10:], "a reshaped copy's source": a.reshape(-1, 1)}[keep]
    del a
    b = buffers.empty(BIG, np.float32)
    b[:] = 2
    assert (held == 1).all()


def test_small_arrays_and_other_shapes_and_dtypes():
    small = buffers.empty((3, 4), np.float64)
    assert small.shape == (3, 4) and small.dtype == np.float64
    a = buffers.empty((2,) + BIG, np.float64)
    assert a.shape == (2,) + BIG and a.dtype == np.float64 and a.flags.c_contiguous and a.flags.writeable


def test_an_array_of_another_module_is_left_to_it():
    class Module:
        @staticmethod
        def empty(shape, dtype):
            return ("made by the module", shape, dtype)

    assert buffers.empty(BIG, np.float32, Module)[0] == "made by the module"
