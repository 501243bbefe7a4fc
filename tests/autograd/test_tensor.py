"""Tensor and the backward pass: construction and dtypes, no_grad, detach, backward() and how
gradients accumulate into leaves, and the errors that guard against misuse."""

import operator
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import autograd as ag
from autograd.backend import to_host
from autograd.testing import arrays, broadcastable_arrays, check_gradients, leaf, shapes


def host(array):
    """A NumPy copy of a NumPy or CuPy array (x.grad, x.data), to compare on the host."""
    return to_host(array).copy()


# ----- building tensors

FLOATING_DATA = {
    "python float": 2.5,
    "list": [1.5, -2.0],
    "float64 array": np.array([[1.5], [2.0]]),
    "numpy float64 scalar": np.float64(0.25),
    "float16 array": np.array([1.0, 2.0], dtype=np.float16),
}


@pytest.mark.parametrize("data", FLOATING_DATA.values(), ids=FLOATING_DATA.keys())
def test_floating_data_becomes_float32_by_default(device, data):
    """ag.tensor turns any floating data into float32, the default training precision."""
    x = ag.tensor(data, device=device)
    assert x.dtype == np.float32
    np.testing.assert_array_equal(x.numpy(), np.asarray(data, dtype=np.float32))


@pytest.mark.parametrize("dtype", ["float64", np.float64])
@given(a=arrays(shapes()))
def test_requested_dtype_is_kept(device, dtype, a):
    """dtype='float64' keeps full precision: the values come back unchanged."""
    x = ag.tensor(a, dtype=dtype, device=device)
    assert x.dtype == np.float64
    np.testing.assert_array_equal(x.numpy(), a)


@pytest.mark.parametrize(
    "data",
    [3, [1, 2, 3], np.array([[4, 5]], dtype=np.int32), [True, False]],
    ids=["python int", "list of ints", "int32 array", "booleans"],
)
def test_integer_and_boolean_data_keep_their_kind(device, data):
    """Token ids stay integers and masks stay booleans; only floats are converted."""
    x = ag.tensor(data, device=device)
    expected = np.asarray(data)
    assert x.dtype == expected.dtype
    np.testing.assert_array_equal(x.numpy(), expected)


@pytest.mark.parametrize("data", [[1, 2], [True, False]], ids=["integers", "booleans"])
def test_only_floating_tensors_can_require_grad(device, data):
    """Gradients are defined for floats only, so requires_grad on integer data is refused."""
    with pytest.raises(TypeError, match="floating"):
        ag.tensor(data, requires_grad=True, device=device)


NOT_NUMBERS = {
    "text": "abc",
    "None": None,
    "dict": {"a": 1.0},
    "object array": np.array([1.0, "a"], dtype=object),
    "bytes": b"ab",
    "complex": 1 + 2j,
}


@pytest.mark.parametrize("data", NOT_NUMBERS.values(), ids=NOT_NUMBERS.keys())
def test_tensor_refuses_data_that_is_not_numbers(data):
    """Text, None, a dict or objects are refused where they enter, in one line naming `data`."""
    with pytest.raises(TypeError, match=r"^tensor: data must be numbers \(bool, integer or float\), not"):
        ag.tensor(data)


def test_tensor_refuses_ragged_lists():
    with pytest.raises(ValueError, match=r"^tensor: data must be numbers or nested lists of equal lengths"):
        ag.tensor([[1.0, 2.0], [3.0]])


@pytest.mark.parametrize("dtype", ["no such type", str, object, np.complex64])
def test_tensor_refuses_a_dtype_that_is_not_numbers(dtype):
    with pytest.raises(TypeError, match="^tensor: dtype must be a bool, integer or float type"):
        ag.tensor([1.0], dtype=dtype)


def test_tensor_copies_its_data(device):
    """Changing the source array afterwards does not change the tensor, nor does a tensor made
    from another tensor share its data."""
    source = np.array([1.0, 2.0, 3.0])
    x = ag.tensor(source, dtype=np.float64, device=device)
    y = ag.tensor(x)
    source[0] = 100.0
    x.data[1] = 200.0
    np.testing.assert_array_equal(y.numpy(), [1.0, 2.0, 3.0])


