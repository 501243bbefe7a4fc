"""The matrix products of a training step are products of two matrices, as CuPy needs them: its
products of more dimensions take no bfloat16 (an error) and ignore TF32. Under bf16 the weights'
gradients are float32 sums written in float32 on both devices; under tf32 every float32 product
runs with TF32 on, forward and backward, and the process's own setting comes back after.

The GPU side runs on tests/fake_cuda.py's stand-in, whose products behave as CuPy 14's."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autograd as ag
from autograd import backend, products
from autograd import functional as F
from tinygpt import GPT, GPTConfig

from .. import fake_cuda

CONFIG = GPTConfig.tiny(n_layer=2)
LINEARS = 4 * CONFIG.n_layer + 1  # c_attn, c_proj, c_fc, mlp.c_proj per block, and the LM head
TF32 = fake_cuda.FakeLinalg.COMPUTE_TYPE_TF32


def gpt_step(device, policy):
    """Forward and backward of a tiny GPT under `policy`; the model."""
    ag.manual_seed(0)
    model = GPT(CONFIG).to(device).train()
    ids = np.random.default_rng(0).integers(0, CONFIG.vocab_size, (2, 9))
    with ag.use_precision(policy), ag.random.use_masks(ag.random.MaskStream(0)):
        F.cross_entropy(model(ids[:, :-1]), ids[:, 1:]).backward()
    return model


@pytest.mark.parametrize("policy", ["fp32", "tf32", "bf16"])
def test_a_gpu_step_multiplies_two_matrices_at_a_time(monkeypatch, policy):
    """Every product of a GPU step (the linear layers: attention and the rest run in kernels) is of
    two matrices: one per linear layer forward, two backward. Under tf32 each runs in TF32; under
    bf16 each multiplies bfloat16, and the weights' gradients come out in float32."""
    fake_cuda.install(monkeypatch)
    gpt_step("cuda:0", policy)
    made = fake_cuda.GpuArray.products
    assert len(made) == 3 * LINEARS
    assert all(len(a) == len(b) == 2 for a, b in (p.shapes for p in made))
    assert all((p.compute_type == TF32) == (policy == "tf32") for p in made)
    if policy == "bf16":
        assert all(p.dtypes[:2] == (ag.bfloat16, ag.bfloat16) for p in made)
        assert sum(p.dtypes[2] == np.float32 for p in made) == LINEARS  # dW, one per layer
    assert fake_cuda.FakeLinalg.compute_type != TF32  # given back after the step


@pytest.mark.parametrize("policy", ["tf32", "bf16"])
def test_a_cpu_steps_linear_layers_multiply_two_matrices_at_a_time(monkeypatch, policy):
    """On the CPU as well: the reference's linear layers (what a bf16 step runs there, and what a
    GPU runs) multiply two matrices at a time through products.matmul, one product forward and two
    backward each. (The CPU's fast path cuts its products into runs of rows, two matrices too.)"""
    made, matmul = [], products.matmul

    def recorded(a, b, dtype=None):
        made.append((a.shape, b.shape))
        return matmul(a, b, dtype)

    monkeypatch.setattr(products, "matmul", recorded)
    with ag.use_reference(True):
        gpt_step("cpu", policy)
    assert len(made) == 3 * LINEARS and all(len(a) == len(b) == 2 for a, b in made)


@pytest.mark.parametrize("process_had", ["DEFAULT", "TF32"])
def test_tf32_off_gives_back_the_compute_type_the_process_had(monkeypatch, process_had):
    """CUPY_TF32=1 sets CuPy's float32 products to TF32 for the whole process: a tf32 block, or an
    fp32 one inside it, must end with that setting, not CuPy's default."""
    fake_cuda.install(monkeypatch)
    had = getattr(fake_cuda.FakeLinalg, f"COMPUTE_TYPE_{process_had}")
    fake_cuda.FakeLinalg.compute_type = had
    with ag.use_precision("tf32"):
        assert fake_cuda.FakeLinalg.compute_type == TF32
        with ag.use_precision("fp32"):
            assert fake_cuda.FakeLinalg.compute_type == had
        assert fake_cuda.FakeLinalg.compute_type == TF32
    assert fake_cuda.FakeLinalg.compute_type == had


def test_bf16_weight_gradients_are_the_same_on_the_gpu_as_on_the_cpu(monkeypatch):
    """A bf16 step's float32 weight gradients: the float32 sums of bfloat16 products, not rounded
    to bfloat16 on the GPU (where CuPy's product of bfloat16 would round them). The reference path
    on both devices, so that only the products could differ."""
    with ag.use_reference(True):
        on_cpu = gpt_step("cpu", "bf16")
        fake_cuda.install(monkeypatch)
        on_gpu = gpt_step("cuda:0", "bf16")
    for (name, p), expected in zip(on_gpu.named_parameters(), on_cpu.parameters()):
        assert p.grad.dtype == np.float32, name
        np.testing.assert_array_equal(backend.to_host(p.grad), expected.grad, err_msg=name)


@settings(max_examples=10)
@given(st.integers(1, 9), st.integers(1, 9), st.integers(1, 9), st.booleans(), st.integers(0, 2**32 - 1))
def test_matmul_of_bfloat16_matrices_rounds_once_to_the_type_asked(m, k, n, transposed, seed):
    """products.matmul: bfloat16 inputs summed in float32, the result in float32 where asked (as
    is) or in bfloat16 (rounded once); a transposed operand reads the same."""
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((m, k)).astype(ag.bfloat16), rng.standard_normal((k, n)).astype(ag.bfloat16)
    if transposed:
        a = np.ascontiguousarray(a.T).T
    in_float32 = products.matmul(a, b, dtype=np.float32)
    assert in_float32.dtype == np.float32
    # bfloat16 products are exact in float32; k of them summed in float32, in whatever order, are
    # within k roundings of the exact sum (its terms' magnitudes bound each rounding)
    wide_a, wide_b = a.astype(np.float64), b.astype(np.float64)
    assert np.all(np.abs(in_float32 - wide_a @ wide_b) <= k * 2**-24 * (np.abs(wide_a) @ np.abs(wide_b)))
    np.testing.assert_array_equal(
        products.matmul(a, b).view(np.uint16), in_float32.astype(ag.bfloat16).view(np.uint16)
    )


def test_matmul_takes_two_matrices_only():
    with pytest.raises(ValueError, match=r"two matrices, not arrays of shapes \(2, 3, 4\) and \(4, 5\)"):
        products.matmul(np.ones((2, 3, 4)), np.ones((4, 5)))


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["C", "F", "strided"])
def test_a_gpus_bfloat16_product_written_in_float32_is_numpys(layout):
    """cuBLAS's gemmEx with bfloat16 in and float32 out against NumPy's float32 product of the
    same bfloat16 values: equal to float32 rounding of the sums' order."""
    rng = np.random.default_rng(0)
    a, b = (
        rng.standard_normal((70, 300)).astype(ag.bfloat16),
        rng.standard_normal((300, 50)).astype(ag.bfloat16),
    )
    exact = a.astype(np.float64) @ b.astype(np.float64)
    on_gpu = [backend.to_device(x, "cuda:0") for x in (a, b)]
    if layout == "F":
        on_gpu = [backend.cupy.asfortranarray(x) for x in on_gpu]
    if layout == "strided":
        on_gpu = [backend.cupy.repeat(x, 2, axis=1)[:, ::2] for x in on_gpu]
    product = products.matmul(*on_gpu, dtype=np.float32)
    assert product.dtype == np.float32
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    assert (np.abs(backend.to_host(product) - exact) <= 1e-6 * scale).all()
