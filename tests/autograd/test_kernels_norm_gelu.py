"""The fast paths of layer norm and of GPT-1's GELU give their references' numbers: on the CPU (the
NumPy paths) and on a GPU (the CUDA kernels of layer_norm.cu and gelu.cu), in float32, float64 (the
reference on a GPU) and bfloat16, at GPT-1's sizes and at awkward ones.

Layer norm mixes floating types: under bf16 its x is bfloat16 and its weight and bias float32, so
its comparison builds each input in its own type and checks that both paths give the same types
(y and dx in x's, dw and db in the weights'), and values within the tolerance of each one's type.
GELU with the bias of the linear layer before it does the same."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import autograd as ag
from autograd import functional as F
from autograd import kernels
from autograd.kernels import gelu as gelu_kernels
from autograd.kernels import launching
from autograd.kernels import layer_norm as layer_norm_kernels
from autograd.testing import checks_fast_path_of, shapes
from tests.helpers import (
    GPT1_WIDTH,
    LEADS,
    SEEDS,
    WIDTHS,
    WITH_BF16,
    assert_paths_agree,
    column_sums_in_their_order,
    forward_and_backward,
    layer_norm_dtypes,
    mean_rounding_slack,
    normal,
    upstream,
)

GPT1_CONTEXT, GPT1_INNER = 512, 3072
AFFINE = [(), ("weight",), ("bias",), ("weight", "bias")]


# ----------------------------------------------------------------------------------------------
# layer norm


@st.composite
def layer_norm_inputs(draw):
    """x (lead..., width) at a scale, shifted (the mean matters) where the shift is not many times the
    spread: rounding in the mean, which the two paths sum in different orders, grows by 1 / std in
    the output (mean_rounding_slack); and a weight and a bias of (width,). Wide rows come in few of
    them."""
    width = draw(st.one_of(st.integers(1, 40), st.sampled_from(WIDTHS)))
    lead = draw(st.sampled_from(LEADS if width <= 4096 else [(), (1,), (3,)]))
    rng = np.random.default_rng([draw(SEEDS), 1])  # not upstream()'s: a dy along x cancels dx away
    scale, shift = draw(st.sampled_from([(0.1, 0.0), (1.0, 0.0), (10.0, 0.0), (1.0, 3.0), (10.0, -5.0)]))
    x = normal(rng, (*lead, width), scale, shift)
    return x, normal(rng, width, 1.0, 1.0), normal(rng, width, 0.5)


def assert_layer_norm_paths_agree(x, weight, bias, affine, dtype, device):
    """layer_norm(x) with the weight, the bias, both or neither (`affine` names them): the paths agree
    within the tolerance of each output's type plus mean_rounding_slack."""
    params = [{"weight": weight, "bias": bias}[name] for name in affine]
    assert_paths_agree(
        lambda x, *p: F.layer_norm(x, **dict(zip(affine, p))),
        [x, *params],
        layer_norm_dtypes(dtype, len(params)),
        device,
        mean_rounding_slack(x, weight, affine, dtype),
    )


@checks_fast_path_of(F.LayerNorm)
@pytest.mark.parametrize("dtype", WITH_BF16)
@pytest.mark.parametrize("affine", AFFINE)
@given(layer_norm_inputs())
def test_layer_norm(device, dtype, affine, case):
    """Each of the four cases of weight and bias, at widths a warp or a block holds and wider."""
    assert_layer_norm_paths_agree(*case, affine, dtype, device)


# rows of 3 entries whose spread is tiny beside their values (about 0.01 at 2 to 4: rstd near 100): a
# unit of roundoff in a mean moves dx by 1e-3, some 40 times what a tolerance scaled by the largest
# entry allows
TIGHT_ROWS = [
    [-2.165195, -2.1815467, -2.1297424],
    [-2.2856379, -2.2667863, -2.3054844],
    [-4.104449, -4.1049914, -4.0929956],
]


@pytest.mark.parametrize("affine", AFFINE)
def test_layer_norm_of_rows_whose_spread_is_tiny_beside_their_values(device, affine):
    """The paths differ here by the rounding of the mean, no more (a wrong mean or rstd is far more)."""
    weight, bias = np.array([0.3, 1.7, -1.1]), np.array([0.2, -0.4, 0.9])
    assert_layer_norm_paths_agree(np.array(TIGHT_ROWS), weight, bias, affine, np.float32, device)


@pytest.mark.parametrize("dtype", WITH_BF16)
def test_layer_norm_at_gpt1s_size(device, dtype):
    """(2, 512, 768): 1024 rows of GPT-1's width, with GPT-1's eps."""
    rng = np.random.default_rng(3)
    x = normal(rng, (2, GPT1_CONTEXT, GPT1_WIDTH), 2.0, 0.5)
    weight, bias = normal(rng, GPT1_WIDTH, 0.2, 1.0), normal(rng, GPT1_WIDTH, 0.1)
    assert_layer_norm_paths_agree(x, weight, bias, ("weight", "bias"), dtype, device)


