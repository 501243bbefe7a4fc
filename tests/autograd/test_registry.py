"""Every differentiable op in autograd has a finite-difference gradient test."""

import importlib
import pkgutil

import autograd
import tests
from autograd import Function
from tests.helpers import GRADIENT_TESTED


def _import_all(package):
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(module.name)


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_function_in_autograd_has_a_gradient_test():
    """Adding a Function to autograd without a @checks_gradient_of test makes this fail."""
    _import_all(autograd)
    _import_all(tests)
    functions = {f for f in _subclasses(Function) if f.__module__.startswith("autograd.")}
    assert functions, "found no Function subclasses in autograd"
    missing = sorted(f"{f.__module__}.{f.__qualname__}" for f in functions - GRADIENT_TESTED)
    assert not missing, f"no gradient test for: {', '.join(missing)}"
