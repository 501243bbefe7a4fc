"""Every differentiable op in autograd has a finite-difference gradient test."""

import autograd
import tests
from autograd.testing import assert_every_function_tested


def test_every_function_in_autograd_has_a_gradient_test():
    """Adding a Function to autograd without a @checks_gradient_of test makes this fail."""
    assert_every_function_tested(autograd, tests)
