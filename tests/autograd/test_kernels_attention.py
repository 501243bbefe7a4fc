"""Attention's fast paths give the numbers of the reference (autograd/attention.py): on the CPU its
blocked NumPy path, on a GPU the flash attention kernels (autograd/kernels/cuda/attention.cu), forward
and backward, causal and not, with dropout's mask drawn from the same stream; for T and S that are no
multiple of a tile, heads 1 to 128 wide, float32 and bfloat16, and at GPT-1's size. Multi-head attention
with the projection's bias too, which the fast paths add as they read q, k and v: a bias in float32
beside bfloat16 qkv, as the bf16 policy has it."""

import contextlib

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import autograd as ag
from autograd import backend
from autograd import functional as F
from autograd.kernels import attention as attention_kernels
from autograd.testing import checks_fast_path_of, shapes
from tests import tf32
from tests.helpers import (
    SEEDS,
    TOLERANCE,
    WITH_BF16,
    assert_fast_equals_reference,
    forward_and_backward,
    fresh_stream,
    upstream,
)

SIZES = st.integers(1, 130)  # the kernels' tiles are 16 to 64 rows: most sizes leave a partial one
HEAD_WIDTHS = st.one_of(st.sampled_from([1, 64, 128]), st.integers(1, 128))  # zero-padded to 64 or 128
DROPOUT = st.sampled_from([0.0, 0.3])
BIAS_SCALES = st.sampled_from([None, 0.5, 2.0])  # None: no bias


def normal(seed, *shapes):
    """Standard normal arrays of the shapes, from one seed (faster than drawing each entry)."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) for shape in shapes]


@st.composite
def attention_case(draw):
    """q (..., T, d), k (..., S, d), v (..., S, e) and causal: 0 to 2 head axes, each of which q, k or v
    may share (size 1, broadcast); S >= T when causal."""
    causal = draw(st.booleans())
    n_queries = draw(SIZES)
    n_keys = draw(st.integers(n_queries, 130) if causal else SIZES)
    d, e = draw(HEAD_WIDTHS), draw(HEAD_WIDTHS)
    heads = draw(shapes(min_dims=0, max_dims=2, max_side=3))

    def heads_of_one_input():
        return tuple(1 if draw(st.booleans()) else n for n in heads)

    q, k, v = normal(
        draw(SEEDS),
        heads_of_one_input() + (n_queries, d),
        heads_of_one_input() + (n_keys, d),
        heads_of_one_input() + (n_keys, e),
    )
    return q, k, v, causal


def largest_term(q, k, v, d_out):
    """The largest term of the sums that give the gradients of q and k for the upstream d_out:
    dQ = dS K / sqrt(d) and dK = dS^T Q / sqrt(d), where dS = P (dO V^T - rowsum(dO O)) is a
    cancellation of terms up to |dO V^T| that leaves rounding of their size behind."""
    d_scores = np.abs(d_out @ np.swapaxes(v, -1, -2)).max(initial=0)
    return 2 * d_scores * max(np.abs(q).max(initial=0), np.abs(k).max(initial=0)) / np.sqrt(q.shape[-1])


def largest_term_of_heads(q, k, v):
    heads = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    return largest_term(q, k, v, upstream(heads + q.shape[-2:-1] + v.shape[-1:]))


def largest_term_packed(qkv, n_head):
    def heads(x):  # (B, T, heads * width) -> (B, heads, T, width)
        return x.reshape(*x.shape[:2], n_head, -1).swapaxes(1, 2)

    q, k, v = np.split(qkv, 3, axis=-1)
    return largest_term(heads(q), heads(k), heads(v), heads(upstream(v.shape)))


def attend(causal, dropout_p, seed):
    def attend(q, k, v):
        return F.scaled_dot_product_attention(
            q, k, v, causal=causal, dropout_p=dropout_p, generator=fresh_stream(seed)
        )

    return attend


def attend_packed(n_head, dropout_p, seed):
    def attend(qkv, bias=None):
        return F.multi_head_attention(
            qkv, n_head, dropout_p=dropout_p, generator=fresh_stream(seed), bias=bias
        )

    return attend


def bias_dtype(dtype):
    """The bias's type beside qkv of `dtype`: float32 for bfloat16 qkv (the bf16 policy's parameters)."""
    return np.dtype(np.float32) if dtype == ag.bfloat16 else np.dtype(dtype)


def assert_packed_fast_equals_reference(qkv, bias, n_head, dropout_p, seed, device, dtype):
    """multi_head_attention of qkv + bias (None: no bias) on the fast path and on the reference: y and
    dqkv in qkv's type, db in bias_dtype's; y and dqkv within assert_fast_equals_reference's tolerance,
    for heads q, k, v = qkv + bias; db, the sum of dqkv's rows, within the sum of their allowances."""
    dtype = np.dtype(dtype)
    inputs, dtypes = [qkv], [dtype]
    if bias is not None:
        inputs, dtypes = [qkv, bias], [dtype, bias_dtype(dtype)]
    attend = attend_packed(n_head, dropout_p, seed)
    fast, reference = (forward_and_backward(attend, inputs, device, dtypes, on) for on in (False, True))
    heads = qkv if bias is None else qkv + bias  # the q, k and v attended
    (rtol, atol), terms = TOLERANCE[dtype], largest_term_packed(heads, n_head)
    allowed = []
    for b in (x.astype(np.float64) for x in reference[:2]):  # y's and dqkv's: assert_fast_equals_reference's
        scale = max(1.0, terms, np.abs(b).max(initial=0), np.abs(heads).max(initial=0))
        scaled = atol * scale
        if dtype == np.float32:  # and TF32's error where the kernels took TF32
            scaled = tf32.tolerance(device, rtol, scaled, scale)["atol"]
        allowed.append(scaled + rtol * np.abs(b))
    allowed.append(allowed[1].reshape(-1, qkv.shape[-1]).sum(axis=0))  # db's: the sum of its rows'
    for name, a, b, allowance, t in zip(["y", "dqkv", "db"], fast, reference, allowed, [dtype, *dtypes]):
        assert a.dtype == b.dtype == t, f"{name}: {a.dtype} and {b.dtype}, not {t}"
        excess = np.abs(a.astype(np.float64) - b.astype(np.float64)) - allowance
        out = np.count_nonzero(excess > 0)
        assert not out, f"{name}: {out} entries out, by up to {excess.max()}"


