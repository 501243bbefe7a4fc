"""The end of a post-LN sublayer as one op, layer_norm(x + dropout(y + bias)): the very numbers of
the ops it replaces; gradients against finite differences; its fast paths (the NumPy blocks, the
kernels of layer_norm.cu) against its reference in float32, float64 and bfloat16, with and without
each parameter and the dropout; the masks those of functional.dropout; errors that name the
argument."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import autograd as ag
from autograd import functional as F
from autograd.random import MaskStream
from autograd.testing import arrays, checks_fast_path_of, checks_gradient_of, leaf, shapes
from tests.helpers import (
    LEADS,
    SEEDS,
    WIDTHS,
    WITH_BF16,
    assert_paths_agree,
    check_gradients_at,
    forward_and_backward,
    mean_rounding_slack,
    normal,
    upstream,
)

PARAMETERS = ("bias", "weight", "ln_bias")


def fused(p, stream=0, **parameters):
    """residual_layer_norm(x, y, ...) with the mask of a fresh stream each call (so every call draws
    the same one)."""

    def fn(x, y, *given):
        named = dict(zip(parameters, given), **{name: None for name in PARAMETERS if name not in parameters})
        generator = None if stream is None else MaskStream(stream)  # None: the current stream
        return F.residual_layer_norm(x, y, **named, dropout_p=p, generator=generator)

    return fn


def unfused(x, y, bias, weight, ln_bias, p, stream=0):
    """The same with the ops it stands for: a bias add, F.dropout, the residual add, F.layer_norm."""
    branch = y if bias is None else y + bias
    branch = F.dropout(branch, p, generator=None if stream is None else MaskStream(stream)) if p else branch
    return F.layer_norm(x + branch, weight, ln_bias)


@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("reference", [True, False])
def test_it_gives_the_numbers_of_the_ops_it_replaces(device, reference, p):
    """In float32 the fused op and the four ops make the same roundings in the same order on the
    reference path, and on the fast paths (the same row sums, the same masks, and 8 rows: one chunk
    of every column sum): the same bits."""
    rng = np.random.default_rng(1)
    values = [normal(rng, (2, 4, 48)), normal(rng, (2, 4, 48)), normal(rng, 48), normal(rng, 48, 1.0, 1.0)]
    values.append(normal(rng, 48))
    results = []
    with ag.use_reference(reference):
        for fn in (lambda *t: unfused(*t, p), fused(p, **dict.fromkeys(PARAMETERS))):
            tensors = [leaf(v.astype(np.float32), device) for v in values]
            out = fn(*tensors)
            out.backward(np.random.default_rng(2).standard_normal(out.shape))
            results.append([out.numpy()] + [ag.backend.to_host(t.grad) for t in tensors])
    for name, a, b in zip(["out", "dx", "dy", "dbias", "dw", "dln_bias"], *results):
        np.testing.assert_array_equal(a, b, err_msg=name)


def used_several_times(fn, values, dtype, device, uses):
    """The gradients of fn's inputs (x and y in `dtype`, the parameters float32) when its output goes
    through `uses` linear layers whose outputs' sums are added: a gradient from each use."""
    rng, shape = np.random.default_rng(4), values[0].shape
    weights = [
        ag.tensor(rng.standard_normal((shape[-1], 8)), dtype=dtype, device=device) for _ in range(uses)
    ]
    upstreams = [
        ag.tensor(rng.standard_normal((*shape[:-1], 8)), dtype=dtype, device=device) for _ in weights
    ]
    dtypes = [dtype, dtype] + [np.float32] * 3
    leaves = [ag.tensor(v, requires_grad=True, dtype=d, device=device) for v, d in zip(values, dtypes)]
    out = fn(*leaves)
    sum((F.linear(out, w) * upstream).sum() for w, upstream in zip(weights, upstreams)).backward()
    return [ag.backend.to_host(t.grad).astype(np.float64) for t in leaves]


def several_uses_values(width=48, rows=(2, 4)):
    """x, y, bias, weight, ln_bias: rows of `width` (48 a warp's, 2000 a block's); 8 rows, one chunk."""
    rng = np.random.default_rng(3)
    values = [normal(rng, (*rows, width)), normal(rng, (*rows, width)), normal(rng, width)]
    return values + [normal(rng, width, 1.0, 1.0), normal(rng, width)]


@pytest.mark.parametrize("width", [48, 2000])
@pytest.mark.parametrize("uses", [1, 2, 3])
@pytest.mark.parametrize("reference", [True, False])
def test_an_output_used_several_times_gets_the_sum_of_their_gradients(device, reference, uses, width):
    """The op takes its output's gradients apart and adds them itself (sums_gradients), in the order
    they came, as the engine adds them for the unfused ops: in float32, the same bits, in the kernels
    of a warp per row and of a block per row."""
    with ag.use_reference(reference):
        fused_grads, unfused_grads = (
            used_several_times(fn, several_uses_values(width), np.float32, device, uses)
            for fn in (fused(0.2, **dict.fromkeys(PARAMETERS)), lambda *t: unfused(*t, 0.2))
        )
    for name, a, b in zip(["dx", "dy", "dbias", "dw", "dln_bias"], fused_grads, unfused_grads):
        np.testing.assert_array_equal(a, b, err_msg=name)


