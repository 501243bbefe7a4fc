"""Device names, the NumPy/CuPy switch, seeded generators, and the error when CUDA is missing."""

import math

import numpy as np
import pytest
from hypothesis import given

import autograd as ag
from autograd import backend
from tests.helpers import arrays, shapes


def test_cpu_device_names():
    assert backend.parse_device(None) == "cpu"
    assert backend.parse_device("cpu") == "cpu"
    assert backend.parse_device("auto") == ("cuda:0" if backend.cuda_available() else "cpu")


@pytest.mark.parametrize("name", ["gpu", "cuda:x", "cuda:-1", "", 0])
def test_bad_device_names_are_refused(name):
    with pytest.raises(ValueError, match="device"):
        backend.parse_device(name)


def test_cuda_without_cupy_says_what_to_install(monkeypatch):
    monkeypatch.setattr(backend, "cupy", None)
    with pytest.raises(RuntimeError, match=r"CuPy, which is not installed: pip install 'tinygpt\[cuda12\]'"):
        ag.tensor([1.0], device="cuda")


def test_cuda_without_a_gpu_says_so(monkeypatch):
    class NoDevices:
        class cuda:
            class runtime:
                @staticmethod
                def getDeviceCount():
                    raise RuntimeError("cudaErrorNoDevice")

    monkeypatch.setattr(backend, "cupy", NoDevices)
    with pytest.raises(RuntimeError, match="no CUDA device"):
        backend.parse_device("cuda:0")


def test_numpy_arrays_use_numpy():
    assert backend.get_array_module(np.ones(2), 3.0) is np
    assert backend.device_of(np.ones(2)) == "cpu"


def test_manual_seed_makes_the_default_generator_repeat(device):
    device = backend.parse_device(device)
    backend.manual_seed(1234)
    first = backend.to_numpy(backend.default_generator(device).random(5))
    backend.manual_seed(1234)
    again = backend.to_numpy(backend.default_generator(device).random(5))
    backend.manual_seed(4321)
    other = backend.to_numpy(backend.default_generator(device).random(5))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


@given(arrays(shapes(), -4, 4))
def test_erf_matches_math_erf(device, values):
    x = backend.to_device(values, backend.parse_device(device))
    expected = np.vectorize(math.erf, otypes=[np.float64])(values)
    np.testing.assert_allclose(backend.to_numpy(backend.erf(x)), expected, rtol=1e-14, atol=1e-15)


@pytest.mark.gpu
def test_arrays_round_trip_between_host_and_gpu():
    values = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    on_gpu = backend.to_device(values, "cuda:0")
    assert backend.get_array_module(on_gpu) is backend.cupy and backend.device_of(on_gpu) == "cuda:0"
    np.testing.assert_array_equal(backend.to_numpy(on_gpu), values)
