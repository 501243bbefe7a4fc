"""The fused functionals of autograd.functional, checked against direct NumPy formulas.

Each functional is a single Function with a hand-written backward. For each one these tests
check the forward value against its textbook formula, the gradient against finite differences
(in float64), the numerical edge cases the fusion is there to handle, and the error messages.
"""

import math
import re

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import autograd as ag
from autograd import backend
from autograd import functional as F
from autograd.testing import arrays, checks_gradient_of, indices, leaf, shapes
from tests import tf32
from tests.helpers import (
    SEEDS,
    attention_inputs,
    check_gradients_at,
    fresh_stream,
    linear_inputs,
    logits_and_targets,
    on_device,
    packed_heads,
    ref_gelu_tanh,
)

TOLERANCE = {np.float32: dict(rtol=1e-5, atol=1e-5), np.float64: dict(rtol=1e-10, atol=1e-12)}

pytestmark = pytest.mark.usefixtures("each_path")  # every test on the fast and the reference paths


def float_tensor(array, device, dtype):
    """A leaf tensor of `dtype` (float32 or float64) that requires grad."""
    return ag.tensor(array, requires_grad=True, dtype=dtype, device=device)


def ref_log_softmax(x, axis=-1):
    """x - log(sum(exp(x))) in float64, via numpy's logaddexp (a different route from the engine's),
    on x less its row maximum: log(sum(exp(x))) of logits near 1e4 would lose 1e-12 to rounding."""
    shifted = np.asarray(x, dtype=np.float64)
    shifted = shifted - shifted.max(axis=axis, keepdims=True)
    return shifted - np.logaddexp.reduce(shifted, axis=axis, keepdims=True)


def ref_cross_entropy(logits, targets, ignore_index, reduction):
    """-log_softmax(logits) at each target (0 where ignored); mean over the counted targets, sum, or none."""
    counted = targets != ignore_index
    safe_targets = np.where(counted, targets, 0)[..., None]
    losses = np.where(
        counted, -np.take_along_axis(ref_log_softmax(logits), safe_targets, axis=-1)[..., 0], 0.0
    )
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    return losses.sum() / counted.sum()


def ref_cross_entropy_grad(logits, targets, ignore_index, reduction):
    """d(loss)/d(logits) for an upstream gradient of ones: softmax(logits) - onehot(target) on the
    counted rows, 0 on ignored ones, divided by the number counted for "mean"."""
    counted = targets != ignore_index
    one_hot = np.eye(logits.shape[-1])[np.where(counted, targets, 0)]
    grad = (np.exp(ref_log_softmax(logits)) - one_hot) * counted[..., None]
    return grad / counted.sum() if reduction == "mean" else grad


