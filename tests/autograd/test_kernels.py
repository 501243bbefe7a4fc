"""The fast paths of autograd/kernels give the numbers of their ops' reference paths, and the
rule that picks a path does what it says."""

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import autograd as ag
from autograd import backend, kernels
from autograd import functional as F
from autograd.kernels import linear as linear_kernels
from autograd.testing import arrays, checks_fast_path_of, shapes
from tests.helpers import (
    SEEDS,
    WITH_BF16,
    assert_fast_equals_reference,
    attention_inputs,
    column_sums_in_their_order,
    fresh_stream,
    linear_inputs,
    logits_and_targets,
    packed_heads,
)

DTYPES = [np.float32, np.float64]


@checks_fast_path_of(F.Linear)
@pytest.mark.parametrize("dtype", WITH_BF16)
@given(linear_inputs())
def test_linear(device, dtype, case):
    x, weight, bias = case
    inputs = [x, weight] + ([bias] if bias is not None else [])
    assert_fast_equals_reference(F.linear, inputs, device, dtype)


@pytest.mark.parametrize("dtype", [np.float32, ag.bfloat16])
@given(st.one_of(st.integers(0, 100), st.integers(2000, 2400)), st.integers(1, 300), SEEDS)
def test_column_sums_add_the_rows_of_each_chunk_in_order_then_the_chunks_in_a_tree(
    gpu_device, dtype, rows, width, seed
):
    """A linear layer's bias gradient on a GPU: the same bits as the order written down, for row counts
    on both sides of a chunk's edge, chunks enough for three levels of the tree, widths on both sides
    of a block's, repeatably (each launch leaves its counters at 0 for the next)."""
    x = np.random.default_rng(seed).standard_normal((rows, width)).astype(dtype)
    on_device = backend.to_device(x, gpu_device)
    with backend.device_scope(on_device):
        sums = [backend.to_host(linear_kernels.column_sums(on_device)) for _ in range(2)]
    expected = column_sums_in_their_order(x, linear_kernels.ROWS_PER_CHUNK)
    assert sums[0].dtype == np.float32
    np.testing.assert_array_equal(sums[0], expected)
    np.testing.assert_array_equal(sums[1], sums[0])


@pytest.mark.parametrize("dtype", DTYPES)
@given(linear_inputs())
def test_linear_through_a_transposed_weight(device, dtype, case):
    """The tied LM head's case, linear(x, W.T), where the fast path lays out W's gradient its own way."""
    x, weight, _ = case
    assert_fast_equals_reference(lambda x, table: F.linear(x, table.T), [x, weight.T.copy()], device, dtype)


@checks_fast_path_of(F.CrossEntropy)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@given(logits_and_targets())
def test_cross_entropy(device, dtype, reduction, case):
    logits, targets, ignore_index = case

    def loss(z):
        return F.cross_entropy(z, targets, ignore_index=ignore_index, reduction=reduction)

    assert_fast_equals_reference(loss, [logits], device, dtype)


@checks_fast_path_of(F.GELU)
@pytest.mark.parametrize("dtype", DTYPES)
@given(arrays(shapes(max_dims=4), -6.0, 6.0))
def test_gelu(device, dtype, x):
    assert_fast_equals_reference(F.gelu, [x], device, dtype)


@checks_fast_path_of(F.LayerNorm)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", [(), ("weight",), ("bias",), ("weight", "bias")])
@given(st.data())
def test_layer_norm(device, dtype, affine, data):
    """Rounding in x - mean is of the order of x, and the norm multiplies it by 1 / std: the largest
    x times that factor is the tolerance's scale (a row whose spread is small beside its values)."""
    x = data.draw(arrays(shapes(min_dims=1)))
    params = [data.draw(arrays(x.shape[-1:])) for _ in affine]
    rstd = 1 / np.sqrt(x.var(axis=-1, keepdims=True) + 1e-5)
    assert_fast_equals_reference(
        lambda x, *p: F.layer_norm(x, **dict(zip(affine, p))),
        [x, *params],
        device,
        dtype,
        terms=float(np.max(np.abs(x) * rstd, initial=0.0)),
    )


@checks_fast_path_of(F.Dropout)
@pytest.mark.parametrize("dtype", WITH_BF16)
@given(arrays(shapes(max_dims=4), -3.0, 3.0), st.sampled_from([0.1, 0.5, 1.0]), SEEDS)
def test_dropout(device, dtype, x, p, seed):
    """The mask the kernel draws is the one the reference draws: the same entries dropped."""
    assert_fast_equals_reference(lambda t: F.dropout(t, p, generator=fresh_stream(seed)), [x], device, dtype)


@checks_fast_path_of(F.ScaledDotProductAttention)
@pytest.mark.parametrize("dtype", DTYPES)
@given(attention_inputs(), st.sampled_from([0.0, 0.3]), SEEDS)
# v's heads beyond those of q k^T share their dropout mask
@example(
    case=(*np.random.default_rng(0).standard_normal((2, 1, 3, 4)), np.arange(24.0).reshape(2, 3, 4), True),
    dropout_p=0.3,
    seed=0,
)
def test_scaled_dot_product_attention(device, dtype, case, dropout_p, seed):
    """Shared (broadcast) heads, T != S, causal or not, and dropout: the same mask from one seed."""
    q, k, v, causal = case

    def attend(q, k, v):
        return F.scaled_dot_product_attention(
            q, k, v, causal=causal, dropout_p=dropout_p, generator=fresh_stream(seed)
        )

    assert_fast_equals_reference(attend, [q, k, v], device, dtype, reference_without_tf32=True)