@pytest.mark.parametrize("width", [48, 2000])
@pytest.mark.parametrize("uses", [1, 2, 3])
def test_the_fast_path_sums_several_gradients_as_the_reference_does(device, uses, width):
    """In bfloat16, over 18 rows (three chunks of the backward, the last one short) a warp or a block
    wide: the fast path's gradients stay within a bfloat16 rounding of the reference's."""
    fn, results = fused(0.2, **dict.fromkeys(PARAMETERS)), []
    for reference in (False, True):
        with ag.use_reference(reference):
            values = several_uses_values(width, rows=(2, 9))
            results.append(used_several_times(fn, values, ag.bfloat16, device, uses))
    for name, a, b in zip(["dx", "dy", "dbias", "dw", "dln_bias"], *results):
        np.testing.assert_allclose(a, b, rtol=2**-7, atol=2**-5 * np.abs(b).max(), err_msg=name)


@pytest.mark.parametrize("reference", [True, False])
def test_two_bfloat16_gradients_are_added_with_one_rounding_as_the_engine_adds_them(device, reference):
    """Two uses whose gradients are g1 and g2 give the bits of one use whose gradient is g1 + g2
    rounded to bfloat16: what the engine's add of two bfloat16 arrays makes."""
    rng = np.random.default_rng(6)
    g1, g2 = (rng.standard_normal((2, 4, 48)).astype(ag.bfloat16) for _ in range(2))
    g12 = (g1.astype(np.float32) + g2.astype(np.float32)).astype(ag.bfloat16)
    results = []
    with ag.use_reference(reference):
        for gradients in ([g1, g2], [g12]):
            dtypes = [ag.bfloat16] * 2 + [np.float32] * 3
            leaves = [
                ag.tensor(v, requires_grad=True, dtype=d, device=device)
                for v, d in zip(several_uses_values(), dtypes)
            ]
            out = fused(0.2, **dict.fromkeys(PARAMETERS))(*leaves)
            sum((out * ag.tensor(g, dtype=ag.bfloat16, device=device)).sum() for g in gradients).backward()
            results.append([ag.backend.to_host(t.grad) for t in leaves])
    for name, a, b in zip(["dx", "dy", "dbias", "dw", "dln_bias"], *results):
        np.testing.assert_array_equal(a, b, err_msg=name)


@pytest.mark.parametrize("width", [48, 2000])
def test_its_mask_is_f_dropouts_in_a_stream_of_later_examples(device, width):
    """A stream that starts at example 5 of step 3, with two rows an example (a data-parallel rank's,
    a fine-tune's): the masks are F.dropout's, bit for bit in float32."""
    values, results = several_uses_values(width, rows=(6,)), []
    for fn in (
        fused(0.3, stream=None, **dict.fromkeys(PARAMETERS)),
        lambda *t: unfused(*t, 0.3, stream=None),
    ):
        with ag.random.use_masks(MaskStream(11, step=3, first_example=5)), ag.random.rows_per_example(2):
            leaves = [ag.tensor(v, requires_grad=True, dtype=np.float32, device=device) for v in values]
            out = fn(*leaves)
            out.backward(np.random.default_rng(2).standard_normal(out.shape))
        results.append([out.numpy()] + [ag.backend.to_host(t.grad) for t in leaves])
    for name, a, b in zip(["out", "dx", "dy", "dbias", "dw", "dln_bias"], *results):
        np.testing.assert_array_equal(a, b, err_msg=name)


@checks_gradient_of(F.ResidualLayerNorm)
@pytest.mark.parametrize("p", [0.0, 0.5])
@given(st.data())
def test_gradients(device, p, data):
    """Gradients of x, y and each parameter given match finite differences, through the same mask;
    rows are spread apart (as layer norm's test has them) so that none is near constant."""
    shape = data.draw(shapes(min_dims=1))
    x, y = (data.draw(arrays(shape)) + np.arange(shape[-1]) for _ in range(2))
    given_names = data.draw(st.sets(st.sampled_from(PARAMETERS)))
    names = [name for name in PARAMETERS if name in given_names]
    params = [leaf(data.draw(arrays(shape[-1:])), device) for _ in names]
    check_gradients_at(fused(p, **dict.fromkeys(names)), [leaf(x, device), leaf(y, device), *params])


@st.composite
def residual_inputs(draw):
    """x and y (lead..., width) at widths a warp or a block holds, or wider, and its three
    parameters, with a seed for the mask."""
    width = draw(st.one_of(st.integers(1, 40), st.sampled_from(WIDTHS)))
    lead = draw(st.sampled_from(LEADS if width <= 4096 else [(), (1,), (3,)]))
    rng = np.random.default_rng([draw(SEEDS), 2])
    x, y = normal(rng, (*lead, width), 1.0, 0.5), normal(rng, (*lead, width), 2.0)
    return x, y, normal(rng, width, 0.5), normal(rng, width, 1.0, 1.0), normal(rng, width, 0.5)


