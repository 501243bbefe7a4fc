"""Hypothesis profiles, the `device` parameter that runs a test on the CPU, on the emulated CUDA
device and on a GPU, `gpu_device` for a test of the GPU path alone, and the `each_path` fixture that
runs a test on the ops' fast paths and on their reference paths (autograd.testing's)."""

import os

# Under pytest-xdist (-n auto) a worker runs on each core: each keeps to one thread, for BLAS and for
# autograd's pieces, rather than all of them spinning threads on every core. Before numpy loads BLAS.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from autograd.backend import cuda_available  # noqa: E402
from autograd.testing import each_path  # noqa: E402, F401 (a fixture: the tests' modules take it by name)

# each_path holds for the whole test, every example included: a function-scoped fixture is safe
PROFILE = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
settings.register_profile("ci", derandomize=True, max_examples=25, print_blob=True, **PROFILE)
settings.register_profile("dev", max_examples=25, **PROFILE)
settings.register_profile("thorough", max_examples=500, **PROFILE)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


GPUS = ["cuda-emulated", pytest.param("cuda", marks=pytest.mark.gpu)]  # the CUDA kernels run on both


def pytest_generate_tests(metafunc):
    """A test that takes `device` runs on 'cpu', on 'cuda-emulated' (the CUDA kernels run on the
    CPU) and on 'cuda' (marked gpu); one that takes `gpu_device` on the last two. A test that
    parametrizes `device` itself (as a user's would, with autograd.testing.DEVICES) keeps its own."""
    own = {
        name.strip()
        for mark in metafunc.definition.iter_markers("parametrize")
        for name in (mark.args[0].split(",") if isinstance(mark.args[0], str) else mark.args[0])
    }
    if "device" in metafunc.fixturenames and "device" not in own:
        metafunc.parametrize("device", ["cpu", *GPUS])
    if "gpu_device" in metafunc.fixturenames:
        metafunc.parametrize("gpu_device", GPUS)


@pytest.hookimpl(tryfirst=True)  # before -m gpu selects
def pytest_collection_modifyitems(config, items):
    for item in items:  # a test of the "cuda" of autograd.testing.DEVICES is a GPU test too
        if getattr(item, "callspec", None) and item.callspec.params.get("device") == "cuda":
            item.add_marker(pytest.mark.gpu)
    if cuda_available():
        return
    skip = pytest.mark.skip(
        reason="no CUDA device with CuPy here (pip install 'tinygpt[cuda12]' on a GPU machine)"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