@checks_fast_path_of(F.ScaledDotProductAttention)
@pytest.mark.parametrize("dtype", WITH_BF16)
@given(attention_case(), DROPOUT, SEEDS)
# one query over keys of no full tile; heads that v alone adds (the GPU runs the reference there)
@example(case=(*normal(0, (1, 3), (7, 3), (7, 2)), False), dropout_p=0.3, seed=1)
@example(case=(*normal(1, (1, 5, 8), (1, 5, 8), (2, 5, 8)), True), dropout_p=0.3, seed=2)
# one key: dS is a cancellation to zero, and dK sums 38 queries of its rounding
@example(case=(*normal(0, (38, 1), (1, 1), (1, 64)), False), dropout_p=0.0, seed=0)
def test_scaled_dot_product_attention(device, dtype, case, dropout_p, seed):
    q, k, v, causal = case
    assert_fast_equals_reference(
        attend(causal, dropout_p, seed),
        [q, k, v],
        device,
        dtype,
        reference_without_tf32=True,
        terms=largest_term_of_heads(q, k, v),
    )


@checks_fast_path_of(F.MultiHeadAttention)
@pytest.mark.parametrize("dtype", WITH_BF16)
@given(st.integers(1, 2), SIZES, st.integers(1, 3), HEAD_WIDTHS, BIAS_SCALES, DROPOUT, SEEDS)
def test_multi_head_attention(device, dtype, batch, time, n_head, head_width, bias_scale, dropout_p, seed):
    """With a bias of q, k and v (every kernel adds its part as it loads them) and without one."""
    qkv, bias = normal(seed, (batch, time, 3 * n_head * head_width), 3 * n_head * head_width)
    bias = None if bias_scale is None else bias * bias_scale
    assert_packed_fast_equals_reference(qkv, bias, n_head, dropout_p, seed, device, dtype)


# (T, S, head width): causal, S - T one more than a multiple of the key tile (32 keys in the kernels of
# width 64, which heads of 8 and 3 run in zero-padded; 16 in those of width 128), so that the last key a
# tile of queries sees is the first of a key tile; T a whole query tile or not, and a single query
CAUSAL_KEY_EDGES = [
    (32, 65, 64),
    (64, 97, 64),
    (31, 32, 64),
    (5, 38, 8),
    (1, 34, 3),
    (16, 33, 128),
    (32, 49, 128),
    (7, 24, 100),
    (1, 18, 128),
]


@pytest.mark.parametrize("n_queries, n_keys, width", CAUSAL_KEY_EDGES)
def test_causal_attention_where_the_last_key_seen_starts_a_tile(device, n_queries, n_keys, width):
    """A key range one short (or one long) of what a causal row sees shows only where that key is
    the first of its tile: forward, and both backward kernels, which walk the keys and queries."""
    tile = attention_kernels.TILES["64" if width <= 64 else "128"]["backward_keys"]
    assert (n_keys - n_queries) % tile == 1, "the case no longer meets a tile's edge: update it"
    inputs = normal(n_keys, (2, n_queries, width), (2, n_keys, width), (2, n_keys, width))
    assert_fast_equals_reference(
        attend(True, 0.0, 0), inputs, device, np.float32, reference_without_tf32=True
    )