def residual_slack(x, y, parameters, names, dtype, p):
    """mean_rounding_slack of layer norm for the h = x + dropout(y + bias) the op normalises (its
    mask the first draw of stream 0, as `fused` draws it), for out, dx, dy (dx's, through the mask),
    and each parameter given: dbias sums dy's over the rows, and in bfloat16 each dy may round to
    either side (2^-8 of it), which the float32 sum keeps; dw and dln_bias as layer norm's."""
    bias, weight, _ = parameters
    scale = 0.0 if p == 1 else 1 / (1 - p)
    keep = scale * (MaskStream(0).keep_mask(y.shape, p) if p else np.ones(y.shape))
    h = x + keep * (y + (bias if "bias" in names else 0.0))
    affine = [name for name, given in (("weight", "weight"), ("bias", "ln_bias")) if given in names]
    slack_out, slack_dx, *slack_norm = mean_rounding_slack(h, weight, affine, dtype)
    slack_dy = keep * slack_dx
    if dtype == ag.bfloat16:
        centered = h - h.mean(axis=-1, keepdims=True)
        rstd = 1 / np.sqrt((centered * centered).mean(axis=-1, keepdims=True) + 1e-5)
        n, g = centered * rstd, upstream(h.shape) * (weight if "weight" in names else 1.0)
        dh = rstd * (g - g.mean(axis=-1, keepdims=True) - n * (g * n).mean(axis=-1, keepdims=True))
        slack_dy = slack_dy + 2**-8 * np.abs(keep * dh)
    by_name = {"bias": slack_dy.reshape(-1, h.shape[-1]).sum(axis=0), "weight": 0.0, "ln_bias": 0.0}
    by_name.update({{"weight": "weight", "bias": "ln_bias"}[name]: s for name, s in zip(affine, slack_norm)})
    return [slack_out, slack_dx, keep * slack_dx] + [by_name[name] for name in names]


@checks_fast_path_of(F.ResidualLayerNorm)
@pytest.mark.parametrize("dtype", WITH_BF16)
@pytest.mark.parametrize("p", [0.0, 0.1, 1.0])
@given(residual_inputs(), st.sets(st.sampled_from(PARAMETERS)))
def test_fast_paths_give_the_references_numbers(device, dtype, p, case, given_names):
    """Each path's output and every gradient in the reference's type, within that type's tolerance
    plus the slack of each path's own rounding of a row's mean (as layer norm's)."""
    x, y, *parameters = case
    names = [name for name in PARAMETERS if name in given_names]
    params = [dict(zip(PARAMETERS, parameters))[name] for name in names]
    dtypes = [dtype, dtype] + [np.float32 if dtype == ag.bfloat16 else dtype] * len(params)
    slack = residual_slack(x, y, parameters, names, dtype, p)
    assert_paths_agree(fused(p, **dict.fromkeys(names)), [x, y, *params], dtypes, device, slack)


@pytest.mark.parametrize("dtype", [np.float32, ag.bfloat16])
def test_the_fast_path_repeats_bit_for_bit(device, dtype):
    """The column sums add 2048 rows in a fixed order and the masks are the stream's: two runs of
    GPT-1's width give the same bits."""
    rng = np.random.default_rng(5)
    values = [normal(rng, (4, 512, 768)) for _ in range(2)] + [normal(rng, 768) for _ in range(3)]
    dtypes = [dtype, dtype] + [np.float32] * 3
    fn = fused(0.1, **dict.fromkeys(PARAMETERS))
    first, second = (forward_and_backward(fn, values, device, dtypes, reference=False) for _ in range(2))
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


def test_its_mask_is_the_next_draw_of_the_stream_and_evaluation_draws_none(device):
    """Training, it uses one draw of the current stream, as F.dropout would; not training, none."""
    x, y = (leaf(np.ones((2, 3, 8)), device) for _ in range(2))
    stream = MaskStream(7)
    with ag.random.use_masks(stream):
        F.residual_layer_norm(x, y, None, None, None, dropout_p=0.5, training=False)
        assert stream.site == 0
        F.residual_layer_norm(x, y, None, None, None, dropout_p=0.5)
        assert stream.site == 1


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(y=np.ones((2, 4))), "y has shape"),
        (dict(bias=np.ones(3)), "bias has shape"),
        (dict(weight=np.ones((1, 4))), "weight has shape"),
        (dict(ln_bias=np.ones(5)), "ln_bias has shape"),
        (dict(dropout_p=1.5), "dropout_p must be a probability"),
    ],
)
def test_bad_arguments_are_named(change, message):
    arguments = dict(x=np.ones((3, 4)), y=np.ones((3, 4)), bias=None, weight=None, ln_bias=None) | change
    tensors = {k: leaf(v) if isinstance(v, np.ndarray) else v for k, v in arguments.items()}
    with pytest.raises(ValueError, match=f"residual_layer_norm: {message}"):
        F.residual_layer_norm(**tensors)
