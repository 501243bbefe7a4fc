"""The fast paths of cross-entropy and of the embedding give their references' numbers: on the CPU
(cross-entropy's NumPy path) and on a GPU (the CUDA kernels of cross_entropy.cu and embedding.cu),
in float32, float64 (the reference on a GPU) and bfloat16, at GPT-1's sizes and at awkward ones.

Both ops mix floating types (bfloat16 logits give float32 losses; a float32 table gives bfloat16
activations under bf16 and keeps a float32 gradient), so the comparison here checks that the two
paths give the same types, and the values within the tolerance of the inputs' type."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import autograd as ag
from autograd import backend
from autograd import functional as F
from autograd.testing import checks_fast_path_of
from tests.helpers import (
    SEEDS,
    WITH_BF16,
    assert_paths_agree,
    forward_and_backward,
    on_device,
    summation_slack,
    upstream,
)

GPT1_VOCAB, GPT1_WIDTH = 40478, 768
BLOCK_EDGES = [1, 31, 32, 33, 255, 256, 257, 1023]  # around a warp and a block of 256 threads


# ----------------------------------------------------------------------------------------------
# cross-entropy


@st.composite
def logits_and_targets(draw):
    """Logits (..., C) of 1 or 2 leading axes with C up to a few thousand (block edges among them),
    at a scale from flat to peaked; targets of which some equal ignore_index (even all of them)."""
    lead = draw(hnp.array_shapes(min_dims=1, max_dims=2, max_side=6))
    n_classes = draw(st.one_of(st.integers(1, 40), st.sampled_from(BLOCK_EDGES), st.integers(1, 3000)))
    rng, scale = np.random.default_rng(draw(SEEDS)), draw(st.sampled_from([0.1, 3.0, 30.0]))
    logits = rng.standard_normal((*lead, n_classes)) * scale
    ignore_index = draw(st.sampled_from([-100, -1, 0]))  # 0: a class that is ignored
    targets = rng.integers(0, n_classes, lead)
    targets[rng.random(lead) < draw(st.sampled_from([0.0, 0.3, 1.0]))] = ignore_index
    return logits, targets, ignore_index


def assert_cross_entropy_paths_agree(case, reduction, device, dtype):
    logits, targets, ignore_index = case
    targets = on_device(targets, device)

    def loss(z):
        losses = F.cross_entropy(z, targets, ignore_index=ignore_index, reduction=reduction)
        assert losses.dtype == (np.float32 if dtype == ag.bfloat16 else dtype)  # float32 sums, float32 losses
        return losses

    assert_paths_agree(loss, [logits], [dtype], device)


@checks_fast_path_of(F.CrossEntropy)
@pytest.mark.parametrize("dtype", WITH_BF16)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@given(logits_and_targets())
def test_cross_entropy(device, dtype, reduction, case):
    assert_cross_entropy_paths_agree(case, reduction, device, dtype)


@pytest.mark.parametrize("dtype", WITH_BF16)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cross_entropy_over_gpt1s_vocabulary(device, dtype, reduction):
    """(2, 3) rows of 40,478 classes, one of them peaked at its target and one ignored."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((2, 3, GPT1_VOCAB)) * 4
    targets = rng.integers(0, GPT1_VOCAB, (2, 3))
    logits[0, 0, targets[0, 0]] = 60.0
    targets[1, 2] = -100
    assert_cross_entropy_paths_agree((logits, targets, -100), reduction, device, dtype)


@pytest.mark.parametrize("dtype", WITH_BF16)
@pytest.mark.parametrize("shift", [-90.0, -1000.0, 1000.0])
@pytest.mark.parametrize("n_classes", [33, 700])
def test_cross_entropy_of_logits_far_from_zero(device, dtype, shift, n_classes):
    """Rows whose logits all lie far below 0 (exp underflows float32 below about -87) or far above:
    the log-sum-exp subtracts the row's maximum, whatever its sign, and so must its first value."""
    rng = np.random.default_rng(8)
    logits, targets = rng.standard_normal((4, n_classes)) * 3 + shift, rng.integers(0, n_classes, 4)
    targets[3] = -100
    assert_cross_entropy_paths_agree((logits, targets, -100), "none", device, dtype)


@pytest.mark.parametrize("dtype", [np.float32, ag.bfloat16])
def test_cross_entropy_reads_targets_outside_the_classes_wrapped_around(gpu_device, dtype):
    """Targets already on a GPU are not checked (the host would wait): one outside [0, C) is read as
    CuPy's indexing reads it, wrapped around, by the forward and the backward alike: the loss and the
    gradient are those of the target wrapped into [0, C), bit for bit."""
    n_classes = 50
    targets = np.array([-1, -50, 50, 123, -77, 7])  # none of them ignore_index
    logits = np.random.default_rng(9).standard_normal((len(targets), n_classes)) * 3
    outside, wrapped = (
        forward_and_backward(
            lambda z, t=t: F.cross_entropy(z, on_device(t, gpu_device), reduction="none"),
            [logits],
            gpu_device,
            dtype,
            reference=False,
        )
        for t in (targets, targets % n_classes)
    )
    for a, b in zip(outside, wrapped):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------------------------
# embedding


