"""What the tests share: strategies for shapes and values, tensor builders, the gradient registry."""

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import autograd as ag

# Functions whose gradients a test checks; test_registry fails on any Function missing here.
GRADIENT_TESTED = set()


def checks_gradient_of(*functions):
    """Mark a test as the finite-difference gradient test of these Function classes."""
    GRADIENT_TESTED.update(functions)
    return lambda test: test


def shapes(min_dims=0, max_dims=3, min_side=1, max_side=4):
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


def arrays(shape, low=-3.0, high=3.0, dtype=np.float64):
    """Arrays of `shape` (a shape or a strategy for one) with finite values in [low, high]."""
    elements = st.floats(low, high, allow_nan=False, allow_infinity=False, width=np.dtype(dtype).itemsize * 8)
    return hnp.arrays(dtype, shape, elements=elements)


def away_from_zero(shape, low=0.5, high=3.0):
    """Arrays whose entries have magnitude in [low, high], either sign (safe denominators)."""
    if isinstance(shape, st.SearchStrategy):
        return shape.flatmap(lambda s: away_from_zero(s, low, high))
    return st.tuples(arrays(shape, low, high), hnp.arrays(np.bool_, shape)).map(
        lambda p: np.where(p[1], p[0], -p[0])
    )


def leaf(array, device, requires_grad=True):
    """A float64 leaf tensor on `device` holding `array`."""
    return ag.tensor(array, requires_grad=requires_grad, dtype=np.float64, device=device)