def ref_gelu_exact(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def ref_layer_norm(x, eps, weight=1.0, bias=0.0):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis."""
    mean, var = x.mean(axis=-1, keepdims=True), x.var(axis=-1, keepdims=True)  # biased variance
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def ref_attention(q, k, v, causal):
    """softmax(q k^T / sqrt(d) + mask) v, where the causal mask hides key j from query i when j > i."""
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n_queries, n_keys = scores.shape[-2:]
        future = np.arange(n_keys)[None, :] > np.arange(n_queries)[:, None]
        scores = np.where(future, -np.inf, scores)
    weights = np.exp(scores)
    return weights / weights.sum(axis=-1, keepdims=True) @ v


def huge_logits(dtype):
    """Logits (rows, C) up to 2e4 in size, far past where exp overflows (89 in float32, 710 in float64)."""
    values = arrays(shapes(min_dims=2, max_dims=2, max_side=5), -1e4, 1e4, dtype)
    return st.tuples(values, st.sampled_from([-1e4, 0.0, 1e4])).map(
        lambda pair: (pair[0] + pair[1]).astype(dtype)
    )


# ----------------------------------------------------------------------------------------------
# linear


@given(linear_inputs())
def test_linear_is_x_times_weight_plus_bias(device, inputs):
    """linear(x, W, b) = x @ W + b on the last axis of x; W is (in, out)."""
    x, weight, bias = inputs
    out = F.linear(leaf(x, device), leaf(weight, device), None if bias is None else leaf(bias, device))
    expected = x @ weight + (0.0 if bias is None else bias)
    assert out.shape == x.shape[:-1] + weight.shape[1:]
    np.testing.assert_allclose(out.numpy(), expected, **TOLERANCE[np.float64])


@checks_gradient_of(F.Linear)
@given(linear_inputs())
def test_linear_gradient(device, inputs):
    """Gradients of x, W and (when given) b match finite differences."""
    x, weight, bias = inputs
    tensors = [leaf(a, device) for a in (x, weight, bias) if a is not None]
    check_gradients_at(F.linear, tensors)


@given(linear_inputs())
def test_linear_gradient_through_a_transposed_weight(device, each_path, inputs):
    """linear(x, W.T) (a tied LM head) gives W the gradient that finite differences find; the
    CPU's fast path lays it out like W itself (contiguous) rather than like the transposed view."""
    x, weight, bias = inputs
    tensors = [leaf(a, device) for a in (x, weight.T.copy(), bias) if a is not None]
    check_gradients_at(lambda x, table, *b: F.linear(x, table.T, *b), tensors)
    F.linear(*tensors[:1], tensors[1].T, *tensors[2:]).sum().backward()
    if each_path == "fast" and device == "cpu":
        assert tensors[1].grad.flags.c_contiguous


@pytest.mark.parametrize(
    "weight_shape, bias_shape, message",
    [
        ((4, 5), None, r"3 features.*\(4, 5\)"),  # weight rows do not match x's 3 features
        ((3,), None, r"weight.*\(3,\)"),  # weight is not (in, out)
        ((3, 4), (1,), r"bias.*\(1,\)"),  # bias is not (out,), even though it would broadcast
        ((3, 4), (2, 4), r"bias.*\(2, 4\)"),
    ],
    ids=["features", "weight_not_2d", "bias_broadcastable", "bias_2d"],
)
def test_linear_names_a_mis_shaped_weight_or_bias(device, weight_shape, bias_shape, message):
    """linear refuses a weight or bias that does not fit x (2, 3) with a ValueError naming its shape,
    before any output is made (not later, in the backward)."""
    x, weight = leaf(np.ones((2, 3)), device), leaf(np.ones(weight_shape), device)
    bias = None if bias_shape is None else leaf(np.ones(bias_shape), device)
    with pytest.raises(ValueError, match=message):
        F.linear(x, weight, bias)


# ----------------------------------------------------------------------------------------------
# embedding


@st.composite
def ids_and_table(draw):
    """A table (rows, dim) and integer ids of any shape (0 to 3 axes), often repeating rows."""
    n_rows, dim = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    ids = draw(indices(n_rows, shapes(min_dims=0)))
    return ids, draw(arrays((n_rows, dim)))


def ids_as(form, ids, device):
    """ids in one of the forms a caller may pass: a list, a raw array on the device, or a Tensor."""
    if form == "list":
        return ids.tolist()
    if form == "array":
        return on_device(ids, device)
    return ag.tensor(ids, device=device)


@given(ids_and_table(), st.sampled_from(["list", "array", "tensor"]))
def test_embedding_picks_rows_of_the_table(device, ids_and_table, ids_form):
    """embedding(ids, W) = W[ids], of shape ids.shape + (dim,), for ids as a list, array or Tensor."""
    ids, table = ids_and_table
    out = F.embedding(ids_as(ids_form, ids, device), leaf(table, device))
    assert out.shape == ids.shape + table.shape[1:]
    np.testing.assert_array_equal(out.numpy(), table[ids])


@st.composite
def ids_table_and_upstream(draw):
    """ids and a table as above, and an upstream gradient shaped like the embedding output."""
    ids, table = draw(ids_and_table())
    return ids, table, draw(arrays(ids.shape + table.shape[1:]))


@example((np.array([[1, 0], [1, 1]]), np.zeros((3, 2)), np.arange(8.0).reshape(2, 2, 2)))
@given(ids_table_and_upstream())
def test_embedding_gradient_adds_up_over_repeated_ids(device, case):
    """A table row's gradient is the sum of the upstream gradients at every position that picked it."""
    ids, table, upstream = case
    weight = leaf(table, device)
    F.embedding(on_device(ids, device), weight).backward(upstream)
    expected = np.stack([upstream[ids == row].sum(axis=0) for row in range(len(table))])
    np.testing.assert_allclose(backend.to_host(weight.grad), expected, **TOLERANCE[np.float64])


@checks_gradient_of(F.Embedding)
@given(ids_and_table())
def test_embedding_gradient(device, ids_and_table):
    """The table's gradient matches finite differences (ids carry no gradient)."""
    ids, table = ids_and_table
    ids = on_device(ids, device)
    check_gradients_at(lambda weight: F.embedding(ids, weight), [leaf(table, device)])


@pytest.mark.parametrize("bad_id", [-1, 3])
def test_embedding_rejects_ids_outside_the_table(device, bad_id):
    """Ids must lie in [0, rows): negative ids are not read from the end as NumPy would."""
    with pytest.raises(IndexError, match=r"\[0, 3\)"):
        F.embedding([0, bad_id], leaf(np.ones((3, 2)), device))


def test_float_ids_and_targets_are_refused(device):
    """Indices must be integers: a float id or target is a TypeError, not a silent cast."""
    table = leaf(np.ones((3, 2)), device)
    with pytest.raises(TypeError, match="integers"):
        F.embedding([0.0, 1.0], table)
    with pytest.raises(TypeError, match="integers"):
        F.cross_entropy(table, [0.0, 1.0, 1.0])


# ----------------------------------------------------------------------------------------------
# softmax and log_softmax


@st.composite
def array_and_axis(draw):
    """An array with 1 to 3 axes and one of its axes, counted from either end."""
    x = draw(arrays(shapes(min_dims=1)))
    return x, draw(st.integers(-x.ndim, x.ndim - 1))


@given(array_and_axis())
def test_softmax_is_normalised_exp(device, x_and_axis):
    """softmax(x, axis) = exp(x) / sum(exp(x)) along axis: entries in [0, 1] summing to 1."""
    x, axis = x_and_axis
    out = F.softmax(leaf(x, device), axis=axis).numpy()
    np.testing.assert_allclose(
        out, np.exp(x) / np.exp(x).sum(axis=axis, keepdims=True), **TOLERANCE[np.float64]
    )
    np.testing.assert_allclose(out.sum(axis=axis), 1.0, rtol=1e-12)
    assert ((out >= 0) & (out <= 1)).all()


@given(array_and_axis())
def test_log_softmax_is_log_of_softmax(device, x_and_axis):
    """log_softmax(x, axis) = log(softmax(x, axis)) = x - log(sum(exp(x))) along axis."""
    x, axis = x_and_axis
    out = F.log_softmax(leaf(x, device), axis=axis).numpy()
    np.testing.assert_allclose(
        out, np.log(F.softmax(leaf(x, device), axis=axis).numpy()), **TOLERANCE[np.float64]
    )
    np.testing.assert_allclose(
        out, x - np.log(np.exp(x).sum(axis=axis, keepdims=True)), **TOLERANCE[np.float64]
    )


@checks_gradient_of(F.Softmax, F.LogSoftmax)
@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax])
@given(array_and_axis())
def test_softmax_and_log_softmax_gradients(device, fn, x_and_axis):
    """Gradients along any axis match finite differences."""
    x, axis = x_and_axis
    check_gradients_at(lambda x: fn(x, axis=axis), [leaf(x, device)])