def test_tensor_reports_its_device(device):
    """A tensor made on a device says so, and op results stay there."""
    x = ag.tensor([1.0, 2.0], device=device)
    assert x.device.split(":")[0] == device
    assert (x * 2).device == x.device


def test_numpy_returns_a_host_copy(device):
    """numpy() gives a NumPy array; writing into it leaves the tensor alone."""
    x = ag.tensor([1.0, 2.0], device=device)
    copy = x.numpy()
    assert isinstance(copy, np.ndarray)
    copy[0] = 100.0
    np.testing.assert_array_equal(x.numpy(), [1.0, 2.0])


@pytest.mark.parametrize("data", [2.5, [2.5], [[2.5]]], ids=["0-d", "(1,)", "(1, 1)"])
def test_item_returns_the_single_value_as_a_python_number(device, data):
    """item() works on any one-element tensor."""
    value = ag.tensor(data, device=device).item()
    assert type(value) is float and value == 2.5


def test_repr_shows_values_device_and_requires_grad(device):
    """repr names the values and the device, and requires_grad only when it is set."""
    x = ag.tensor([1.5, -2.0], device=device)
    assert "1.5" in repr(x) and "-2." in repr(x) and x.device in repr(x)
    assert "requires_grad=True" not in repr(x)
    assert "requires_grad=True" in repr(ag.tensor([1.5], requires_grad=True, device=device))


# ----- dtypes in arithmetic

FLOAT64_OPERANDS = {  # things a float32 tensor may meet, each a float64 in NumPy's eyes
    "python float": lambda shape: 1.5,
    "numpy float64 scalar": lambda shape: np.float64(1.5),
    "float64 array": lambda shape: np.full(shape, 1.5),
}
OPERATORS = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "**": operator.pow,
}


@pytest.mark.parametrize("operand", FLOAT64_OPERANDS)
@pytest.mark.parametrize("symbol", OPERATORS)
@given(a=arrays(shapes(), 0.5, 2.0, dtype=np.float32))
def test_float32_graph_stays_float32(device, operand, symbol, a):
    """x op c and c op x stay float32 for a float32 x, whatever float64 c is, and so does the
    gradient; the values are those of the float64 computation up to float32 rounding."""
    op, c = OPERATORS[symbol], FLOAT64_OPERANDS[operand](a.shape)
    x = ag.tensor(a, requires_grad=True, device=device)
    for out, expected in [(op(x, c), op(a.astype(np.float64), c)), (op(c, x), op(c, a.astype(np.float64)))]:
        assert out.dtype == np.float32
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5)
        out.sum().backward()
        assert x.grad.dtype == np.float32 and x.grad.shape == x.shape


def test_float32_matmul_and_where_with_float64_numpy_data_stay_float32(device):
    """@ with a float64 matrix and where with a float64 scalar keep a float32 tensor float32."""
    x = ag.tensor([[1.0, -2.0]], requires_grad=True, device=device)
    out = ag.where(x > 0, x, np.float64(0.5)) @ np.eye(2)
    assert out.dtype == np.float32
    out.sum().backward()
    assert x.grad.dtype == np.float32


MIXING_OPS = {
    "x + y": lambda x, y: x + y,
    "x * y": lambda x, y: x * y,
    "x @ y": lambda x, y: x @ y,
    "ag.concat": lambda x, y: ag.concat([x, y]),
    "ag.stack": lambda x, y: ag.stack([x, y]),
    "ag.where": lambda x, y: ag.where(x > 0, x, y),
}


@pytest.mark.parametrize("expression", MIXING_OPS)
def test_mixing_float32_and_float64_tensors_raises(device, expression):
    """No silent promotion: combining float32 and float64 tensors is a TypeError naming both."""
    x = ag.tensor([1.0, 2.0], device=device)
    y = ag.tensor([3.0, 4.0], dtype="float64", device=device)
    for first, second in [(x, y), (y, x)]:
        with pytest.raises(TypeError, match="float32.*float64"):
            MIXING_OPS[expression](first, second)


# ----- comparisons

COMPARISONS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