def test_layer_norm_with_bfloat16_weights(device):
    """bfloat16 x with bfloat16 weight and bias (not the bf16 policy's, but allowed): dw and db
    come back in bfloat16, as the reference gives them."""
    rng = np.random.default_rng(4)
    x, weight, bias = normal(rng, (5, 40)), normal(rng, 40, 1.0, 1.0), normal(rng, 40)
    assert_paths_agree(F.layer_norm, [x, weight, bias], [ag.bfloat16] * 3, device)


@pytest.mark.parametrize("dtype", [np.float32, ag.bfloat16])
@pytest.mark.parametrize("width", [GPT1_WIDTH, 3000])
def test_layer_norm_repeats_bit_for_bit(device, dtype, width):
    """dw and db sum 2048 rows in a fixed order: two runs give the same bits, a warp or a block per row."""
    rng = np.random.default_rng(5)
    inputs = [normal(rng, (4, 512, width)), normal(rng, width, 1.0, 1.0), normal(rng, width)]
    first, second = (
        forward_and_backward(F.layer_norm, inputs, device, layer_norm_dtypes(dtype, 2), reference=False)
        for _ in range(2)
    )
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------------------------
# GELU, of x alone and of x + b (b the bias of the linear layer before it)

# widths around a block of 256 threads (a thread a column), and GPT-1's inner width
GELU_WIDTHS = [255, 256, 257, 1000, GPT1_INNER]
GELU_SLOPE = 1.2  # GELU's slope lies within (-0.17, 1.13): |dx| <= 1.2 |dy|


@st.composite
def gelu_inputs(draw):
    """x of up to 4 axes, or a flat x around a block of 256 threads, at a scale that reaches where
    tanh saturates."""
    shape = draw(st.one_of(shapes(max_dims=4), st.sampled_from([(255,), (256,), (257,), (3, 1000)])))
    rng = np.random.default_rng(draw(SEEDS))
    return normal(rng, shape, draw(st.sampled_from([0.5, 3.0, 30.0])))


@st.composite
def gelu_with_bias_inputs(draw):
    """x (lead..., width) and a bias (width,), at a scale that reaches where tanh saturates: rows around
    a chunk of 32 (db's partial sums on a GPU), widths around a block of threads. Wide rows come in
    few of them."""
    width = draw(st.one_of(st.integers(1, 40), st.sampled_from(GELU_WIDTHS)))
    lead = draw(st.sampled_from(LEADS if width <= 1024 else [(), (1,), (3,), (33,)]))
    rng = np.random.default_rng(draw(SEEDS))
    scale = draw(st.sampled_from([0.5, 3.0, 30.0]))
    return normal(rng, (*lead, width), scale), normal(rng, width, scale)


def bias_sum_slack(shape, dtype):
    """How far apart the rounding of db's sums alone may put the two paths' db: each adds a column's n
    entries of dx (float32 math for bfloat16) in its own order, a chain of at most n additions each
    within u of a partial sum no larger than the sum of |dx| (u: the unit roundoff of that math)."""
    u = np.finfo(np.float32 if dtype == ag.bfloat16 else dtype).eps / 2
    dy = np.abs(upstream(shape)).reshape(-1, shape[-1])
    return 2 * len(dy) * u * GELU_SLOPE * dy.sum(axis=0)


def assert_gelu_paths_agree(x, bias, dtype, device):
    """gelu(x, bias=b): y, dx and db agree within their types' tolerances, db's plus bias_sum_slack; the
    bias is float32 for bfloat16 x (the bf16 policy's), as layer norm's weights are."""
    slack = [0.0, 0.0, bias_sum_slack(x.shape, dtype)]
    fn = lambda x, b: F.gelu(x, bias=b)  # noqa: E731
    assert_paths_agree(fn, [x, bias], layer_norm_dtypes(dtype, 1), device, slack)


@checks_fast_path_of(F.GELU)
@pytest.mark.parametrize("dtype", WITH_BF16)
@given(gelu_inputs())
def test_gelu(device, dtype, x):
    assert_paths_agree(F.gelu, [x], [dtype], device)


@pytest.mark.parametrize("dtype", WITH_BF16)
@given(gelu_with_bias_inputs())
def test_gelu_with_a_bias(device, dtype, case):
    """y, dx and db, for rows on both sides of a chunk's edge and widths on both sides of a block's."""
    assert_gelu_paths_agree(*case, dtype, device)


