"""TF32 on the emulated device, as CuPy 14 does it: where the process set CUPY_TF32=1, or inside a
tf32 block, a float32 product of two matrices (matmul of at most two dimensions, dot) reads its
inputs rounded to TF32, 10 mantissa bits, to the nearest, ties away from zero; a matmul of stacks,
einsum and a dot of two vectors stay in float32. And the GPU tests' references do not depend on
it: with CUPY_TF32=1, the tests that compare a GPU's float32 results with references pass."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import autograd as ag
from autograd import backend, emulator, products
from tests import tf32

EMULATED = emulator.NAME
ROOT = Path(__file__).parents[2]
TIE = 1 + 2**-11  # halfway between 1 and the next TF32 value, 1 + 2**-10: rounds away, up


def nearest_tf32(x):
    """float32 values rounded to TF32 in float64 arithmetic: to the nearest multiple of 2**-10 of
    their power of two (of float32's smallest, 2**-126, below it), ties away from zero."""
    x = np.asarray(x, np.float64)
    _, exponent = np.frexp(x)  # x = m * 2**exponent, 0.5 <= |m| < 1
    step = np.ldexp(1.0, np.maximum(exponent - 1, -126) - 10)
    with np.errstate(over="ignore"):  # a carry past float32's largest value is infinity
        return (np.sign(x) * np.floor(np.abs(x) / step + 0.5) * step).astype(np.float32)


@given(hnp.arrays(np.float32, hnp.array_shapes(max_dims=2, max_side=8), elements=st.floats(width=32)))
def test_tf32_rounds_to_the_nearest_value_of_ten_mantissa_bits(x):
    """emulator.tf32 rounds the bits as a GPU does; nearest_tf32 does the arithmetic."""
    finite = np.isfinite(x)
    np.testing.assert_array_equal(emulator.tf32(x)[finite], nearest_tf32(x[finite]))
    np.testing.assert_array_equal(emulator.tf32(x)[~finite], x[~finite])  # infinities and NaN


def test_tf32_rounds_ties_away_from_zero():
    x = np.array([TIE, -TIE, 1 + 2**-12, 1 + 3 * 2**-11], np.float32)
    expected = [1 + 2**-10, -(1 + 2**-10), 1, 1 + 2**-9]
    np.testing.assert_array_equal(emulator.tf32(x), np.array(expected, np.float32))


@given(st.integers(1, 5), st.integers(1, 5), st.integers(1, 5), st.data())
def test_a_float32_product_of_two_matrices_reads_tf32_inputs_in_a_tf32_block_only(m, k, n, data):
    """products.matmul on the emulated device: in a tf32 block, the float32 sums of the exact products
    of the inputs rounded to TF32; outside one, of the inputs as they are. A product with one entry
    (a reduction on CuPy) is never rounded."""
    values = st.floats(-4, 4, width=32)
    a, b = (data.draw(hnp.arrays(np.float32, shape, elements=values)) for shape in ((m, k), (k, n)))
    on_device = [backend.to_device(x, EMULATED) for x in (a, b)]
    for policy in ("fp32", "tf32"):
        with tf32.off(EMULATED), ag.use_precision(policy):
            product = backend.to_host(products.matmul(*on_device))
        rounded = policy == "tf32" and m * n > 1
        a64, b64 = ((nearest_tf32(x) if rounded else x).astype(np.float64) for x in (a, b))
        # float32's rounding of each product and sum (and what underflows), far below TF32's 2**-11
        bound = (k + 1) * 2**-24 * (np.abs(a64) @ np.abs(b64)) + 2**-126
        assert (np.abs(product - a64 @ b64) <= bound).all(), policy


def test_which_products_read_tf32_inputs_follows_cupy():
    """In a tf32 block, CuPy multiplies two matrices, and anything through dot, with cuBLAS's gemm in
    TF32; a stack of matrices with its batched gemm (einsum too) and two vectors with a reduction,
    both in float32."""
    xp = emulator.xp
    a = backend.to_device(np.array([[TIE, 0], [0, 1]], np.float32), EMULATED)
    eye = backend.to_device(np.eye(2, dtype=np.float32), EMULATED)
    with tf32.off(EMULATED), ag.use_precision("tf32"):
        in_tf32 = {"matrices": a @ eye, "dot": xp.dot(a, eye), "dot of a stack": xp.dot(a[None], eye)}
        in_float32 = {
            "stack": a[None] @ eye[None],
            "einsum": xp.einsum("ij,jk", a, eye),
            "vectors": a[0] @ eye[0],
        }
    for name, product in in_tf32.items():
        assert backend.to_host(product).flat[0] == np.float32(1 + 2**-10), name
    for name, product in in_float32.items():
        assert backend.to_host(product).flat[0] == np.float32(TIE), name


@pytest.mark.parametrize("process_asked", [False, True])
def test_cupy_tf32_is_read_once_and_a_tf32_block_gives_back_what_it_asked(monkeypatch, process_asked):
    """The emulated device reads CUPY_TF32 the first time it is asked, as CuPy does; a tf32 block,
    or an fp32 one inside it, ends with the process's setting, not the default."""
    monkeypatch.setattr(emulator.Linalg, "compute_type", None)
    monkeypatch.setenv("CUPY_TF32", "1" if process_asked else "0")
    assert tf32.on(EMULATED) == process_asked
    monkeypatch.setenv("CUPY_TF32", "0" if process_asked else "1")  # too late: read once
    with ag.use_precision("tf32"):
        assert tf32.on(EMULATED)
        with ag.use_precision("fp32"):
            assert tf32.on(EMULATED) == process_asked
        assert tf32.on(EMULATED)
    assert tf32.on(EMULATED) == process_asked
    with tf32.off(EMULATED):
        assert not tf32.on(EMULATED)
    assert tf32.on(EMULATED) == process_asked


# The tests whose numbers once depended on the process's TF32 (their references took it, or they
# skipped under it), on the emulated device
ONCE_TF32_DEPENDENT = [
    "tests/autograd/test_precision.py::test_tf32_rounds_float32_products_and_spares_layer_norm[cuda-emulated]",
    "tests/autograd/test_functional.py::test_float32_in_float32_out[fast-cuda-emulated-linear]",
    "tests/autograd/test_functional.py::test_float32_in_float32_out[reference-cuda-emulated-linear]",
    "tests/autograd/test_functional.py::test_numpy_and_cupy_agree[fast-cuda-emulated-linear]",
    "tests/autograd/test_functional.py::test_numpy_and_cupy_agree[reference-cuda-emulated-linear]",
    "tests/autograd/test_kernels.py::test_scaled_dot_product_attention[cuda-emulated-float32]",
    "tests/autograd/test_kernels_attention.py::test_scaled_dot_product_attention[cuda-emulated-float32]",
    "tests/tinygpt/test_model.py::test_a_training_step_gives_the_same_numbers_on_numpy_and_cupy[cuda-emulated]",
    "tests/tinygpt/test_model.py::test_token_embedding_gradient_includes_the_lm_heads_part[cuda-emulated]",
    "tests/tinygpt/test_model.py::test_logits_are_hidden_states_times_the_token_embedding[cuda-emulated]",
    "tests/autograd/test_emulator_device.py::test_a_training_step_on_its_reference_path_gives_the_cpus_bits",
    "tests/autograd/test_device_placement.py::test_a_step_of_a_model_on_gpu_1_runs_there_and_gives_the_cpus_numbers",
]


def test_the_gpu_tests_references_do_not_depend_on_tf32():
    """With CUPY_TF32=1 every float32 product of two matrices on the emulated device is TF32's, as
    on a GPU, and these tests still pass: their references are the host's or made with TF32 off,
    and a result made of TF32 products is held to TF32's error."""
    env = {**os.environ, "CUPY_TF32": "1", "CI": "1", "HYPOTHESIS_PROFILE": "ci"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *ONCE_TF32_DEPENDENT]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0 and f"{len(ONCE_TF32_DEPENDENT)} passed" in result.stdout, result.stdout
