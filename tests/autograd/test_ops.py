"""Every op in autograd.ops: forward values against NumPy, gradients against finite differences.

Each test draws shapes and values with hypothesis, runs the op on float64 tensors, compares the
result with the same NumPy expression, then checks the backward pass with `gradcheck` (one random
direction) and `jacobian_check` (every entry; the drawn sizes are small enough for that).
"""

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import autograd as ag
from autograd import ops
from autograd.backend import to_host
from autograd.gradcheck import jacobian_check
from autograd.testing import (
    arrays,
    assert_gradients,
    away_from_zero,
    broadcastable_arrays,
    checks_gradient_of,
    distinct,
    indices,
    leaf,
    shapes,
)


def assert_tensor_equals(tensor, expected):
    """The tensor holds `expected`: same shape, same dtype, same values up to rounding."""
    expected = np.asarray(expected)
    got = tensor.numpy()
    assert got.shape == expected.shape
    assert got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


def check_gradients_at(fn, *inputs):
    """The backward pass of fn agrees with central finite differences at these inputs, along a
    random direction and entry by entry."""
    assert_gradients(fn, *inputs)
    jacobian_check(fn, inputs)


def positive(shape):
    """Arrays with entries in [0.5, 3]: safe for log, and for powers with real exponents."""
    return arrays(shape, 0.5, 3.0)


@st.composite
def shape_and_axis(draw):
    """A shape with an `axis` argument for it: None, an int or a tuple of ints, negatives allowed."""
    shape = draw(shapes())
    if not shape:  # a 0-d tensor has no axes to name
        return shape, draw(st.sampled_from([None, ()]))
    one_axis = st.integers(-len(shape), len(shape) - 1)
    several_axes = st.lists(one_axis, unique_by=lambda ax: ax % len(shape), max_size=len(shape)).map(tuple)
    return shape, draw(st.none() | one_axis | several_axes)


# ----- elementwise arithmetic, with broadcasting

BROADCASTING_OPS = {
    "x + y": lambda x, y: x + y,
    "x - y": lambda x, y: x - y,
    "x * y": lambda x, y: x * y,
}


@checks_gradient_of(ops.Add, ops.Sub, ops.Mul)
@pytest.mark.parametrize("expression", BROADCASTING_OPS)
@given(pair=broadcastable_arrays(2))
def test_add_sub_mul_broadcast_like_numpy(device, expression, pair):
    """+, -, * match NumPy on broadcast shapes, and their gradients sum over broadcast axes."""
    fn = BROADCASTING_OPS[expression]
    a, b = pair
    x, y = leaf(a, device), leaf(b, device)
    assert_tensor_equals(fn(x, y), fn(a, b))
    check_gradients_at(fn, x, y)


NUMBER_OPERAND_OPS = {
    "x + c": lambda x, c: x + c,
    "c + x": lambda x, c: c + x,
    "x - c": lambda x, c: x - c,
    "c - x": lambda x, c: c - x,
    "x * c": lambda x, c: x * c,
    "c * x": lambda x, c: c * x,
    "x / c": lambda x, c: x / c,
}


@checks_gradient_of(ops.Add, ops.Sub, ops.Mul, ops.Div)
@pytest.mark.parametrize("expression", NUMBER_OPERAND_OPS)
@given(a=arrays(shapes()), c=st.sampled_from([2, -3, 0.5, 2.5]))
def test_ops_with_a_python_number_on_either_side(device, expression, a, c):
    """A plain int or float operand works on the left and on the right, as it does for NumPy."""
    fn = NUMBER_OPERAND_OPS[expression]
    x = leaf(a, device)
    assert_tensor_equals(fn(x, c), fn(a, c))
    check_gradients_at(lambda x: fn(x, c), x)


@checks_gradient_of(ops.Div)
@given(pair=broadcastable_arrays(2, elements=away_from_zero))
def test_division_broadcasts_like_numpy(device, pair):
    """x / y matches NumPy; both the numerator's and the denominator's gradients are right."""
    a, b = pair
    x, y = leaf(a, device), leaf(b, device)
    assert_tensor_equals(x / y, a / b)
    check_gradients_at(lambda x, y: x / y, x, y)