@pytest.mark.parametrize("symbol", COMPARISONS)
@given(a=arrays(shapes()), data=st.data())
def test_comparisons_give_boolean_tensors(device, symbol, a, data):
    """x < y etc. against a tensor, an array or a number give boolean tensors without a graph."""
    compare = COMPARISONS[symbol]
    b = data.draw(arrays(a.shape))
    x = leaf(a, device)
    for other, other_np in [(leaf(b, device), b), (b, b), (0.5, 0.5)]:
        result = compare(x, other)
        assert result.dtype == np.bool_ and not result.requires_grad
        np.testing.assert_array_equal(result.numpy(), compare(a, other_np))


@given(a=arrays(shapes()))
def test_comparison_mask_drives_where_and_indexing(device, a):
    """ag.where(x > 0, x, 0.0) is relu: its gradient is 1 where x > 0 and 0 elsewhere; x[x > 0]
    picks the same entries."""
    x = leaf(a, device)
    relu = ag.where(x > 0, x, 0.0)
    np.testing.assert_array_equal(relu.numpy(), np.where(a > 0, a, 0.0))
    relu.sum().backward()
    np.testing.assert_array_equal(host(x.grad), (a > 0).astype(np.float64))
    np.testing.assert_array_equal(x[x > 0].numpy(), a[a > 0])


# ----- no_grad and detach


def test_no_grad_context_records_no_graph(device):
    """Inside `with no_grad()` results do not require grad; on leaving, recording resumes."""
    x = leaf(np.array([1.0, 2.0]), device)
    assert ag.is_grad_enabled()
    with ag.no_grad():
        assert not ag.is_grad_enabled()
        y = x * 2
    assert ag.is_grad_enabled()
    assert not y.requires_grad and y.is_leaf
    assert (x * 2).requires_grad


def test_no_grad_nests_and_restores_the_outer_state():
    """Leaving an inner no_grad keeps the outer one in force; leaving the outer turns grad back on."""
    with ag.no_grad():
        with ag.no_grad():
            assert not ag.is_grad_enabled()
        assert not ag.is_grad_enabled()
    assert ag.is_grad_enabled()


def test_no_grad_restores_state_after_an_exception():
    with pytest.raises(KeyError):
        with ag.no_grad():
            raise KeyError("inside no_grad")
    assert ag.is_grad_enabled()


def test_no_grad_as_decorator(device):
    """@no_grad() turns recording off for each call, keeps the function's name and doc, and can
    be called again and from inside another no_grad block."""

    @ag.no_grad()
    def double(t):
        """Twice t."""
        assert not ag.is_grad_enabled()
        return t * 2

    x = leaf(np.array([1.0, 2.0]), device)
    assert not double(x).requires_grad
    assert ag.is_grad_enabled()
    with ag.no_grad():
        double(x)
        assert not ag.is_grad_enabled()
    assert not double(x).requires_grad and ag.is_grad_enabled()
    assert double.__name__ == "double" and double.__doc__ == "Twice t."


@given(a=arrays(shapes()))
def test_detach_cuts_the_graph(device, a):
    """x.detach() holds x's values but is a constant: d/dx (x.detach() * x) = x, not 2x."""
    x = leaf(a, device)
    d = x.detach()
    assert not d.requires_grad and d.is_leaf
    np.testing.assert_array_equal(d.numpy(), a)
    (d * x).sum().backward()
    np.testing.assert_array_equal(host(x.grad), a)
    assert d.grad is None


def test_only_tensors_that_require_grad_get_gradients(device):
    """A constant input gets no .grad; a result requires grad when any of its inputs does;
    intermediate results keep no .grad, only leaves do."""
    x = leaf(np.array([1.0, 2.0]), device)
    c = leaf(np.array([3.0, 4.0]), device, requires_grad=False)
    assert not (c * c).requires_grad
    y = x * c
    assert y.requires_grad and not y.is_leaf
    y.sum().backward()
    np.testing.assert_array_equal(host(x.grad), [3.0, 4.0])
    assert c.grad is None and y.grad is None


# ----- backward()


