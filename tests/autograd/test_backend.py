"""Device names, the NumPy/CuPy switch, seeded generators, and the error when CUDA is missing."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import autograd as ag
from autograd import backend, random
from autograd.testing import arrays, indices, shapes
from tests import fake_cuda


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


@pytest.mark.parametrize("name", ["cuda", "cuda:1", "auto", "cuda-emulated", "cpu", None])
def test_every_function_that_takes_a_device_takes_every_name_of_one(monkeypatch, name):
    """to_device, use_device and default_generator take a device as parse_device does: 'cuda' is
    GPU 0 of the CuPy stand-in, 'auto' a GPU where there is one."""
    fake_cuda.install(monkeypatch)
    device = backend.parse_device(name)
    backend.use_device(name)
    moved = backend.to_device(np.arange(3.0), name)
    assert backend.device_of(moved) == device and backend.to_host(moved).tolist() == [0.0, 1.0, 2.0]
    assert backend.device_of(backend.to_device(moved, name)) == device
    assert random.default_generator(name) is random.default_generator(device)
    if device.startswith("cuda:"):
        assert fake_cuda.Device.current == backend.gpu_index(device)


@pytest.mark.parametrize("call", ["to_device", "use_device", "default_generator"])
@pytest.mark.parametrize("name", ["gpu", "cuda:x", "cuda:2"])
def test_a_function_given_a_bad_device_names_the_argument(monkeypatch, call, name):
    fake_cuda.install(monkeypatch)
    args = (np.zeros(1), name) if call == "to_device" else (name,)
    with pytest.raises(ValueError, match=f"device.*{name}"):
        getattr(random if call == "default_generator" else backend, call)(*args)


def test_numpy_arrays_use_numpy():
    assert backend.get_array_module(np.ones(2), 3.0) is np
    assert backend.device_of(np.ones(2)) == "cpu"


@given(arrays(shapes(), -4, 4))
def test_erf_matches_math_erf(device, values):
    x = backend.to_device(values, backend.parse_device(device))
    expected = np.vectorize(math.erf, otypes=[np.float64])(values)
    np.testing.assert_allclose(backend.to_host(backend.erf(x)), expected, rtol=1e-14, atol=1e-15)


def test_arrays_round_trip_between_host_and_gpu(gpu_device):
    values = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    on_gpu = backend.to_device(values, backend.parse_device(gpu_device))
    assert backend.get_array_module(on_gpu) is not np and backend.device_of(on_gpu) == backend.parse_device(
        gpu_device
    )
    np.testing.assert_array_equal(backend.to_host(on_gpu), values)


# Scatter-add in a fixed order ----------------------------------------------------------------------


def add_at(values, segments, n_segments):
    """The sum by segment as np.add.at makes it: the rows added one after another."""
    out = np.zeros((n_segments, *values.shape[1:]), values.dtype)
    np.add.at(out, segments, values)
    return out


@st.composite
def segmented_rows(draw, dtype):
    """(values (n, ...), segments (n,), n_segments): up to 40 rows of 0 to 2 axes, in up to 8
    segments; float64 values are whole numbers, float32 values any in [-1e4, 1e4]."""
    n_segments, n = draw(st.integers(1, 8)), draw(st.integers(0, 40))
    segments = draw(indices(n_segments, n))
    row_shape = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=3))
    if dtype == np.float64:
        elements = st.integers(-1000, 1000).map(float)
    else:
        elements = st.floats(-1e4, 1e4, width=32)
    values = draw(hnp.arrays(dtype, (n, *row_shape), elements=elements))
    return values, segments, n_segments


@given(segmented_rows(np.float64))
def test_segment_sum_equals_add_at_on_exact_sums(rows):
    """On whole numbers every order of addition is exact: the sums must be add.at's, bit for bit."""
    values, segments, n_segments = rows
    np.testing.assert_array_equal(backend.segment_sum(values, segments, n_segments), add_at(*rows))