@pytest.mark.parametrize("dtype", [np.float32, ag.bfloat16])
def test_gelu_with_a_bias_whose_gradient_is_not_wanted(device, dtype):
    """A bias that wants no gradient (a frozen layer's) is still added; only dx comes back."""
    rng = np.random.default_rng(8)
    x, bias = normal(rng, (70, 300), 2.0), ag.tensor(normal(rng, 300), device=device)
    assert_paths_agree(lambda x: F.gelu(x, bias=bias), [x], [dtype], device)


@pytest.mark.parametrize("dtype", [np.float32, ag.bfloat16])
def test_gelu_with_a_bias_where_x_wants_no_gradient(device, dtype):
    """db alone: the backward still makes dx, to sum it, but gives none back."""
    rng = np.random.default_rng(9)
    x, bias = ag.tensor(normal(rng, (70, 300), 2.0), dtype=dtype, device=device), normal(rng, 300)
    slack = [0.0, bias_sum_slack(x.shape, dtype)]
    assert_paths_agree(lambda b: F.gelu(x, bias=b), [bias], [np.float32], device, slack)


@pytest.mark.parametrize("dtype", WITH_BF16)
@pytest.mark.parametrize("with_bias", [False, True])
def test_gelu_at_gpt1s_size(device, dtype, with_bias):
    """(2, 512, 3072): the MLP's inner activations, with c_fc's bias or without."""
    rng = np.random.default_rng(6)
    x, bias = normal(rng, (2, GPT1_CONTEXT, GPT1_INNER), 2.0), normal(rng, GPT1_INNER)
    if with_bias:
        assert_gelu_paths_agree(x, bias, dtype, device)
    else:
        assert_paths_agree(F.gelu, [x], [dtype], device)


def test_gelu_over_more_entries_than_a_grid_has_threads(device):
    """Without a bias x is one row on a GPU: each thread of the columns' grid-stride loop takes a second
    entry, some of them."""
    if device == "cpu":
        pytest.skip("the CPU's fast path has no grid")
    x = normal(np.random.default_rng(7), launching.blocks(2**40) * launching.THREADS + 1000, 2.0)
    assert_paths_agree(F.gelu, [x], [np.float32], device)


@pytest.mark.parametrize("dtype", [np.float32, ag.bfloat16])
def test_gelus_bias_gradient_repeats_bit_for_bit(device, dtype):
    """db sums 1024 rows in a fixed order: two runs give the same bits."""
    rng = np.random.default_rng(10)
    inputs = [normal(rng, (2, GPT1_CONTEXT, GPT1_INNER), 2.0), normal(rng, GPT1_INNER)]
    first, second = (
        forward_and_backward(
            lambda x, b: F.gelu(x, bias=b), inputs, device, layer_norm_dtypes(dtype, 1), reference=False
        )
        for _ in range(2)
    )
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


@given(st.integers(0, 100), st.integers(1, 300), SEEDS)
def test_gelus_bias_gradient_on_a_gpu_adds_each_chunks_rows_in_order_then_the_chunks(
    gpu_device, rows, width, seed
):
    """float32: db has the bits of dx's columns added as column_sums.cu adds a linear layer's bias
    gradient (each chunk's rows in order, then the chunks in order), for row counts on both sides of a
    chunk's edge."""
    rng = np.random.default_rng(seed)
    x, bias = normal(rng, (rows, width), 2.0), normal(rng, width)
    _, grad_x, grad_bias = forward_and_backward(
        lambda x, b: F.gelu(x, bias=b), [x, bias], gpu_device, [np.float32] * 2, False
    )
    np.testing.assert_array_equal(grad_bias, column_sums_in_their_order(grad_x, gelu_kernels.ROWS_PER_CHUNK))


# ----------------------------------------------------------------------------------------------
# the paths chosen


def test_a_gpu_runs_the_kernels_for_float32_and_bfloat16_where_they_fit_and_else_the_reference():
    x, w = np.zeros((2, 8), np.float32), np.ones(8, np.float32)
    for function, module, args in [
        (F.LayerNorm, layer_norm_kernels, (x, w, w, 1e-5)),
        (F.GELU, gelu_kernels, (x, w)),
    ]:
        reference = (function.forward, function.backward)
        for dtypes in [{np.dtype(np.float32)}, {ag.bfloat16, np.dtype(np.float32)}]:
            assert kernels.choose(function, True, dtypes, args) == (module.forward_gpu, module.backward_gpu)
        assert kernels.choose(function, True, {np.dtype(np.float64)}, args) == reference
    # rows wider than a block's, or none: layer norm's kernels do not fit, and the choice says so
    for x in [np.zeros((1, layer_norm_kernels.BLOCK_WIDTH + 1), np.float32), np.zeros((0, 8), np.float32)]:
        args = (x, None, None, 1e-5)
        assert kernels.choose(F.LayerNorm, True, {np.dtype(np.float32)}, args) == (
            F.LayerNorm.forward,
            F.LayerNorm.backward,
        )