def test_the_launch_grid_reads_the_tile_sizes_where_the_kernels_write_them():
    """attention.cu writes each tile size once; the launcher reads a struct's specializations and their
    constants from it (a declaration wrapped over lines too), and finds the tiles of every kernel it
    launches."""
    text = "struct Steps<bf16, 64> {\n    static constexpr int keys = 64,\n        queries = 32;\n};"
    assert attention_kernels.cuda_tiles("Steps", text) == {"bf16, 64": {"keys": 64, "queries": 32}}
    for width in attention_kernels.WIDTHS:
        tiles = attention_kernels.TILES[str(width)]
        assert {"forward_queries", "backward_keys", "backward_queries"} <= set(tiles)
        assert f"bf16, {width}" in attention_kernels.MMA_TILES
    assert "float, 64" in attention_kernels.MMA_TILES and attention_kernels.MMA_ROWS > 0  # tf32's, and rows


@pytest.mark.parametrize("n_queries, n_keys, width", [(3, 7, 8), (5, 13, 100), (2, 9, 64)])
def test_attention_dropout_where_a_rows_mask_starts_inside_a_draw(device, n_queries, n_keys, width):
    """A row's mask positions within its example start at (its row in the example) x S: with S below
    16 and no multiple of 8, rows start and end inside one Philox draw of 8 positions, whose words a
    thread's walk along the keys must draw again exactly where the next 8 begin."""
    shape = (2, 3, n_queries, width), (2, 3, n_keys, width), (2, 3, n_keys, width)
    inputs = normal(n_keys, *shape)
    assert_fast_equals_reference(
        attend(False, 0.3, 1), inputs, device, np.float32, reference_without_tf32=True
    )


@pytest.mark.parametrize("dtype", [*WITH_BF16, "tf32"])
@pytest.mark.parametrize("dropout_p", [0.0, 0.1])
def test_multi_head_attention_at_gpt1_size(device, dtype, dropout_p):
    """GPT-1's attention: a sequence of 512 tokens, 12 heads of 64, with its attention dropout and
    c_attn's bias; "tf32": float32 under the tf32 policy (on a GPU, the tensor cores' tf32 kernels)."""
    qkv, bias = normal(0, (1, 512, 3 * 768), 3 * 768)
    precision = ag.use_precision("tf32") if dtype == "tf32" else contextlib.nullcontext()
    with precision:
        dtype = np.float32 if dtype == "tf32" else dtype
        assert_packed_fast_equals_reference(qkv, bias * 0.1, 12, dropout_p, 7, device, dtype)


@pytest.mark.parametrize("case", ["wide heads", "heads of v's own"])
def test_what_the_kernels_do_not_take_runs_the_reference(device, case):
    """Heads wider than 128, and heads that v alone adds (which share a mask), run the reference."""
    if case == "wide heads":
        (qkv,) = normal(0, (1, 9, 3 * 2 * 130))
        assert_fast_equals_reference(attend_packed(2, 0.3, 3), [qkv], device, np.float32)
    else:
        inputs = normal(0, (1, 9, 4), (1, 9, 4), (3, 9, 4))
        assert_fast_equals_reference(attend(True, 0.3, 3), inputs, device, np.float32)


@pytest.mark.parametrize("dtype", [np.float32, ag.bfloat16])
def test_attention_repeats_bit_for_bit(device, dtype):
    """No atomics in the kernels, nor in the bias's column sums: the same inputs give the same output
    and gradients, bit for bit."""
    qkv, bias = normal(0, (2, 130, 3 * 2 * 64), 3 * 2 * 64)
    results = []
    for _ in range(2):
        x = ag.tensor(qkv, requires_grad=True, dtype=dtype, device=device)
        x_bias = ag.tensor(bias, requires_grad=True, dtype=bias_dtype(dtype), device=device)
        out = attend_packed(2, 0.3, 5)(x, x_bias)
        out.backward(np.cos(np.arange(out.size)).reshape(out.shape))
        results.append((out.numpy(), backend.to_host(x.grad), backend.to_host(x_bias.grad)))
    for a, b in zip(*results):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("kind", [np.float32, "tf32", ag.bfloat16])
def test_a_nan_in_q_reaches_the_outputs_the_reference_gives_nan(device, kind):
    """A NaN in one query reaches its row of y and dq and every key's dk and dv (full attention: the row
    sees them all), on the fast paths as in the reference, dropout's decisions kept for it."""
    q, k, v = normal(4, (2, 9, 16), (2, 11, 16), (2, 11, 16))
    q[1, 4, 3] = np.nan

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, causal=False, dropout_p=0.3, generator=fresh_stream(5))

    dtype = np.float32 if kind == "tf32" else kind
    with ag.use_precision("tf32") if kind == "tf32" else contextlib.nullcontext():
        fast, reference = (
            forward_and_backward(attend, [q, k, v], device, [dtype] * 3, on) for on in (False, True)
        )
    for name, a, b in zip(["y", "dq", "dk", "dv"], fast, reference):
        np.testing.assert_array_equal(
            np.isnan(a.astype(np.float32)), np.isnan(b.astype(np.float32)), err_msg=name
        )
    assert np.isnan(reference[3][1]).all() and not np.isnan(reference[3][0]).any()