def softmax_vjp(x, upstream):
    """The gradient of sum(upstream * softmax(x)) over the last axis: p * (upstream - <upstream, p>)."""
    p = np.exp(ref_log_softmax(x))
    return p * (upstream - (upstream * p).sum(axis=-1, keepdims=True))


def log_softmax_vjp(x, upstream):
    """The gradient of sum(upstream * log_softmax(x)) over the last axis: upstream - p * sum(upstream)."""
    return upstream - np.exp(ref_log_softmax(x)) * upstream.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "fn, ref_forward, ref_backward",
    [
        (F.softmax, lambda x: np.exp(ref_log_softmax(x)), softmax_vjp),
        (F.log_softmax, ref_log_softmax, log_softmax_vjp),
    ],
    ids=["softmax", "log_softmax"],
)
@given(st.data())
def test_softmax_and_log_softmax_of_huge_logits(device, dtype, fn, ref_forward, ref_backward, data):
    """Logits of size 1e4 give finite values and gradients that match a float64 reference."""
    x = data.draw(huge_logits(dtype))
    upstream = np.random.default_rng(0).standard_normal(x.shape)
    xt = float_tensor(x, device, dtype)
    out = fn(xt)
    out.backward(upstream)
    grad = backend.to_host(xt.grad)
    assert np.isfinite(out.numpy()).all() and np.isfinite(grad).all()
    x64 = x.astype(np.float64)  # the reference sees exactly the values the engine saw
    np.testing.assert_allclose(out.numpy(), ref_forward(x64), **TOLERANCE[dtype])
    np.testing.assert_allclose(grad, ref_backward(x64, upstream.astype(dtype)), **TOLERANCE[dtype])


# ----------------------------------------------------------------------------------------------
# cross_entropy

REDUCTIONS = ["mean", "sum", "none"]


@pytest.mark.parametrize("reduction", REDUCTIONS)
@given(logits_and_targets())
def test_cross_entropy_is_negative_log_softmax_at_the_targets(device, reduction, case):
    """Each loss is -log_softmax(logits)[target]; "mean" averages over the targets not ignored,
    "sum" adds them, "none" keeps one loss per target (0 where ignored)."""
    logits, targets, ignore_index = case
    loss = F.cross_entropy(
        leaf(logits, device), on_device(targets, device), ignore_index=ignore_index, reduction=reduction
    )
    expected = ref_cross_entropy(logits, targets, ignore_index, reduction)
    assert loss.shape == np.shape(expected)
    np.testing.assert_allclose(loss.numpy(), expected, **TOLERANCE[np.float64])


@pytest.mark.parametrize("reduction", REDUCTIONS)
@given(logits_and_targets())
def test_cross_entropy_gradient_is_softmax_minus_one_hot(device, reduction, case):
    """d(loss)/d(logits) = softmax(logits) - onehot(target) on counted rows (divided by their number
    for "mean") and 0 on ignored rows."""
    logits, targets, ignore_index = case
    z = leaf(logits, device)
    loss = F.cross_entropy(z, on_device(targets, device), ignore_index=ignore_index, reduction=reduction)
    loss.backward(np.ones(loss.shape))
    expected = ref_cross_entropy_grad(logits, targets, ignore_index, reduction)
    np.testing.assert_allclose(backend.to_host(z.grad), expected, **TOLERANCE[np.float64])


@checks_gradient_of(F.CrossEntropy)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@given(logits_and_targets())
def test_cross_entropy_gradient(device, reduction, case):
    """The logits' gradient matches finite differences for every reduction, with ignored targets."""
    logits, targets, ignore_index = case
    targets = on_device(targets, device)
    check_gradients_at(
        lambda z: F.cross_entropy(z, targets, ignore_index=ignore_index, reduction=reduction),
        [leaf(logits, device)],
    )


@pytest.mark.parametrize("reduction", REDUCTIONS)
@given(arrays(shapes(min_dims=2, max_dims=3)))
def test_cross_entropy_with_every_target_ignored_is_zero(device, reduction, logits):
    """With every target ignored the loss is 0 (not 0/0 = NaN) and so is the gradient."""
    z = leaf(logits, device)
    loss = F.cross_entropy(z, on_device(np.full(logits.shape[:-1], -100), device), reduction=reduction)
    loss.backward(np.ones(loss.shape))
    np.testing.assert_array_equal(loss.numpy(), np.zeros(loss.shape))
    np.testing.assert_array_equal(backend.to_host(z.grad), np.zeros(logits.shape))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@given(st.data())