# each input's gradient times the result's gradient g, before it is summed back onto the input's shape
LOCAL_GRADIENTS = {
    "x + y": (lambda g, a, b: g, lambda g, a, b: g),
    "x - y": (lambda g, a, b: g, lambda g, a, b: -g),
    "x * y": (lambda g, a, b: g * b, lambda g, a, b: g * a),
    "x / y": (lambda g, a, b: g / b, lambda g, a, b: -g * a / b**2),
}


def summed_onto(g, shape):
    """g summed onto `shape` entry by entry: each entry gets the sum of g over the entries of the
    result it was broadcast to (zero where it met none), counted without axis arithmetic."""
    size = int(np.prod(shape))
    owner = np.broadcast_to(np.arange(size).reshape(shape), g.shape)
    return np.bincount(owner.ravel(), weights=g.ravel(), minlength=size).reshape(shape)


@pytest.mark.parametrize("expression", LOCAL_GRADIENTS)
@example(shapes_=hnp.BroadcastableShapes(input_shapes=((1, 3), (0, 3)), result_shape=(0, 3)))
@given(shapes_=hnp.mutually_broadcastable_shapes(num_shapes=2, min_side=0, max_dims=3, max_side=3))
def test_broadcasts_against_length_0_axes_have_gradients_of_the_inputs_shapes(device, expression, shapes_):
    """A size-1 axis broadcast against a length-0 one (x (1, 3) + y (0, 3) is (0, 3)): each input's
    gradient has its own shape and holds zeros where it met no entry of the result."""
    (a_shape, b_shape), shape = shapes_
    a, b = (0.5 + np.arange(int(np.prod(s))).reshape(s) % 3 for s in (a_shape, b_shape))
    g = np.cos(np.arange(int(np.prod(shape)))).reshape(shape)
    x, y = leaf(a, device), leaf(b, device)
    z = {"x + y": x + y, "x - y": x - y, "x * y": x * y, "x / y": x / y}[expression]
    assert z.shape == shape
    z.backward(ag.tensor(g, dtype=np.float64, device=device))
    for t, local, s in zip((x, y), LOCAL_GRADIENTS[expression], (a_shape, b_shape)):
        expected = summed_onto(local(g, a, b), s)
        assert to_host(t.grad).shape == s
        np.testing.assert_allclose(to_host(t.grad), expected, rtol=1e-12, atol=1e-12)


@checks_gradient_of(ops.Div)
@given(a=shapes().flatmap(away_from_zero), c=st.sampled_from([1, -2, 0.5]))
def test_number_divided_by_tensor(device, a, c):
    """c / x (Tensor.__rtruediv__) matches NumPy and has gradient -c / x**2."""
    x = leaf(a, device)
    assert_tensor_equals(c / x, c / a)
    check_gradients_at(lambda x: c / x, x)


@checks_gradient_of(ops.Pow)
@given(a=arrays(shapes(), -2.0, 2.0), exponent=st.integers(1, 4))
def test_power_with_integer_exponent(device, a, exponent):
    """x ** k for a whole k works for negative x too, with gradient k * x**(k-1)."""
    x = leaf(a, device)
    assert_tensor_equals(x**exponent, a**exponent)
    check_gradients_at(lambda x: x**exponent, x)


@checks_gradient_of(ops.Pow)
@given(a=positive(shapes()), exponent=st.sampled_from([-2.0, -0.5, 0.5, 1.5, 3.0]))
def test_power_with_real_exponent_of_positive_base(device, a, exponent):
    """x ** p for a real p (negative and fractional too) on positive x."""
    x = leaf(a, device)
    assert_tensor_equals(x**exponent, a**exponent)
    check_gradients_at(lambda x: x**exponent, x)


@checks_gradient_of(ops.Pow)
@given(a=arrays(shapes(), -2.0, 2.0), base=st.sampled_from([2, 0.5, 3.0]))
def test_number_raised_to_tensor(device, a, base):
    """c ** x (Tensor.__rpow__) matches NumPy and has gradient log(c) * c**x."""
    x = leaf(a, device)
    assert_tensor_equals(base**x, base**a)
    check_gradients_at(lambda x: base**x, x)


@checks_gradient_of(ops.Pow)
@given(pair=broadcastable_arrays(2, elements=positive))
def test_tensor_raised_to_tensor(device, pair):
    """x ** y with both tensors (broadcasting); y's gradient log(x) * x**y needs x > 0."""
    a, b = pair
    x, y = leaf(a, device), leaf(b, device)
    assert_tensor_equals(x**y, a**b)
    check_gradients_at(lambda x, y: x**y, x, y)


