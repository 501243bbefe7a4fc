"""Every differentiable op in autograd has a finite-difference gradient test, and every fast path a
test that compares it with its op's reference."""

import autograd
import tests
from autograd import functional as F
from autograd.testing import assert_every_function_tested, functions_of


def test_every_function_in_autograd_has_a_gradient_test():
    """Adding a Function to autograd without a @checks_gradient_of test makes this fail."""
    assert_every_function_tested(autograd, tests)


def test_every_fast_path_in_autograd_is_compared_with_its_reference():
    """A Function given forward_cpu or forward_gpu without a @checks_fast_path_of test makes this fail."""
    assert {F.Linear, F.GELU, F.MultiHeadAttention} <= {f for f in functions_of(autograd) if f.forward_gpu}
    assert_every_function_tested(autograd, tests, "fast path")