def test_cross_entropy_of_huge_logits(device, dtype, reduction, data):
    """Logits of size 1e4 give a finite loss and gradient that match a float64 reference."""
    logits, targets, ignore_index = data.draw(logits_and_targets(logits=data.draw(huge_logits(dtype))))
    z = float_tensor(logits, device, dtype)
    loss = F.cross_entropy(z, on_device(targets, device), ignore_index=ignore_index, reduction=reduction)
    loss.backward(np.ones(loss.shape))
    grad = backend.to_host(z.grad)
    assert np.isfinite(loss.numpy()).all() and np.isfinite(grad).all()
    logits64 = logits.astype(np.float64)  # the reference sees exactly the values the engine saw
    np.testing.assert_allclose(
        loss.numpy(), ref_cross_entropy(logits64, targets, ignore_index, reduction), **TOLERANCE[dtype]
    )
    np.testing.assert_allclose(
        grad, ref_cross_entropy_grad(logits64, targets, ignore_index, reduction), **TOLERANCE[dtype]
    )


@pytest.mark.parametrize("bad_target", [-1, 3])
def test_cross_entropy_rejects_targets_outside_the_classes(device, bad_target):
    """Targets must lie in [0, C) unless they equal ignore_index."""
    with pytest.raises(IndexError, match=r"\[0, 3\)"):
        F.cross_entropy(leaf(np.zeros((2, 3)), device), [0, bad_target])


def test_cross_entropy_rejects_an_unknown_reduction(device):
    """reduction must be "mean", "sum" or "none"; the message repeats the name given."""
    with pytest.raises(ValueError, match="reduction.*'avg'"):
        F.cross_entropy(leaf(np.zeros((2, 3)), device), [0, 1], reduction="avg")


def test_cross_entropy_names_mismatched_target_shape(device):
    """Targets must have the logits' shape without the class axis; both shapes are in the message."""
    with pytest.raises(ValueError, match=r"\(2, 4\).*\(2, 3, 4\)"):
        F.cross_entropy(leaf(np.zeros((2, 3, 4)), device), np.zeros((2, 4), dtype=np.int64))


# ----------------------------------------------------------------------------------------------
# gelu


@given(arrays(shapes(), -6.0, 6.0))
def test_gelu_tanh_is_gpt1_formula(device, x):
    """gelu(x, "tanh") = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), GPT-1's approximation."""
    np.testing.assert_allclose(
        F.gelu(leaf(x, device), approximate="tanh").numpy(), ref_gelu_tanh(x), **TOLERANCE[np.float64]
    )


@given(arrays(shapes(), -6.0, 6.0))
def test_gelu_exact_is_x_times_normal_cdf(device, x):
    """gelu(x, "none") = x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)); the tanh form is within 1e-3 of it."""
    exact = F.gelu(leaf(x, device), approximate="none").numpy()
    np.testing.assert_allclose(exact, ref_gelu_exact(x), **TOLERANCE[np.float64])
    np.testing.assert_allclose(F.gelu(leaf(x, device)).numpy(), exact, rtol=0, atol=1e-3)


@checks_gradient_of(F.GELU, F.ExactGELU)
@pytest.mark.parametrize("approximate", ["tanh", "none"])
@given(arrays(shapes(), -6.0, 6.0))
def test_gelu_gradient(device, approximate, x):
    """Gradients of both forms match finite differences."""
    check_gradients_at(lambda x: F.gelu(x, approximate=approximate), [leaf(x, device)])


@st.composite
def gelu_with_bias_inputs(draw):
    """x of 1 to 3 axes and a bias over its last axis."""
    x = draw(arrays(shapes(min_dims=1), -6.0, 6.0))
    return x, draw(arrays(x.shape[-1:]))


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@given(gelu_with_bias_inputs())
def test_gelu_with_a_bias_is_gelu_of_the_sum(device, approximate, case):
    """gelu(x, bias=b) = gelu(x + b), b added to every row."""
    x, bias = case
    y = F.gelu(leaf(x, device), approximate, bias=leaf(bias, device)).numpy()
    expected = (ref_gelu_tanh if approximate == "tanh" else ref_gelu_exact)(x + bias)
    np.testing.assert_allclose(y, expected, **TOLERANCE[np.float64])


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@given(gelu_with_bias_inputs())
def test_gelu_gradient_with_a_bias(device, approximate, case):
    """Gradients of x and of the bias (dx summed over the rows) match finite differences."""
    x, bias = case
    check_gradients_at(
        lambda x, b: F.gelu(x, approximate=approximate, bias=b), [leaf(x, device), leaf(bias, device)]
    )


@pytest.mark.parametrize(
    ("x_shape", "bias_shape"), [((2, 3), (2,)), ((2, 3), (1, 3)), ((2, 3), ()), ((), ())]
)
def test_gelu_rejects_a_bias_not_over_xs_last_axis(device, x_shape, bias_shape):
    """The bias is one number per entry of x's last axis; the message names both shapes."""
    x, bias = leaf(np.zeros(x_shape), device), leaf(np.zeros(bias_shape), device)
    with pytest.raises(ValueError, match="^gelu: bias") as error:
        F.gelu(x, bias=bias)
    assert str(bias_shape) in str(error.value) and str(x_shape) in str(error.value)