def test_power_zero_has_zero_gradient_even_at_zero(device):
    """x ** 0 is the constant 1, so its gradient is 0 everywhere, x = 0 included (not nan)."""
    x = leaf(np.array([0.0, 1.5, -2.0]), device)
    (x**0).sum().backward()
    np.testing.assert_array_equal(to_host(x.grad), [0.0, 0.0, 0.0])


@checks_gradient_of(ops.Neg)
@given(a=arrays(shapes()))
def test_negation(device, a):
    """-x matches NumPy and passes the gradient back with its sign flipped."""
    x = leaf(a, device)
    assert_tensor_equals(-x, -a)
    check_gradients_at(lambda x: -x, x)


# ----- matrix product


@st.composite
def matmul_operands(draw, a_kind, b_kind):
    """Operands of a @ b, each a 'vector' (k,), a 'matrix' or 'batched' with broadcast batch axes."""
    n, k, m = (draw(st.integers(1, 3)) for _ in range(3))
    batch_a, batch_b = draw(
        hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=1, max_dims=2, max_side=3)
    ).input_shapes
    a_shape = {"vector": (k,), "matrix": (n, k), "batched": batch_a + (n, k)}[a_kind]
    b_shape = {"vector": (k,), "matrix": (k, m), "batched": batch_b + (k, m)}[b_kind]
    return draw(arrays(a_shape)), draw(arrays(b_shape))


KINDS = ["vector", "matrix", "batched"]


@checks_gradient_of(ops.MatMul)
@pytest.mark.parametrize("a_kind", KINDS)
@pytest.mark.parametrize("b_kind", KINDS)
@given(data=st.data())
def test_matmul_follows_numpy_rules(device, a_kind, b_kind, data):
    """a @ b for every pairing of 1-D, 2-D and batched operands (batch axes broadcast)."""
    a, b = data.draw(matmul_operands(a_kind, b_kind))
    x, y = leaf(a, device), leaf(b, device)
    assert_tensor_equals(x @ y, a @ b)
    check_gradients_at(lambda x, y: x @ y, x, y)