@checks_fast_path_of(F.MultiHeadAttention)
@pytest.mark.parametrize("dtype", DTYPES)
@given(packed_heads(), st.sampled_from([0.0, 0.3]), SEEDS)
def test_multi_head_attention(device, dtype, case, dropout_p, seed):
    qkv, n_head = case

    def attend(qkv):
        return F.multi_head_attention(qkv, n_head, dropout_p=dropout_p, generator=fresh_stream(seed))

    assert_fast_equals_reference(attend, [qkv], device, dtype)


# ----- the rule that picks the path


def test_choose_gives_the_fast_pair_for_its_device_and_dtypes_and_the_reference_when_asked():
    f32, f64, bf16 = np.dtype(np.float32), np.dtype(np.float64), ag.bfloat16
    reference = (F.GELU.forward, F.GELU.backward)
    assert kernels.choose(F.GELU, on_gpu=False, float_dtypes={f32}) == (
        F.GELU.forward_cpu,
        F.GELU.backward_cpu,
    )
    assert kernels.choose(F.GELU, on_gpu=True, float_dtypes={bf16}) == (
        F.GELU.forward_gpu,
        F.GELU.backward_gpu,
    )
    assert kernels.choose(F.GELU, on_gpu=False, float_dtypes={bf16}) == reference  # the CPU's: f32, f64
    assert kernels.choose(F.GELU, on_gpu=True, float_dtypes={f64}) == reference  # the GPU's: f32, bf16
    assert kernels.choose(F.Embedding, on_gpu=False) == (F.Embedding.forward, F.Embedding.backward)  # none
    with ag.use_reference():
        assert kernels.choose(F.GELU, on_gpu=False, float_dtypes={f32}) == reference


@pytest.mark.parametrize("width, fits", [(64, True), (128, True), (129, False)])
def test_choose_asks_the_fast_path_whether_the_call_fits(width, fits):
    """Attention's kernels take heads up to 128 wide: a wider one runs the reference, by choose's one
    rule, both ways (the launchers have no fallback of their own)."""
    q = np.zeros((2, 4, width), np.float32)
    fast = (F.ScaledDotProductAttention.forward_gpu, F.ScaledDotProductAttention.backward_gpu)
    reference = (F.ScaledDotProductAttention.forward, F.ScaledDotProductAttention.backward)
    chosen = kernels.choose(F.ScaledDotProductAttention, True, {q.dtype}, (q, q, q, True, 0.0, None))
    assert chosen == (fast if fits else reference)
    qkv = np.zeros((1, 4, 3 * 2 * width), np.float32)
    chosen = kernels.choose(
        F.MultiHeadAttention,
        True,
        {qkv.dtype},
        (qkv, None),
        {"n_head": 2, "dropout_p": 0.0, "generator": None},
    )
    assert (chosen[0] is F.MultiHeadAttention.forward_gpu) == fits


def test_use_reference_as_a_context_restores_the_choice_before_it():
    assert not kernels.reference_only()
    with ag.use_reference(True):
        assert kernels.reference_only()
        with ag.use_reference(False):
            assert not kernels.reference_only()
        assert kernels.reference_only()
    assert not kernels.reference_only()


def test_use_reference_as_a_call_holds_until_switched_back():
    try:
        ag.use_reference(True)
        assert kernels.reference_only()
    finally:
        ag.use_reference(False)
    assert not kernels.reference_only()


def test_the_fast_path_runs_unless_the_reference_is_asked_for(monkeypatch):
    """A broken fast path fails a call on the fast path only."""

    def broken(ctx, x, bias):
        raise RuntimeError("the fast path ran")

    monkeypatch.setattr(F.GELU, "forward_cpu", broken)
    x = ag.tensor(np.ones(3), requires_grad=True)
    with pytest.raises(RuntimeError, match="the fast path ran"):
        F.gelu(x)
    with ag.use_reference():
        F.gelu(x).sum().backward()
    np.testing.assert_allclose(x.grad, np.full(3, 1.0829640838457826), rtol=1e-6)


def test_a_graph_built_on_one_path_goes_back_on_the_same_path(monkeypatch):
    """Forward and backward are chosen together: a backward reads what its own forward saved."""

    def wrong_backward(ctx, grad):
        raise RuntimeError("the reference backward ran after the fast forward")

    monkeypatch.setattr(F.GELU, "backward", wrong_backward)
    x = ag.tensor(np.ones(3), requires_grad=True)
    out = F.gelu(x).sum()
    with ag.use_reference():
        out.backward()
    np.testing.assert_allclose(x.grad, np.full(3, 1.0829640838457826), rtol=1e-6)


@pytest.mark.parametrize("value, reference", [("1", True), ("0", False), ("", False)])
def test_the_environment_variable_turns_the_reference_on(value, reference):
    code = "from autograd import kernels; print(kernels.reference_only())"
    env = {**os.environ, "AUTOGRAD_REFERENCE": value}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == str(reference)