@given(segmented_rows(np.float32))
def test_segment_sum_in_float32_is_within_its_rounding_bound(rows):
    """A segment of m rows is added as a tree ceil(log2 m) deep: each sum lies within
    ceil(log2 m) * 2**-24 * (the sum of the magnitudes) of the exact sum, and so within
    (ceil(log2 m) + m - 1) * 2**-24 * that of add.at's, whose sequential sum allows (m - 1) * 2**-24."""
    values, segments, n_segments = rows
    got = backend.segment_sum(values, segments, n_segments).astype(np.float64)
    exact = add_at(values.astype(np.float64), segments, n_segments)
    magnitudes = add_at(np.abs(values).astype(np.float64), segments, n_segments)
    m = np.bincount(segments, minlength=n_segments).reshape(-1, *(1,) * (values.ndim - 1))
    depth = np.ceil(np.log2(np.maximum(m, 1)))
    reference_error = m * 2.0**-53 * magnitudes  # what float64 add.at may be off by
    assert np.all(np.abs(got - exact) <= 1.001 * depth * 2.0**-24 * magnitudes + reference_error)
    sequential = add_at(*rows).astype(np.float64)
    assert np.all(np.abs(got - sequential) <= 1.001 * (depth + m) * 2.0**-24 * magnitudes)


@st.composite
def scatter_indices(draw):
    """(shape, index): every kind of index that may name a position twice."""
    shape = draw(shapes(min_dims=1))
    rows = indices(shape[0], shapes(1, 2, 0, 5), negative=True)
    kinds = [rows, rows.map(np.ndarray.tolist), hnp.integer_array_indices(shape)]
    if len(shape) > 1:
        column = indices(shape[1], shapes(1, 1, 0, 5), negative=True)
        kinds.append(column.map(lambda ids: (slice(None), ids)))
    return shape, draw(st.one_of(kinds))


@given(scatter_indices(), st.data())
def test_sorted_scatter_add_equals_add_at_for_every_kind_of_index(shape_and_index, data):
    """What a GPU runs, run on NumPy: rows picked by an integer array (negative ones too), a list,
    one array per axis, an array after a slice; whole-number values, so the sums are exact."""
    shape, index = shape_and_index
    result_shape = np.zeros(shape)[index].shape
    values = data.draw(hnp.arrays(np.float64, result_shape, elements=st.integers(-1000, 1000).map(float)))
    expected = np.zeros(shape)
    np.add.at(expected, index, values)
    np.testing.assert_array_equal(backend.sorted_scatter_add(shape, index, values), expected)
    np.testing.assert_array_equal(backend.scatter_add(shape, index, values), expected)


def test_an_embedding_gradient_on_the_gpu_repeats_bit_for_bit(gpu_device):
    """Many ids on few rows, so that atomic adds would race; two runs give the same bits, and
    NumPy's sequential sums within float32 rounding."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 5, size=(64, 128))
    grad = rng.standard_normal((64, 128, 32)).astype(np.float32)

    def table_grad(device):
        table = ag.tensor(np.zeros((5, 32), dtype=np.float32), requires_grad=True, device=device)
        ag.functional.embedding(ids, table).backward(ag.tensor(grad, device=device))
        return backend.to_host(table.grad)

    first = table_grad(gpu_device)
    np.testing.assert_array_equal(table_grad(gpu_device), first)
    np.testing.assert_allclose(first, table_grad("cpu"), rtol=1e-4, atol=1e-3)


def test_names_that_moved_out_of_backend_are_still_importable_from_it():
    from autograd import products
    from autograd.backend import manual_seed, matmul, set_tf32

    assert (matmul, set_tf32, manual_seed) == (products.matmul, products.set_tf32, random.manual_seed)
    with pytest.raises(AttributeError, match="'autograd.backend' has no attribute 'no_such_name'"):
        backend.no_such_name  # noqa: B018