@given(st.lists(st.integers(0, 2), max_size=2), st.integers(0, 3), st.integers(0, 3), st.integers(0, 3))
def test_matmul_with_length_0_axes_gives_numpys_shapes_and_values(device, batch, n, k, m):
    """(..., n, k) @ (k, m) where any of n, k, m may be 0 (k = 0: a sum of nothing, zeros): the
    product, and the gradients of its sum, dA = 1 B^T and dB = the sum of A^T 1 over the batch."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((*batch, n, k)), rng.standard_normal((k, m))
    x, y = leaf(a, device), leaf(b, device)
    (x @ y).sum().backward()
    assert_tensor_equals(x @ y, a @ b)
    upstream = np.ones((*batch, n, m))
    np.testing.assert_allclose(to_host(x.grad), upstream @ b.T)
    summed = list(range(a.ndim - 1))  # the batch axes and n
    np.testing.assert_allclose(to_host(y.grad), np.tensordot(a, upstream, axes=(summed, summed)))


@checks_gradient_of(ops.MatMul)
@given(pair=matmul_operands("batched", "matrix"))
def test_matmul_with_a_numpy_operand(device, pair):
    """A NumPy array on either side of @ is a constant; the tensor side gets the right gradient."""
    a, b = pair
    x, w = leaf(a, device), leaf(b, device)
    assert_tensor_equals(x @ b, a @ b)
    assert_tensor_equals(a @ w, a @ b)
    check_gradients_at(lambda x: x @ b, x)
    check_gradients_at(lambda w: a @ w, w)


# ----- reductions


@checks_gradient_of(ops.Sum, ops.Mean)
@pytest.mark.parametrize("reduction", ["sum", "mean"])
@given(shape_axis=shape_and_axis(), keepdims=st.booleans(), data=st.data())
def test_sum_and_mean_over_any_axes(device, reduction, shape_axis, keepdims, data):
    """sum/mean with axis None, int, negative int or tuple, with and without keepdims."""
    shape, axis = shape_axis
    a = data.draw(arrays(shape))
    x = leaf(a, device)

    def reduce(t):
        return getattr(t, reduction)(axis=axis, keepdims=keepdims)

    assert_tensor_equals(reduce(x), reduce(a))
    check_gradients_at(reduce, x)


@checks_gradient_of(ops.Max)
@given(shape_axis=shape_and_axis(), keepdims=st.booleans(), data=st.data())
def test_max_over_any_axes(device, shape_axis, keepdims, data):
    """max with axis None, int, negative int or tuple and keepdims; without ties its gradient
    goes entirely to the one largest entry of each group."""
    shape, axis = shape_axis
    a = data.draw(distinct(shape))
    x = leaf(a, device)
    assert_tensor_equals(x.max(axis=axis, keepdims=keepdims), a.max(axis=axis, keepdims=keepdims))
    check_gradients_at(lambda x: x.max(axis=axis, keepdims=keepdims), x)


@given(shape_axis=shape_and_axis(), keepdims=st.booleans(), data=st.data())
def test_tied_maxima_share_the_gradient_equally(device, shape_axis, keepdims, data):
    """Entries tied for the maximum split the upstream gradient into equal parts; others get 0."""
    shape, axis = shape_axis
    a = data.draw(hnp.arrays(np.float64, shape, elements=st.sampled_from([0.0, 1.0, 2.0])))  # many ties
    x = leaf(a, device)
    out = x.max(axis=axis, keepdims=keepdims)
    upstream = data.draw(arrays(out.shape, 0.5, 2.0))
    out.backward(upstream)

    grad = to_host(x.grad)
    is_max = a == a.max(axis=axis, keepdims=True)
    ties = is_max.sum(axis=axis, keepdims=True)
    upstream_kept = upstream.reshape(ties.shape)
    np.testing.assert_allclose(grad, np.where(is_max, upstream_kept / ties, 0.0), rtol=1e-12)
    np.testing.assert_allclose(grad.sum(axis=axis, keepdims=True), upstream_kept, rtol=1e-12)


def test_tied_maxima_example(device):
    """max([1, 3, 3, 2]): the two 3s get half of the gradient each."""
    x = leaf(np.array([1.0, 3.0, 3.0, 2.0]), device)
    x.max().backward()
    np.testing.assert_array_equal(to_host(x.grad), [0.0, 0.5, 0.5, 0.0])


# ----- elementwise functions

UNARY_FUNCTIONS = {  # method name: (NumPy twin, values it is drawn on)
    "exp": (np.exp, arrays),
    "log": (np.log, positive),
    "tanh": (np.tanh, arrays),
}


@checks_gradient_of(ops.Exp, ops.Log, ops.Tanh)
@pytest.mark.parametrize("name", UNARY_FUNCTIONS)
@given(data=st.data())
def test_exp_log_tanh(device, name, data):
    """x.exp(), x.log() (on x > 0) and x.tanh() match NumPy, gradients exp(x), 1/x, 1 - tanh(x)**2."""
    numpy_fn, values = UNARY_FUNCTIONS[name]
    a = data.draw(values(shapes()))
    x = leaf(a, device)

    def apply(t):
        return getattr(t, name)()

    assert_tensor_equals(apply(x), numpy_fn(a))
    check_gradients_at(apply, x)


# ----- shape ops


@st.composite
def shape_and_new_shape(draw):
    """A shape, and a new shape for it: its sides plus an extra 1, shuffled, one maybe written -1."""
    shape = draw(shapes())
    new_shape = list(draw(st.permutations(shape + (1,))))
    inferred = draw(st.none() | st.integers(0, len(new_shape) - 1))
    if inferred is not None:
        new_shape[inferred] = -1
    return shape, tuple(new_shape)


@checks_gradient_of(ops.Reshape)
@given(shapes_=shape_and_new_shape(), data=st.data())
def test_reshape(device, shapes_, data):
    """reshape takes a tuple or separate sides (one may be -1); the gradient is reshaped back."""
    shape, new_shape = shapes_
    a = data.draw(arrays(shape))
    x = leaf(a, device)
    assert_tensor_equals(x.reshape(new_shape), a.reshape(new_shape))
    assert_tensor_equals(x.reshape(*new_shape), a.reshape(new_shape))
    check_gradients_at(lambda x: x.reshape(new_shape), x)


@checks_gradient_of(ops.Transpose)
@given(a=arrays(shapes()), data=st.data())
def test_transpose_with_axes(device, a, data):
    """transpose(axes) as a tuple or as separate ints, negatives allowed; the gradient is
    permuted back by the inverse permutation."""
    axes = data.draw(st.permutations(range(a.ndim)))
    axes = tuple(data.draw(st.sampled_from([ax, ax - a.ndim])) for ax in axes)
    x = leaf(a, device)
    assert_tensor_equals(x.transpose(axes), a.transpose(axes))
    assert_tensor_equals(x.transpose(*axes), a.transpose(axes))
    check_gradients_at(lambda x: x.transpose(axes), x)


@checks_gradient_of(ops.Transpose)
@given(a=arrays(shapes()))
def test_transpose_without_axes_and_T_reverse_the_axes(device, a):
    """x.transpose() and x.T reverse the order of the axes, as in NumPy."""
    x = leaf(a, device)
    assert_tensor_equals(x.transpose(), a.transpose())
    assert_tensor_equals(x.T, a.T)
    check_gradients_at(lambda x: x.T, x)


# ----- indexing


@checks_gradient_of(ops.GetItem)
@given(data=st.data())
def test_basic_indexing(device, data):
    """Ints, slices (steps, negative bounds), None and Ellipsis; the gradient lands on the
    selected entries and is 0 elsewhere."""
    a = data.draw(arrays(shapes(min_dims=1)))
    index = data.draw(hnp.basic_indices(a.shape, allow_newaxis=True))
    x = leaf(a, device)
    assert_tensor_equals(x[index], a[index])
    check_gradients_at(lambda x: x[index], x)


INDEX_KINDS = {  # how an integer index is written
    "list": lambda index, device: index,
    "numpy array": lambda index, device: np.array(index),
    "tensor": lambda index, device: ag.tensor(index, device=device),
}


@checks_gradient_of(ops.GetItem)
@pytest.mark.parametrize("kind", INDEX_KINDS)
@pytest.mark.parametrize("along", ["first axis", "last axis"])
@given(a=arrays(shapes(min_dims=1)), data=st.data())
def test_integer_array_indexing_with_repeated_positions(device, kind, along, a, data):
    """x[idx] and x[..., idx] with more indices than positions, so some position repeats:
    the gradients of its copies add up."""
    n = a.shape[0] if along == "first axis" else a.shape[-1]
    positions = data.draw(st.lists(st.integers(-n, n - 1), min_size=n + 1, max_size=n + 3))
    index = INDEX_KINDS[kind](positions, device)
    select = (lambda t: t[index]) if along == "first axis" else (lambda t: t[..., index])
    x = leaf(a, device)
    expected = a[positions] if along == "first axis" else a[..., positions]
    assert_tensor_equals(select(x), expected)
    check_gradients_at(select, x)


def test_repeated_index_example(device):
    """x[[0, 0, 2]].sum(): x[0] is used twice, x[1] never, x[2] once."""
    x = leaf(np.array([5.0, 6.0, 7.0]), device)
    x[[0, 0, 2]].sum().backward()
    np.testing.assert_array_equal(to_host(x.grad), [2.0, 0.0, 1.0])


@checks_gradient_of(ops.GetItem)
@pytest.mark.parametrize("mask_over", ["all axes", "first axis"])
@given(a=arrays(shapes(min_dims=1)), data=st.data())
def test_boolean_mask_indexing(device, mask_over, a, data):
    """x[mask] with a mask shaped like x or like its first axis picks the True entries."""
    mask_shape = a.shape if mask_over == "all axes" else a.shape[:1]
    mask = data.draw(hnp.arrays(np.bool_, mask_shape))
    x = leaf(a, device)
    assert_tensor_equals(x[mask], a[mask])
    check_gradients_at(lambda x: x[mask], x)


# ----- joining tensors


@st.composite
def concat_inputs(draw):
    """1 to 3 arrays that agree on every side but `axis` (drawn, maybe negative), and that axis."""
    shape = draw(shapes(min_dims=1, max_side=3))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    lengths = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    parts = []
    for length in lengths:
        part_shape = list(shape)
        part_shape[axis] = length
        parts.append(draw(arrays(tuple(part_shape))))
    return parts, axis


@checks_gradient_of(ops.Concat)
@given(inputs=concat_inputs())
def test_concat(device, inputs):
    """ag.concat joins along an existing axis; each input gets back its own slice of the gradient."""
    parts, axis = inputs
    tensors = [leaf(p, device) for p in parts]
    assert_tensor_equals(ag.concat(tensors, axis=axis), np.concatenate(parts, axis=axis))
    check_gradients_at(lambda *ts: ag.concat(ts, axis=axis), *tensors)


@st.composite
def stack_inputs(draw):
    """1 to 3 arrays of one shape, and a new-axis position for them (maybe negative)."""
    shape = draw(shapes(max_side=3))
    axis = draw(st.integers(-len(shape) - 1, len(shape)))
    count = draw(st.integers(1, 3))
    return [draw(arrays(shape)) for _ in range(count)], axis


@checks_gradient_of(ops.Stack)
@given(inputs=stack_inputs())
def test_stack(device, inputs):
    """ag.stack joins along a new axis; each input gets back its own slice of the gradient."""
    parts, axis = inputs
    tensors = [leaf(p, device) for p in parts]
    assert_tensor_equals(ag.stack(tensors, axis=axis), np.stack(parts, axis=axis))
    check_gradients_at(lambda *ts: ag.stack(ts, axis=axis), *tensors)


# ----- selecting


@checks_gradient_of(ops.Where)
@given(shapes_=hnp.mutually_broadcastable_shapes(num_shapes=3, max_dims=3, max_side=3), data=st.data())
def test_where_broadcasts_condition_and_both_branches(device, shapes_, data):
    """ag.where(c, a, b): a's gradient where c holds, b's elsewhere, summed over broadcast axes."""
    condition_shape, a_shape, b_shape = shapes_.input_shapes
    condition = data.draw(hnp.arrays(np.bool_, condition_shape))
    a, b = data.draw(arrays(a_shape)), data.draw(arrays(b_shape))
    x, y = leaf(a, device), leaf(b, device)
    assert_tensor_equals(ag.where(condition, x, y), np.where(condition, a, b))
    check_gradients_at(lambda x, y: ag.where(condition, x, y), x, y)


@checks_gradient_of(ops.Where)
@pytest.mark.parametrize("number_side", ["a", "b"])
@given(a=arrays(shapes()), number=st.sampled_from([0, 0.0, -1.5]), data=st.data())
def test_where_with_a_number_operand(device, number_side, a, number, data):
    """A plain number may stand in for either branch (e.g. ag.where(x > 0, x, 0.0) is relu)."""
    condition = data.draw(hnp.arrays(np.bool_, a.shape))
    x = leaf(a, device)
    if number_side == "a":
        select, expected = (lambda x: ag.where(condition, number, x)), np.where(condition, number, a)
    else:
        select, expected = (lambda x: ag.where(condition, x, number)), np.where(condition, a, number)
    assert_tensor_equals(select(x), expected)
    check_gradients_at(select, x)


# ----- gradients gathered in place


@given(n_rows=st.integers(1, 5), width=st.integers(1, 4), n_ids=st.integers(1, 6), data=st.data())
def test_a_tied_table_gathers_every_gradient(device, n_rows, width, n_ids, data):
    """One table used as an embedding, as a transposed LM head and once more reshaped: the engine
    adds these gradients into arrays it owns, the sum is still right, and the table's gradient
    comes out contiguous."""
    from autograd import functional as F

    ids = data.draw(indices(n_rows, (2, n_ids)))
    table, x = data.draw(arrays((n_rows, width))), data.draw(arrays((2, 3, width)))

    def model(table, x):
        hidden = F.embedding(ids, table).sum(axis=1, keepdims=True) + x
        return F.linear(hidden, table.T) * 2 + (table.reshape(-1) * table.reshape(-1)).sum()

    check_gradients_at(model, leaf(table, device), leaf(x, device))
    t = leaf(table, device)
    model(t, leaf(x, device)).sum().backward()
    assert t.grad.flags.c_contiguous


@given(a=arrays((2, 3)))
def test_a_shared_gradient_is_never_written_into(device, a):
    """x + y hands one gradient array to both x and y; adding y's other gradient into it in place
    would change x's. Both leaves get their own right answers."""
    x, y = leaf(a, device), leaf(a, device)
    out = x + y
    (out * 3 + y.T.T * 5).sum().backward()
    np.testing.assert_array_equal(to_host(x.grad), np.full(a.shape, 3.0))
    np.testing.assert_array_equal(to_host(y.grad), np.full(a.shape, 8.0))