@given(n=st.integers(1, 4), k=st.integers(1, 4), m=st.integers(1, 4), data=st.data())
def test_backward_with_grad_gives_the_vector_jacobian_product(device, n, k, m, data):
    """For y = x @ w, y.backward(g) gives x.grad = g @ w.T and w.grad = x.T @ g; g may be an
    array or a tensor."""
    a, b, g = data.draw(arrays((n, k))), data.draw(arrays((k, m))), data.draw(arrays((n, m)))
    for upstream in [g, ag.tensor(g, dtype="float64", device=device)]:
        x, w = leaf(a, device), leaf(b, device)
        (x @ w).backward(upstream)
        np.testing.assert_allclose(host(x.grad), g @ b.T, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(host(w.grad), a.T @ g, rtol=1e-12, atol=1e-12)


def test_backward_without_grad_needs_a_single_element(device):
    """backward() alone means grad = 1, which only makes sense for a one-element output."""
    x = leaf(np.array([1.0, 2.0]), device)
    with pytest.raises(RuntimeError, match="grad"):
        (x * 2).backward()
    y = leaf(np.array([[3.0]]), device)
    (y * 2).backward()
    np.testing.assert_array_equal(host(y.grad), [[2.0]])


def test_backward_with_a_wrongly_shaped_grad_raises(device):
    x = leaf(np.array([1.0, 2.0]), device)
    with pytest.raises(ValueError, match="shape"):
        (x * 2).backward(np.ones(3))


def test_backward_on_a_tensor_without_graph_raises(device):
    with pytest.raises(RuntimeError, match="does not require grad"):
        ag.tensor([1.0, 2.0], device=device).sum().backward()


def test_second_backward_through_a_freed_graph_raises(device):
    """backward() frees the graph it walked, so walking it again is an error, not wrong numbers."""
    x = leaf(np.array([1.0, 2.0]), device)
    loss = (x * x).sum()
    loss.backward()
    with pytest.raises(RuntimeError, match="freed"):
        loss.backward()


def test_backward_through_a_graph_deeper_than_the_recursion_limit(device):
    """20000 chained ops: backward walks the graph without recursion; d(x * c**N)/dx = c**N."""
    depth, factor = 20_000, 1.0001
    assert depth > sys.getrecursionlimit()
    x = leaf(np.array([1.0, -2.0]), device)
    y = x
    for _ in range(depth):
        y = y * factor
    y.sum().backward()
    np.testing.assert_allclose(host(x.grad), [factor**depth] * 2, rtol=1e-9)


# ----- how gradients reach and accumulate into leaves

PATHS_TO_A_LEAF = {  # ways an output can depend on x, each with its own backward
    "x * x": lambda x: x * x,
    "x.sum()": lambda x: x.sum(),
    "x.mean()": lambda x: x.mean(),
    "x.reshape(-1)": lambda x: x.reshape(-1),
    "x.T": lambda x: x.T,
    "x[None]": lambda x: x[None],
    "ag.stack([x])": lambda x: ag.stack([x]),
    "ag.concat([x.reshape(-1)] * 2)": lambda x: ag.concat([x.reshape(-1)] * 2),
}


@pytest.mark.parametrize("path", PATHS_TO_A_LEAF)
@given(a=arrays(shapes(max_dims=2)))
def test_leaf_gradient_is_an_array_shaped_like_the_leaf(device, path, a):
    """After backward, x.grad is an array (not a NumPy scalar) with x's shape and dtype."""
    x = leaf(a, device)
    out = PATHS_TO_A_LEAF[path](x)
    out.backward(np.ones(out.shape))
    assert isinstance(x.grad, x.xp.ndarray)
    assert x.grad.shape == x.shape and x.grad.dtype == x.dtype


@pytest.mark.parametrize("path", PATHS_TO_A_LEAF)
@given(a=arrays(shapes(min_dims=1, max_dims=2)))
def test_gradients_accumulate_across_backward_calls(device, path, a):
    """A second backward through a freshly built graph adds to .grad, so the gradient doubles
    (which needs .grad to be a writable array of its own, whatever op reached the leaf)."""
    x = leaf(a, device)

    def build_and_backward():
        out = PATHS_TO_A_LEAF[path](x)
        out.backward(np.ones(out.shape))

    build_and_backward()
    first = host(x.grad)
    build_and_backward()
    np.testing.assert_allclose(host(x.grad), 2 * first, rtol=1e-12)


@given(a=arrays(shapes()), c=st.floats(-2.0, 2.0))
def test_tensor_used_twice_accumulates(device, a, c):
    """x + x has gradient 2; x in two branches, c * x + exp(x), has gradient c + exp(x)."""
    x = leaf(a, device)
    (x + x).sum().backward()
    np.testing.assert_array_equal(host(x.grad), np.full(a.shape, 2.0))
    x.grad = None
    (c * x + x.exp()).sum().backward()
    np.testing.assert_allclose(host(x.grad), c + np.exp(a), rtol=1e-12)


@given(a=arrays(shapes()), data=st.data())
def test_leaves_given_the_same_upstream_gradient_do_not_share_it(device, a, data):
    """In z = x + y both leaves receive the same gradient array; each must get its own copy, so
    changing x.grad leaves y.grad alone and later backward passes add up separately."""
    x, y = leaf(a, device), leaf(data.draw(arrays(a.shape)), device)
    g = data.draw(arrays(a.shape))
    (x + y).backward(g)
    x.grad += 1.0
    np.testing.assert_array_equal(host(y.grad), g)
    (x + y).backward(g)
    np.testing.assert_allclose(host(x.grad), 2 * g + 1.0, rtol=1e-12)
    np.testing.assert_allclose(host(y.grad), 2 * g, rtol=1e-12)


VIEWS = {  # ops whose backward hands out a view of the upstream gradient
    "x.reshape(-1)": (lambda t: t.reshape(-1), lambda g, shape: g.reshape(shape)),
    "x.T": (lambda t: t.T, lambda g, shape: g.T),
    "x.transpose()": (lambda t: t.transpose(), lambda g, shape: g.transpose()),
}


@pytest.mark.parametrize("view", VIEWS)
@given(a=arrays(shapes()), data=st.data())
def test_leaf_reached_through_a_view_gets_its_own_gradient_array(device, view, a, data):
    """In z = view(x) + y, x's gradient is a view of y's; x.grad must still be a separate array."""
    forward, undo = VIEWS[view]
    x = leaf(a, device)
    viewed = forward(x)
    y = leaf(data.draw(arrays(viewed.shape)), device)
    g = data.draw(arrays(viewed.shape))
    (viewed + y).backward(g)
    np.testing.assert_array_equal(host(x.grad), undo(g, a.shape))
    x.grad += 1.0
    np.testing.assert_array_equal(host(y.grad), g)


# ----- errors for bad shapes and axes


@pytest.mark.parametrize("reduction", ["mean", "max"])
@given(shape=shapes(min_dims=1), data=st.data())
def test_reducing_over_an_empty_axis_raises(device, reduction, shape, data):
    """mean and max of nothing are undefined: a ValueError that says the selection is empty."""
    empty_axis = data.draw(st.integers(0, len(shape) - 1))
    shape = shape[:empty_axis] + (0,) + shape[empty_axis + 1 :]
    axis = data.draw(st.sampled_from([None, empty_axis, empty_axis - len(shape), (empty_axis,)]))
    x = leaf(np.zeros(shape), device)
    with pytest.raises(ValueError, match="empty"):
        getattr(x, reduction)(axis=axis)


def test_sum_over_an_empty_axis_is_zero(device):
    """Unlike mean and max, a sum of nothing is defined: 0, as in NumPy."""
    x = leaf(np.zeros((0, 3)), device)
    np.testing.assert_array_equal(x.sum(axis=0).numpy(), [0.0, 0.0, 0.0])


@pytest.mark.parametrize("reduction", ["sum", "mean", "max"])
def test_reducing_a_non_empty_axis_of_an_empty_tensor_gives_an_empty_result(device, reduction):
    """A (0, 3) tensor reduced over its axis of 3 gives shape (0,), as in NumPy: no error."""
    a = np.zeros((0, 3))
    x = leaf(a, device)
    reduced = getattr(x, reduction)(axis=1)
    assert reduced.shape == (0,)
    np.testing.assert_array_equal(reduced.numpy(), getattr(a, reduction)(axis=1))


@pytest.mark.parametrize("reduction", ["sum", "mean", "max"])
@given(shape=shapes(), data=st.data())
def test_reduction_axis_out_of_range_raises(device, reduction, shape, data):
    """An axis outside [-ndim, ndim), alone or in a tuple, is an error (0-d tensors included)."""
    ndim = len(shape)
    bad = data.draw(st.integers(ndim, ndim + 2) | st.integers(-ndim - 3, -ndim - 1))
    axis = data.draw(st.sampled_from([bad, (bad,)]))
    x = leaf(np.ones(shape), device)
    with pytest.raises(ValueError, match="axis"):
        getattr(x, reduction)(axis=axis)


@pytest.mark.parametrize(
    "axes",
    [(0, 0, 1), (0, 1), (3, 1, 2), (0, 1, -4)],
    ids=["repeated", "too few", "too large", "too negative"],
)
def test_transpose_axes_must_be_a_permutation(device, axes):
    """transpose(axes) on a 3-d tensor needs each of 0, 1, 2 (or -3, -2, -1) exactly once."""
    x = leaf(np.zeros((2, 3, 4)), device)
    with pytest.raises(ValueError):
        x.transpose(axes)


SHAPE_MISMATCHES = {
    "(2, 3) + (4,)": lambda x23, x4: x23 + x4,
    "(2, 3) * (4,)": lambda x23, x4: x23 * x4,
    "(2, 3) @ (4,)": lambda x23, x4: x23 @ x4,
    "(4,) @ (2, 3)": lambda x23, x4: x4 @ x23,
    "concat (2, 3) with (4,)": lambda x23, x4: ag.concat([x23, x4]),
    "stack (2, 3) with (4,)": lambda x23, x4: ag.stack([x23, x4]),
    "where (2, 3) or (4,)": lambda x23, x4: ag.where(x23 > 0, x23, x4),
}


@pytest.mark.parametrize("expression", SHAPE_MISMATCHES)
def test_incompatible_shapes_raise(device, expression):
    """Shapes that neither broadcast nor line up for @ are a ValueError, not a wrong result."""
    x23, x4 = leaf(np.ones((2, 3)), device), leaf(np.ones(4), device)
    with pytest.raises(ValueError):
        SHAPE_MISMATCHES[expression](x23, x4)


@pytest.mark.parametrize("flag", ["no", 1, None, [True]])
def test_requires_grad_must_be_a_bool(flag):
    with pytest.raises(TypeError, match=r"^requires_grad must be True or False, not "):
        ag.tensor([1.0], requires_grad=flag)


class Twice(ag.Function):
    """y = 2 x, taking its output's gradients apart (sums_gradients) and keeping what it was given."""

    sums_gradients = True
    given = []

    @staticmethod
    def forward(ctx, x):
        return 2 * x

    @staticmethod
    def backward(ctx, grads):
        Twice.given.append([g.copy() for g in grads])
        return 2 * sum(grads[1:], grads[0])


@pytest.mark.parametrize("uses", [1, 2, 3])
def test_an_op_that_sums_gradients_gets_each_use_s_gradient_apart(device, uses):
    """The engine hands such an op a list, one gradient per use of its output, and the op's gradient
    is what the engine's own sum would give."""
    x = leaf(np.arange(3.0), device)
    y = Twice.apply(x)
    Twice.given.clear()
    sum((y * (k + 1)).sum() for k in range(uses)).backward()
    (given,) = Twice.given
    assert len(given) == uses
    assert sorted(float(to_host(g)[0]) for g in given) == [float(k + 1) for k in range(uses)]
    np.testing.assert_array_equal(to_host(x.grad), np.full(3, 2.0 * sum(range(1, uses + 1))))


class Scaled(ag.Function):
    """y = factor x, with the mistakes a user's op may make, each planted by a flag of the call."""

    @staticmethod
    def forward(ctx, x, factor=2.0, mistake=None):
        ctx.factor, ctx.mistake = factor, mistake
        several = {"two outputs": (factor * x, x), "a number output": (factor * x, 1.0), "no output": ()}
        return several.get(mistake, factor * x)

    @staticmethod
    def backward(ctx, grad):
        g = ctx.factor * grad
        return {"a list": [g], "one too many": (g, g)}.get(ctx.mistake, g)


@pytest.mark.parametrize(
    "mistake, error",
    [
        ("a Tensor by keyword", r"Scaled.apply: pass factor= by position: a keyword is not a graph input"),
        ("two outputs", r"Scaled.backward\(\) takes 2 positional arguments but 3 were given"),
        (
            "a number output",
            r"Scaled.forward gave a float as its output 1: give an array, or a tuple of them",
        ),
        ("no output", r"Scaled.forward gave an empty tuple: give an array, or a tuple of them"),
        ("a list", r"Scaled.backward gave \(list\): give a tuple of 1: an array or None per positional arg"),
        (
            "one too many",
            r"Scaled.backward gave \(ndarray, ndarray\): give a tuple of 1: an array or None per",
        ),
    ],
)
def test_a_functions_mistakes_are_one_line_errors_that_name_the_op(mistake, error):
    """What a user's Function gets wrong is named where it happens, not as a failure deep in the engine:
    a Tensor passed by keyword (it would not be a graph input), an output that is not an array, a
    backward that takes one gradient for two outputs, or gives a list or more gradients than positional
    args."""
    x = ag.tensor(np.arange(3.0), requires_grad=True)
    with pytest.raises(TypeError, match=error):
        if mistake == "a Tensor by keyword":
            Scaled.apply(x, factor=ag.tensor(2.0))
        else:
            out = Scaled.apply(x, mistake=mistake)
            (out[0] + out[1] if isinstance(out, tuple) else out).sum().backward()
    assert Scaled.apply(x).sum().backward() is None and np.array_equal(x.grad, np.full(3, 2.0))


def test_a_wrong_gradient_shape_names_the_argument():
    """A backward whose gradient for `weight` has the wrong shape is named by the forward's own name."""

    class Scale(ag.Function):
        @staticmethod
        def forward(ctx, x, weight):
            ctx.x = x
            return x * weight

        @staticmethod
        def backward(ctx, grad):
            return grad, grad * ctx.x  # weight's gradient not summed over the broadcast axis

    x, weight = ag.tensor(np.ones((2, 3)), requires_grad=True), ag.tensor(np.ones(3), requires_grad=True)
    with pytest.raises(
        RuntimeError, match=r"^Scale.backward gave a float32 \(2, 3\) gradient for argument weight, "
    ):
        Scale.apply(x, weight).sum().backward()


class DoubledInPlace(ag.Function):
    """y = 2x, its backward doubling the gradient it is given in place: the mistake the engine names."""

    @staticmethod
    def forward(ctx, x):
        return 2 * x

    @staticmethod
    def backward(ctx, grad):
        grad *= 2
        return grad


@pytest.mark.parametrize(
    "upstream", ["backward()", "backward(grad)", "a broadcast view (sum)", "gradcheck", "inside a graph"]
)
def test_a_backward_that_writes_into_its_grad_is_named_with_the_rule(upstream):
    """The gradient a backward is given may be another op's too (here w's, through the add): NumPy's
    are read-only while a backward runs, so writing into one is refused, naming the op and the rule, and
    the gradient checker finds it wherever the op sits in the function checked."""
    x = ag.tensor(np.arange(3.0), dtype=np.float64, requires_grad=True)
    error = (
        r"^DoubledInPlace.backward wrote into a read-only array \(.*\): a backward never writes into its grad"
    )
    with pytest.raises(RuntimeError, match=error):
        if upstream == "gradcheck":
            ag.gradcheck(lambda x: DoubledInPlace.apply(x * 2) * 5, [x])
        elif upstream == "inside a graph":
            w = ag.tensor(np.ones(3), dtype=np.float64, requires_grad=True)
            ((DoubledInPlace.apply(x * 2) + w * 5) * 3).sum().backward()
        elif upstream == "a broadcast view (sum)":
            DoubledInPlace.apply(x).sum().backward()
        elif upstream == "backward()":
            DoubledInPlace.apply(x[1]).backward()
        else:
            DoubledInPlace.apply(x).backward(np.ones(3))


def test_a_fast_forward_without_its_backward_is_named_before_it_runs():
    """A fast path is a pair: the backward reads what its own forward saved."""

    class Halved(ag.Function):
        forward_cpu = staticmethod(lambda ctx, x: x / 2)

        @staticmethod
        def forward(ctx, x):
            return x / 2

        @staticmethod
        def backward(ctx, grad):
            return grad / 2

    with pytest.raises(TypeError, match="^Halved: forward_cpu without backward_cpu$"):
        Halved.apply(ag.tensor(np.ones(3), requires_grad=True))


def test_the_first_gradient_a_leaf_gets_is_its_own_to_add_into(device):
    """The pass's first gradient is read-only; a leaf given it keeps a copy, which later passes add into."""
    x = ag.tensor(np.arange(3.0), requires_grad=True, device=device)
    x.backward(np.ones(3))
    x.backward(np.ones(3))
    np.testing.assert_array_equal(to_host(x.grad), np.full(3, 2.0))


# ----- several outputs


class SinCos(ag.Function):
    """(sin x, cos x): two outputs, with a gradient for each; `calls` counts the backward's runs."""

    calls = []

    @staticmethod
    def forward(ctx, x):
        xp = ag.backend.get_array_module(x)
        ctx.sin, ctx.cos = xp.sin(x), xp.cos(x)
        return ctx.sin, ctx.cos

    @staticmethod
    def backward(ctx, grad_sin, grad_cos):
        SinCos.calls.append((grad_sin.copy(), grad_cos.copy()))
        return grad_sin * ctx.cos - grad_cos * ctx.sin


def sin_cos_mixed(x, w):
    s, c = SinCos.apply(x)
    return s * w + (c * s).exp()  # sin reaches the output by two ways, cos with it


def test_an_op_of_two_outputs_matches_finite_differences(device):
    check_gradients(sin_cos_mixed, broadcastable_arrays(2), device=device)


@given(a=arrays(shapes()))
def test_an_op_of_two_outputs_gets_a_gradient_for_each(device, a):
    """Each output's gradient reaches the one backward, which runs once; the sum matches the math."""
    x = leaf(a, device)
    SinCos.calls.clear()
    s, c = SinCos.apply(x)
    assert s.requires_grad and c.requires_grad and s._node is c._node
    (s * 3.0 + c * c).sum().backward()
    assert len(SinCos.calls) == 1
    np.testing.assert_allclose(
        host(x.grad), 3.0 * np.cos(a) - 2.0 * np.cos(a) * np.sin(a), rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize("kept", [0, 1])
@given(a=arrays(shapes(min_dims=1)))
def test_an_output_no_gradient_reaches_gives_zeros(device, kept, a):
    """With one output used (the other dropped, or kept and unused), the other's gradient is zeros."""
    x = leaf(a, device)
    SinCos.calls.clear()
    outputs = SinCos.apply(x)
    used = outputs[kept] if kept else SinCos.apply(x)[0]  # dropped at once, or kept alive unused
    used.sum().backward()
    [(grad_sin, grad_cos)] = SinCos.calls
    np.testing.assert_array_equal(host(grad_sin), np.ones(a.shape) if kept == 0 else np.zeros(a.shape))
    np.testing.assert_array_equal(host(grad_cos), np.zeros(a.shape) if kept == 0 else np.ones(a.shape))
    expected = np.cos(a) if kept == 0 else -np.sin(a)
    np.testing.assert_allclose(host(x.grad), expected, rtol=1e-12, atol=1e-12)


def test_an_op_of_two_outputs_refuses_an_output_changed_in_place():
    x = ag.tensor(np.arange(3.0), requires_grad=True)
    s, c = SinCos.apply(x)
    c.data += 1
    with pytest.raises(
        RuntimeError, match=r"^SinCos's output 1 \(a float32 \(3,\) tensor\) was changed in place"
    ):
        (s + c).sum().backward()


def test_outputs_of_an_op_under_no_grad_need_no_gradient():
    with ag.no_grad():
        s, c = SinCos.apply(ag.tensor(np.arange(3.0), requires_grad=True))
    assert not s.requires_grad and not c.requires_grad and s.is_leaf