def test_gelu_rejects_an_unknown_approximation(device):
    """approximate must be "tanh" or "none"; the message repeats the name given."""
    with pytest.raises(ValueError, match="'sigmoid'"):
        F.gelu(leaf(np.zeros(3), device), approximate="sigmoid")


# ----------------------------------------------------------------------------------------------
# layer_norm

AFFINE = [(), ("weight",), ("bias",), ("weight", "bias")]


@given(arrays(shapes(min_dims=1)), st.sampled_from([1e-5, 0.1]))
def test_layer_norm_gives_rows_mean_zero_and_unit_variance(device, x, eps):
    """Without weight and bias each row becomes (x - mean) / sqrt(var + eps) with the biased
    variance: mean 0, variance var / (var + eps), i.e. 1 but for eps."""
    out = F.layer_norm(leaf(x, device), eps=eps).numpy()
    var = x.var(axis=-1)
    np.testing.assert_allclose(out, ref_layer_norm(x, eps), **TOLERANCE[np.float64])
    np.testing.assert_allclose(out.mean(axis=-1), 0.0, atol=1e-10)
    np.testing.assert_allclose(out.var(axis=-1), var / (var + eps), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("affine", AFFINE)
@given(st.data())
def test_layer_norm_weight_scales_and_bias_shifts(device, affine, data):
    """layer_norm(x, w, b) = normalised x * w + b, with either of w and b optional."""
    x = data.draw(arrays(shapes(min_dims=1)))
    params = {name: data.draw(arrays(x.shape[-1:])) for name in affine}
    out = F.layer_norm(leaf(x, device), **{name: leaf(p, device) for name, p in params.items()})
    np.testing.assert_allclose(out.numpy(), ref_layer_norm(x, 1e-5, **params), **TOLERANCE[np.float64])


@checks_gradient_of(F.LayerNorm)
@pytest.mark.parametrize("affine", AFFINE)
@given(st.data())
def test_layer_norm_gradient(device, affine, data):
    """Gradients of x and of the weight and bias that are given match finite differences.
    Near a constant row the output moves 1 / sqrt(eps) times faster than x, which finite
    differences cannot follow at eps = 1e-5: there the rows are spread apart by 0, 1, 2, ..."""
    x = data.draw(arrays(shapes(min_dims=1)))
    eps = data.draw(st.sampled_from([1e-5, 0.1]))
    if eps < 0.1:
        x = x + np.arange(x.shape[-1])
    params = [leaf(data.draw(arrays(x.shape[-1:])), device) for _ in affine]
    check_gradients_at(
        lambda x, *params: F.layer_norm(x, eps=eps, **dict(zip(affine, params))),
        [leaf(x, device), *params],
    )


@given(st.data())
def test_layer_norm_of_constant_rows_is_the_bias(device, data):
    """A constant row has variance 0: eps keeps the output finite (equal to the bias) and the
    gradients finite and right."""
    shape = data.draw(shapes(min_dims=1))
    x = np.broadcast_to(data.draw(arrays(shape[:-1] + (1,))), shape).copy()
    weight, bias = (data.draw(arrays(shape[-1:])) for _ in range(2))
    out = F.layer_norm(leaf(x, device), leaf(weight, device), leaf(bias, device))
    np.testing.assert_allclose(out.numpy(), np.broadcast_to(bias, shape), rtol=0, atol=1e-9)
    # finite differences follow a slope of 1 / sqrt(eps) only for a large eps
    check_gradients_at(
        lambda x, w, b: F.layer_norm(x, w, b, eps=0.1),
        [leaf(x, device), leaf(weight, device), leaf(bias, device)],
    )


@pytest.mark.parametrize("name", ["weight", "bias"])
def test_layer_norm_names_a_mis_shaped_parameter(device, name):
    """weight and bias must have the shape of x's last axis; the message gives both shapes."""
    with pytest.raises(ValueError, match=rf"{name} has shape \(3,\), expected \(4,\)"):
        F.layer_norm(leaf(np.ones((2, 4)), device), **{name: leaf(np.ones(3), device)})


# ----------------------------------------------------------------------------------------------
# dropout


@given(st.floats(0.05, 0.95), SEEDS)
def test_dropout_zeroes_a_fraction_p_and_keeps_the_mean(device, p, seed):
    """Each entry is zeroed with probability p and the rest scaled by 1 / (1 - p), so on a large
    array the fraction zeroed is near p and the mean stays near 1 (bounds of 6 standard deviations)."""
    n = 50_000
    x = leaf(np.ones(n), device, requires_grad=False)
    out = F.dropout(x, p, generator=fresh_stream(seed)).numpy()
    zeroed = out == 0
    np.testing.assert_allclose(out[~zeroed], 1 / (1 - p), rtol=1e-12)
    assert abs(zeroed.mean() - p) <= 6 * math.sqrt(p * (1 - p) / n)
    assert abs(out.mean() - 1) <= 6 * math.sqrt(p / ((1 - p) * n))


@given(st.floats(0.1, 0.9), SEEDS)
def test_dropout_mask_is_reproducible_from_the_seed(device, p, seed):
    """Streams with the same seed draw the same mask; a different seed draws another one."""
    x = leaf(np.ones((64, 64)), device, requires_grad=False)
    first = F.dropout(x, p, generator=fresh_stream(seed)).numpy()
    again = F.dropout(x, p, generator=fresh_stream(seed)).numpy()
    other = F.dropout(x, p, generator=fresh_stream(seed + 1)).numpy()
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


def test_manual_seed_makes_the_default_stream_reproducible(device):
    """Without a stream, dropout draws from the default one, restarted by manual_seed."""
    x = leaf(np.ones(1000), device, requires_grad=False)
    ag.manual_seed(1234)
    first, second = F.dropout(x, 0.5).numpy(), F.dropout(x, 0.5).numpy()
    ag.manual_seed(1234)
    np.testing.assert_array_equal(F.dropout(x, 0.5).numpy(), first)
    assert not np.array_equal(first, second)  # the default stream moves on between calls


@given(arrays(shapes()), st.floats(0.0, 1.0))
def test_dropout_is_the_identity_in_evaluation_and_at_p_zero(device, x, p):
    """training=False (any p) or p = 0 passes x through unchanged."""
    t = leaf(x, device)
    np.testing.assert_array_equal(F.dropout(t, p, training=False).numpy(), x)
    np.testing.assert_array_equal(F.dropout(t, 0.0).numpy(), x)


def test_dropout_with_p_one_zeroes_everything_without_nan(device):
    """p = 1 drops every entry: the output and gradient are 0, not 0 * inf."""
    x = leaf(np.arange(1.0, 13.0).reshape(3, 4), device)
    out = F.dropout(x, 1.0, generator=fresh_stream(0))
    out.backward(np.ones(out.shape))
    np.testing.assert_array_equal(out.numpy(), np.zeros(x.shape))
    np.testing.assert_array_equal(backend.to_host(x.grad), np.zeros(x.shape))


@checks_gradient_of(F.Dropout)
@given(arrays(shapes()), st.floats(0.1, 0.9), SEEDS)
def test_dropout_gradient(device, x, p, seed):
    """With a fresh stream of one seed per call, every call draws the same mask, so dropout is
    a fixed function whose gradient finite differences can check."""
    check_gradients_at(lambda x: F.dropout(x, p, generator=fresh_stream(seed)), [leaf(x, device)])


@pytest.mark.parametrize("p", [-0.1, 1.5, math.nan])
def test_dropout_rejects_p_outside_zero_one(device, p):
    """dropout's p and attention's dropout_p must be probabilities (NaN included in the refusal)."""
    x = leaf(np.ones((2, 3, 4)), device)
    with pytest.raises(ValueError, match="probability"):
        F.dropout(x, p)
    with pytest.raises(ValueError, match="probability"):
        F.scaled_dot_product_attention(x, x, x, dropout_p=p)


# ----------------------------------------------------------------------------------------------
# scaled_dot_product_attention


@given(attention_inputs())
def test_attention_is_softmax_of_scaled_scores_times_values(device, inputs):
    """Output = softmax(q k^T / sqrt(d) + causal mask) v, computed directly in NumPy."""
    q, k, v, causal = inputs
    out = F.scaled_dot_product_attention(leaf(q, device), leaf(k, device), leaf(v, device), causal=causal)
    np.testing.assert_allclose(out.numpy(), ref_attention(q, k, v, causal), rtol=1e-10, atol=1e-12)


@given(attention_inputs(causal=st.just(True)), st.data())
def test_causal_attention_does_not_look_ahead(device, inputs, data):
    """With causal=True, the outputs up to position t stay the same whatever q, k and v hold after t."""
    q, k, v, _ = inputs
    t = data.draw(st.integers(0, q.shape[-2] - 1))
    changed = []
    for a in (q, k, v):
        a = a.copy()
        a[..., t + 1 :, :] = data.draw(arrays(a[..., t + 1 :, :].shape))
        changed.append(a)

    def attend(q, k, v):
        return F.scaled_dot_product_attention(*(leaf(a, device) for a in (q, k, v)), causal=True).numpy()

    np.testing.assert_allclose(
        attend(*changed)[..., : t + 1, :], attend(q, k, v)[..., : t + 1, :], rtol=1e-12, atol=1e-12
    )


@checks_gradient_of(F.ScaledDotProductAttention)
@given(attention_inputs(), st.sampled_from([0.0, 0.3]), SEEDS)
def test_attention_gradient(device, inputs, dropout_p, seed):
    """Gradients of q, k and v match finite differences: causal or not, T != S, shared heads, and
    with dropout on the attention weights (one seed per call, so each call drops the same ones)."""
    q, k, v, causal = inputs

    def attend(q, k, v):
        return F.scaled_dot_product_attention(
            q, k, v, causal=causal, dropout_p=dropout_p, generator=fresh_stream(seed)
        )

    check_gradients_at(attend, [leaf(q, device), leaf(k, device), leaf(v, device)])


@given(st.floats(0.1, 0.9), SEEDS)
def test_attention_dropout_drops_attention_weights(device, p, seed):
    """With v the identity the output is the attention weights themselves. Under dropout each
    weight becomes 0 or weight / (1 - p), and about a fraction p become 0."""
    rng = np.random.default_rng(seed)
    heads, n = 4, 32
    q, k = leaf(rng.standard_normal((heads, n, 8)), device), leaf(rng.standard_normal((heads, n, 8)), device)
    identity = leaf(np.eye(n), device)
    weights = F.scaled_dot_product_attention(q, k, identity, causal=False).numpy()
    dropped = F.scaled_dot_product_attention(
        q, k, identity, causal=False, dropout_p=p, generator=fresh_stream(seed)
    ).numpy()
    zeroed = dropped == 0  # softmax weights are positive, so only dropout makes zeros
    np.testing.assert_allclose(dropped[~zeroed], weights[~zeroed] / (1 - p), rtol=1e-12)
    assert abs(zeroed.mean() - p) <= 6 * math.sqrt(p * (1 - p) / zeroed.size)


def split_attention(qkv, n_head, **options):
    """multi_head_attention the long way: split qkv into heads, attend, merge the heads back."""
    batch, time, width3 = qkv.shape
    heads = qkv.reshape(batch, time, 3, n_head, width3 // (3 * n_head))
    q, k, v = (heads[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    y = F.scaled_dot_product_attention(q, k, v, causal=True, **options)
    return y.transpose(0, 2, 1, 3).reshape(batch, time, width3 // 3)


def split_attention_plus_bias(qkv, n_head, bias=None, **options):
    """split_attention of qkv + bias: the bias added by an op of its own."""
    return split_attention(qkv if bias is None else qkv + bias, n_head, **options)


@given(packed_heads(), st.booleans(), st.sampled_from([0.0, 0.3]), SEEDS, st.data())
def test_multi_head_attention_equals_splitting_the_heads(device, case, with_bias, dropout_p, seed, data):
    """One op gives the same output and gradients as Add (the bias, when there is one), GetItem,
    scaled_dot_product_attention, Transpose and Reshape, with the same dropout mask from the same seed."""
    qkv, n_head = case
    bias = data.draw(arrays(qkv.shape[-1:])) if with_bias else None
    results = []
    for attend in (F.multi_head_attention, split_attention_plus_bias):
        x, b = leaf(qkv, device), None if bias is None else leaf(bias, device)
        out = attend(x, n_head, dropout_p=dropout_p, generator=fresh_stream(seed), bias=b)
        out.backward(np.cos(np.arange(out.size)).reshape(out.shape))
        results.append((out.numpy(), x.grad) + (() if b is None else (b.grad,)))
    for fused, split in zip(*results):
        np.testing.assert_allclose(backend.to_host(fused), backend.to_host(split), rtol=1e-12, atol=1e-12)


@checks_gradient_of(F.MultiHeadAttention)
@given(packed_heads(), st.booleans(), st.sampled_from([0.0, 0.3]), SEEDS, st.data())
def test_multi_head_attention_gradient(device, case, with_bias, dropout_p, seed, data):
    """The gradients of qkv and of a bias added to it (when there is one) match finite differences, with
    and without dropout."""
    qkv, n_head = case
    inputs = [leaf(qkv, device)]
    if with_bias:
        inputs.append(leaf(data.draw(arrays(qkv.shape[-1:])), device))

    def attend(qkv, bias=None):
        return F.multi_head_attention(
            qkv, n_head, dropout_p=dropout_p, generator=fresh_stream(seed), bias=bias
        )

    check_gradients_at(attend, inputs)


@pytest.mark.parametrize("width", [8, 0])  # 0: heads of no width
def test_multi_head_attention_names_a_width_not_made_of_heads(device, width):
    with pytest.raises(ValueError, match=f"{width} features are not 3 x 2 heads"):
        F.multi_head_attention(leaf(np.ones((1, 2, width)), device), 2)


@pytest.mark.parametrize("shape", [(), (4,), (1, 6), (2, 6)])
def test_multi_head_attention_names_a_bias_not_of_qkvs_width(device, shape):
    """The bias is one number per feature of qkv: (3 * width,), nothing broadcast."""
    qkv, bias = leaf(np.ones((1, 2, 6)), device), leaf(np.ones(shape), device)
    with pytest.raises(
        ValueError, match=re.escape(f"multi_head_attention: bias has shape {shape}, expected (6,)")
    ):
        F.multi_head_attention(qkv, 2, bias=bias)


@pytest.mark.parametrize(
    "k_shape, v_shape",
    [
        ((2, 5, 3), (2, 5, 6)),  # k's feature size is not q's
        ((2, 5, 4), (2, 4, 6)),  # v has a different number of positions from k
        ((3, 5, 4), (3, 5, 6)),  # k and v have 3 heads, q has 2
        ((2, 0, 4), (2, 0, 6)),  # no keys for the queries to attend to
        ((2, 5, 0), (2, 5, 6)),  # heads of width 0: no scale 1 / sqrt(d)
    ],
    ids=["features", "positions", "heads", "no keys", "width 0"],
)
def test_attention_names_shapes_that_do_not_fit(device, k_shape, v_shape):
    """q, k and v that do not fit together are refused with a ValueError giving all three shapes."""
    q_shape = (2, 3, k_shape[-1] if k_shape[-1] == 0 else 4)
    q, k, v = (leaf(np.ones(s), device) for s in (q_shape, k_shape, v_shape))
    with pytest.raises(ValueError, match=re.escape(f"q {q_shape}, k {k_shape}, v {v_shape}")):
        F.scaled_dot_product_attention(q, k, v, causal=False)


# ----------------------------------------------------------------------------------------------
# every functional: float32, and numpy against cupy


def _functional_cases():
    """Every functional as pytest.param(fn of float tensors, float64 input arrays), with fixed
    ids, targets and dropout seeds."""
    rng = np.random.default_rng(0)

    def normal(*shape):
        return rng.standard_normal(shape)

    def attention(**options):
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **options)

    return [
        pytest.param(F.linear, [normal(2, 3, 4), normal(4, 5), normal(5)], id="linear"),
        pytest.param(
            lambda table: F.embedding([[0, 2, 2], [5, 0, 1]], table), [normal(6, 3)], id="embedding"
        ),
        pytest.param(lambda x: F.softmax(x, axis=0), [normal(3, 4)], id="softmax"),
        pytest.param(lambda x: F.log_softmax(x, axis=1), [normal(3, 4)], id="log_softmax"),
        pytest.param(
            lambda z: F.cross_entropy(z, [[1, -100, 3], [0, 2, 2]]),
            [normal(2, 3, 4)],
            id="cross_entropy_mean",
        ),
        pytest.param(
            lambda z: F.cross_entropy(z, [1, -100, 3], reduction="none"),
            [normal(3, 4)],
            id="cross_entropy_none",
        ),
        pytest.param(lambda x: F.gelu(x, approximate="tanh"), [normal(3, 4)], id="gelu_tanh"),
        pytest.param(lambda x: F.gelu(x, approximate="none"), [normal(3, 4)], id="gelu_exact"),
        pytest.param(lambda x, b: F.gelu(x, bias=b), [normal(2, 3, 4), normal(4)], id="gelu_bias"),
        pytest.param(F.layer_norm, [normal(3, 4), normal(4), normal(4)], id="layer_norm"),
        pytest.param(lambda x: F.dropout(x, 0.3, generator=fresh_stream(0)), [normal(3, 4)], id="dropout"),
        pytest.param(
            attention(causal=True), [normal(2, 3, 4), normal(2, 3, 4), normal(2, 3, 5)], id="attention_causal"
        ),
        pytest.param(
            attention(causal=False), [normal(2, 3, 4), normal(2, 5, 4), normal(2, 5, 2)], id="attention_cross"
        ),
        pytest.param(
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.3, generator=fresh_stream(0)),
            [normal(2, 3, 4), normal(2, 3, 4), normal(2, 3, 5)],
            id="attention_dropout",
        ),
        pytest.param(
            lambda qkv: F.multi_head_attention(qkv, 2), [normal(2, 3, 12)], id="multi_head_attention"
        ),
        pytest.param(
            lambda qkv, b: F.multi_head_attention(qkv, 2, 0.3, generator=fresh_stream(0), bias=b),
            [normal(2, 3, 12), normal(12)],
            id="multi_head_attention_bias",
        ),
    ]


FUNCTIONAL_CASES = _functional_cases()


def run_with_gradients(fn, inputs, device, dtype):
    """fn's output tensor, and its inputs' gradients (for a fixed random upstream) as host arrays."""
    tensors = [float_tensor(a, device, dtype) for a in inputs]
    out = fn(*tensors)
    out.backward(np.random.default_rng(1).standard_normal(out.shape))
    return out, [backend.to_host(t.grad) for t in tensors]


@pytest.mark.parametrize("fn, inputs", FUNCTIONAL_CASES)
def test_float32_in_float32_out(device, fn, inputs):
    """float32 inputs give float32 outputs and gradients, close to what float64 gives (within
    TF32's rounding where the device's float32 products run in TF32: CUPY_TF32=1)."""
    out32, grads32 = run_with_gradients(fn, inputs, device, np.float32)
    out64, grads64 = run_with_gradients(fn, inputs, device, np.float64)
    assert out32.dtype == np.float32
    assert [g.dtype for g in grads32] == [np.float32] * len(inputs)
    tolerance = tf32.tolerance(device, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out32.numpy(), out64.numpy(), **tolerance)
    for g32, g64 in zip(grads32, grads64):
        np.testing.assert_allclose(g32, g64, **tolerance)


@pytest.mark.parametrize("fn, inputs", FUNCTIONAL_CASES)
def test_numpy_and_cupy_agree(gpu_device, fn, inputs):
    """The same float32 inputs on cpu and cuda give the same outputs and input gradients, dropout
    included: a mask stream draws the same masks on every device. The CPU's are the reference: where
    the GPU's float32 products run in TF32 (CUPY_TF32=1), its results are held to TF32's rounding."""
    out_cpu, grads_cpu = run_with_gradients(fn, inputs, "cpu", np.float32)
    out_gpu, grads_gpu = run_with_gradients(fn, inputs, gpu_device, np.float32)
    assert out_gpu.device.startswith("cuda") and out_gpu.dtype == np.float32
    tolerance = tf32.tolerance(gpu_device, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out_gpu.numpy(), out_cpu.numpy(), **tolerance)
    for g_gpu, g_cpu in zip(grads_gpu, grads_cpu):
        assert g_gpu.dtype == np.float32
        np.testing.assert_allclose(g_gpu, g_cpu, **tolerance)