@st.composite
def ids_and_table(draw):
    """A table (rows, dim), GPT-1's width and block edges among the widths, and ids of 0 to 3 axes
    that pick only the first `distinct` rows: few distinct ids repeat a lot, and rows no id picks
    get a zero gradient."""
    n_rows = draw(st.one_of(st.integers(1, 8), st.sampled_from([257, 1000])))
    dim = draw(st.one_of(st.integers(1, 40), st.sampled_from([*BLOCK_EDGES, GPT1_WIDTH])))
    rng = np.random.default_rng(draw(SEEDS))
    distinct = draw(st.integers(1, n_rows))
    ids = rng.integers(0, distinct, draw(hnp.array_shapes(min_dims=0, max_dims=3, max_side=9)))
    return ids, rng.standard_normal((n_rows, dim))


@checks_fast_path_of(F.Embedding)
@pytest.mark.parametrize("dtype", WITH_BF16)
@pytest.mark.parametrize("policy", ["fp32", "bf16"])
@given(ids_and_table())
def test_embedding(device, dtype, policy, case):
    """The rows gathered exactly (cast once to the activations' type: bfloat16 for a float32 table
    under bf16), and the table's gradient, in the table's type, summed over repeated ids."""
    ids, table = case
    ids_on_device = on_device(ids, device)

    out_dtype = ag.bfloat16 if policy == "bf16" and dtype == np.float32 else np.dtype(dtype)

    def embed(weight):
        with ag.use_precision(policy):
            rows = F.embedding(ids_on_device, weight)
        cast_once = backend.to_host(weight.data).astype(out_dtype)[ids]
        np.testing.assert_array_equal(rows.numpy(), cast_once)  # on either path, in out_dtype
        return rows

    slack = summation_slack(ids, table.shape, out_dtype, dtype)
    assert_paths_agree(embed, [table], [dtype], device, slack=[0.0, slack])


def embedding_case(shape, n_rows, dim, seed):
    """ids of `shape` that pick mostly a few of n_rows rows (long runs of one row, many rows unpicked),
    and a table (n_rows, dim)."""
    rng = np.random.default_rng(seed)
    ids = np.where(rng.random(shape) < 0.7, rng.integers(0, 3, shape), rng.integers(0, n_rows, shape))
    return ids, rng.standard_normal((n_rows, dim))


@pytest.mark.parametrize("policy", ["fp32", "bf16"])
@pytest.mark.parametrize("shape, n_rows, dim", [((2, 300), 20, 1100), ((700,), 9, GPT1_WIDTH), ((5,), 3, 40)])
def test_embedding_gradient_adds_each_rows_positions_in_their_order(gpu_device, policy, shape, n_rows, dim):
    """On a GPU the table's gradient is, bit for bit, each row's gradients added in float32 one after
    another in the order of their positions (np.add.at's order), across the backward's tiles of 256
    positions, its blocks of 8 rows and its passes of 1,024 columns: no order left to the hardware."""
    ids, table = embedding_case(shape, n_rows, dim, seed=len(shape) + dim)

    def embed(weight):
        with ag.use_precision(policy):
            return F.embedding(on_device(ids, gpu_device), weight)

    out, grad = forward_and_backward(embed, [table], gpu_device, np.float32, reference=False)
    sums = np.zeros_like(table, np.float32)
    gradients = upstream(out.shape).astype(out.dtype).astype(np.float32).reshape(-1, dim)
    np.add.at(sums, ids.reshape(-1), gradients)
    np.testing.assert_array_equal(grad, sums)


@pytest.mark.parametrize("dtype", [np.float32, ag.bfloat16])
def test_embedding_reads_ids_outside_the_table_wrapped_around(gpu_device, dtype):
    """Ids already on a GPU are not checked (the host would wait): one outside [0, rows) picks the row
    CuPy's indexing reads, wrapped around, in the forward and in the gradient alike, bit for bit."""
    n_rows = 10
    ids = np.array([[-1, -10, 10, 123], [-77, 7, 3, -1]])
    table = np.random.default_rng(3).standard_normal((n_rows, 33))

    def embed(ids):
        return forward_and_backward(
            lambda w: F.embedding(on_device(ids, gpu_device), w), [table], gpu_device, dtype, reference=False
        )

    outside, wrapped = embed(ids), embed(ids % n_rows)
    for a, b in zip(outside, wrapped):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------------------------
# repeatability: no order of additions left to the hardware


@pytest.mark.parametrize("dtype", [np.float32, ag.bfloat16])
def test_cross_entropy_repeats_bit_for_bit(device, dtype):
    rng = np.random.default_rng(1)
    logits, targets = rng.standard_normal((64, GPT1_VOCAB)) * 5, rng.integers(0, GPT1_VOCAB, 64)
    first, second = (
        forward_and_backward(lambda z: F.cross_entropy(z, targets), [logits], device, dtype, reference=False)
        for _ in range(2)
    )
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("policy", ["fp32", "bf16"])
def test_embedding_gradient_repeats_bit_for_bit(device, policy):
    """4096 positions over 3 table rows, most of them on one: long runs added in a fixed order."""
    rng = np.random.default_rng(2)
    ids = np.where(rng.random((8, 512)) < 0.9, 1, rng.integers(0, 3, (8, 512)))
    table = rng.standard_normal((3, GPT1_WIDTH))

    def embed(weight):
        with ag.use_precision(policy):
            return F.embedding(ids, weight)

    first, second = (
        forward_and_backward(embed, [table], device, np.float32, reference=False) for _ in range(2)
    )
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
