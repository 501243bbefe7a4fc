"""Hypothesis profiles, and the `device` parameter that runs a test on numpy and on cupy."""
import os

import pytest
from hypothesis import settings

from autograd.backend import cuda_available

settings.register_profile("ci", derandomize=True, deadline=None, max_examples=25, print_blob=True)
settings.register_profile("dev", deadline=None, max_examples=25)
settings.register_profile("thorough", deadline=None, max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_generate_tests(metafunc):
    """A test that takes `device` runs once on 'cpu' and once on 'cuda' (marked gpu)."""
    if "device" in metafunc.fixturenames:
        metafunc.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])


def pytest_collection_modifyitems(config, items):
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device with CuPy here (pip install 'tinygpt[cuda12]' on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
