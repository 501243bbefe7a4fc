"""autograd.testing: its strategies draw what they promise, its gradient property passes a right
backward and shrinks a wrong one to a small example naming the input, and its registry names
every Function that no test checks."""

import contextlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autograd as ag
from autograd import Function, kernels, testing
from autograd.testing import checks_gradient_of


class Softplus(Function):
    """log(1 + e^x); d/dx = sigmoid(x). `wrong_above` breaks the backward for x above it."""

    wrong_above = np.inf

    @staticmethod
    def forward(ctx, x):
        ctx.x = x
        return np.logaddexp(0.0, x)

    @staticmethod
    def backward(ctx, grad):
        slope = 1.0 / (1.0 + np.exp(-ctx.x))
        return grad * np.where(ctx.x > Softplus.wrong_above, 2 * slope, slope)


def softplus(x):
    return Softplus.apply(x)


@pytest.fixture
def wrong_above_one(monkeypatch):
    monkeypatch.setattr(Softplus, "wrong_above", 1.0)


# ----- strategies


@given(shape=testing.shapes(min_dims=1, max_dims=2, min_side=2, max_side=3))
def test_shapes_keep_their_bounds(shape):
    assert 1 <= len(shape) <= 2 and all(2 <= side <= 3 for side in shape)


@given(shapes=testing.broadcastable_shapes(3))
def test_broadcastable_shapes_broadcast_together(shapes):
    assert len(shapes) == 3
    np.broadcast_shapes(*shapes)


@given(pair=testing.broadcastable_arrays(2, lambda shape: testing.arrays(shape, -1.0, 1.0)))
def test_broadcastable_arrays_broadcast_and_keep_their_bounds(pair):
    a, b = pair
    assert (a + b).shape == np.broadcast_shapes(a.shape, b.shape)
    assert a.dtype == np.float64 and np.all(np.abs(np.concatenate([a.ravel(), b.ravel()])) <= 1.0)


@given(array=testing.arrays(testing.shapes(), low=-2.0, high=0.5))
def test_arrays_hold_finite_values_in_their_bounds(array):
    assert array.dtype == np.float64 and np.all((array >= -2.0) & (array <= 0.5))


@given(data=st.data(), margin=st.floats(0.01, 0.3), kinks=st.lists(st.integers(-2, 2), unique=True))
def test_away_from_keeps_every_value_off_every_kink(data, margin, kinks):
    array = data.draw(testing.away_from(kinks, testing.shapes(), margin=margin))
    distances = np.abs(array[..., None] - np.array(kinks, dtype=float))
    assert np.all(distances >= margin * (1 - 1e-9)) and np.all(np.abs(array) <= 3.0)


def test_away_from_refuses_kinks_closer_than_two_margins():
    with pytest.raises(ValueError, match=r"must lie apart"):
        testing.away_from([0.0, 0.1], (2,), margin=0.1)


@given(array=testing.away_from_zero(testing.shapes(), low=0.25, high=2.0))
def test_away_from_zero_makes_safe_denominators(array):
    assert np.all((np.abs(array) >= 0.25) & (np.abs(array) <= 2.0))


@given(array=testing.distinct(testing.shapes(min_dims=1), gap=0.01))
def test_distinct_arrays_have_no_ties(array):
    values = np.sort(array.ravel())
    assert np.all(np.diff(values) >= 0.01 * (1 - 1e-9))


@given(ids=testing.indices(5, testing.shapes()), signed=testing.indices(5, (20,), negative=True))
def test_indices_stay_inside_the_size(ids, signed):
    assert ids.dtype == np.int64 and np.all((ids >= 0) & (ids < 5))
    assert np.all((signed >= -5) & (signed < 5))


def test_tensors_are_float64_leaves_on_the_device(device):
    @given(x=testing.tensors(testing.arrays((2, 3), low=0.0, high=1.0), device=device))
    def drawn(x):
        assert x.dtype == np.float64 and x.requires_grad and x.device == ag.backend.parse_device(device)
        assert x.shape == (2, 3) and np.all(x.numpy() >= 0.0)

    drawn()


@pytest.mark.parametrize("gap", [0.0, -0.1, float("nan"), float("inf")])
def test_distinct_refuses_a_gap_that_is_not_positive_and_finite(gap):
    with pytest.raises(ValueError, match="^distinct: gap must be a finite number > 0"):
        testing.distinct((3,), gap=gap)


def test_distinct_refuses_more_entries_than_values_fit():
    """[0, 3] holds four values 1 apart: five distinct ones cannot be drawn."""
    with pytest.raises(ValueError, match=r"^distinct: a shape of 5 entries, but only 4 values 1.0 apart"):
        testing.distinct((5,), gap=1.0, low=0.0, high=3.0)


def test_distinct_refuses_a_drawn_shape_with_more_entries_than_values_fit():
    @given(testing.distinct(st.just((2, 3)), gap=1.0, low=0.0, high=3.0))
    def draw(array):
        pass

    with pytest.raises(ValueError, match=r"^distinct: a shape of 6 entries, but only 4 values"):
        draw()


NOT_STRATEGIES = {
    "check_gradients": lambda: testing.check_gradients(softplus, np.ones(3)),
    "tensors": lambda: testing.tensors(np.ones(3)),
}


@pytest.mark.parametrize("call", NOT_STRATEGIES.values(), ids=NOT_STRATEGIES.keys())
def test_a_numpy_array_where_a_strategy_goes_is_refused(call):
    with pytest.raises(TypeError, match=r"must be a hypothesis strategy, not a ndarray .*just\(x\)"):
        call()


SHAPE_TAKERS = {
    "arrays": testing.arrays,
    "away_from_zero": testing.away_from_zero,
    "distinct": testing.distinct,
    "indices": lambda shape: testing.indices(3, shape),
}


@pytest.mark.parametrize("name", SHAPE_TAKERS)
@pytest.mark.parametrize("shape", [np.ones(3), (2, -1), "3"], ids=["array", "negative side", "text"])
def test_strategies_refuse_what_is_not_a_shape(name, shape):
    with pytest.raises(TypeError, match=rf"^{name.removesuffix('_zero')}: shape must be a tuple of integers"):
        SHAPE_TAKERS[name](shape)


BAD_BOUNDS = {
    "shapes min_dims > max_dims": lambda: testing.shapes(min_dims=3, max_dims=1),
    "arrays low > high": lambda: testing.arrays((2,), low=1.0, high=-1.0),
    "indices of size 0": lambda: testing.indices(0, (2,)),
    "away_from a negative margin": lambda: testing.away_from([0.0], (2,), margin=-0.1),
}


@pytest.mark.parametrize("call", BAD_BOUNDS.values(), ids=BAD_BOUNDS.keys())
def test_strategies_refuse_bounds_out_of_order_when_made_not_when_drawn(call):
    with pytest.raises((TypeError, ValueError)):
        call()


# ----- the gradient property


@checks_gradient_of(Softplus)
def test_a_right_backward_passes_on_every_device(device):
    testing.check_gradients(softplus, testing.arrays(testing.shapes()), device=device)


def test_settings_reach_the_property():
    def examples(**options):
        drawn = []  # fn runs with the graph on once per example, for the backward
        softplus_counted = lambda x: drawn.append(ag.is_grad_enabled()) or softplus(x)  # noqa: E731
        testing.check_gradients(softplus_counted, testing.arrays(()), **options)
        return sum(drawn)

    assert examples(settings=settings(max_examples=7)) <= 7 < examples(settings=settings(max_examples=20))


def test_a_wrong_backward_shrinks_to_one_entry_and_names_the_input(wrong_above_one):
    seen = []
    with pytest.raises(ag.GradcheckError, match=r"input x\[\] -> output \[\]") as failure:
        testing.check_gradients(
            lambda x: seen.append(x.numpy()) or softplus(x), testing.arrays(testing.shapes())
        )
    shrunk = seen[-1]
    assert shrunk.size == 1 and 1.0 < shrunk.item() <= 3.0
    assert any("x=array(" in note for note in failure.value.__notes__)


def test_the_failure_names_the_one_input_that_disagrees(wrong_above_one):
    def scaled(weight, x):
        return weight * softplus(x)

    strategies = testing.arrays((2,), 0.5, 1.5), testing.arrays((2,), 1.5, 3.0)
    with pytest.raises(ag.GradcheckError, match=r"input x\[") as failure:
        testing.check_gradients(scaled, *strategies)
    assert "input weight" not in str(failure.value)


def test_a_strategy_drawing_a_tuple_gives_several_inputs(wrong_above_one):
    with pytest.raises(ag.GradcheckError, match=r"input b\["):
        testing.check_gradients(
            lambda a, b: a * softplus(b),
            testing.broadcastable_arrays(2, lambda shape: testing.arrays(shape, 1.5, 3.0)),
        )
    testing.check_gradients(lambda *ab: ab[0] * ab[1], testing.broadcastable_arrays(2))


def test_ids_and_tensors_pass_as_drawn(device):
    def lookup(ids, table):
        assert isinstance(ids, np.ndarray) and table.device == ag.backend.parse_device(device)
        return ag.functional.embedding(ids, table)

    table = testing.tensors(testing.arrays((4, 3)), device=device)
    testing.check_gradients(lookup, testing.indices(4, testing.shapes(max_dims=2)), table)


class ScaledBy(ag.Function):
    """y = w x, whose backward gets x's gradient wrong on the path where w needs none: a property that
    made every input require grad would never run it."""

    @staticmethod
    def forward(ctx, w, x):
        ctx.w, ctx.x = w, x
        return w * x

    @staticmethod
    def backward(ctx, grad):
        if ctx.needs_input_grad[0]:
            return grad * ctx.x, grad * ctx.w
        return None, 2 * grad * ctx.w


def scaled_by(w, x):
    return ScaledBy.apply(w, x)


def test_the_path_of_an_input_that_needs_no_gradient_is_drawn_and_named():
    strategies = testing.arrays((2,), 0.5, 1.5), testing.arrays((2,), 0.5, 1.5)
    testing.check_gradients(scaled_by, *strategies, requires_grad=(True, True))  # the bug hides there
    with pytest.raises(ag.GradcheckError, match=r"input x\[") as failure:
        testing.check_gradients(scaled_by, *strategies)
    assert any("requires_grad" in note and "(False, True)" in note for note in failure.value.__notes__)
    with pytest.raises(ValueError, match=r"requires_grad=\(True,\) for 2 drawn float arrays"):
        testing.check_gradients(scaled_by, *strategies, requires_grad=(True,))


def test_a_large_jacobian_is_left_to_the_random_direction(wrong_above_one):
    with pytest.raises(ag.GradcheckError, match=r"input x of shape \(3, 3\).*along a random direction"):
        testing.check_gradients(softplus, testing.arrays((3, 3), 1.5, 3.0), max_jacobian=10)


# ----- the fast paths' property


class Cube(Function):
    """x^3, with a fast path on each device (x * x * x against the reference's power); `wrong_on`
    names the device whose fast backward has the wrong sign."""

    wrong_on = None

    @staticmethod
    def forward(ctx, x):
        ctx.x = x
        return x**3

    @staticmethod
    def backward(ctx, grad):
        return 3 * ctx.x**2 * grad

    @staticmethod
    def forward_cpu(ctx, x):
        ctx.x = x
        return x * x * x

    @staticmethod
    def backward_cpu(ctx, grad):
        return (-1 if Cube.wrong_on == "cpu" else 1) * 3 * ctx.x * ctx.x * grad

    forward_gpu = forward_cpu

    @staticmethod
    def backward_gpu(ctx, grad):
        return (-1 if Cube.wrong_on == "gpu" else 1) * 3 * ctx.x * ctx.x * grad


def cube(x):
    return Cube.apply(x)


@checks_gradient_of(Cube)
@pytest.mark.parametrize(
    "dtypes", [(np.float32,), (np.float32, ag.bfloat16)], ids=["float32", "and bfloat16"]
)
def test_fast_paths_that_match_their_reference_pass_and_say_what_ran(device, dtypes):
    if ag.bfloat16 in dtypes and device == "cpu":
        pytest.skip("the CPU's fast paths take float32 and float64")
    ran = testing.check_fast_paths(cube, testing.arrays(testing.shapes()), device=device, dtypes=dtypes)
    assert ran.startswith(f"{' and '.join(map(str, map(np.dtype, dtypes)))} on {device}: fast paths match")
    assert "calls on a fast path: Cube" in ran


@pytest.mark.parametrize("wrong_on", ["cpu", "gpu"])
def test_a_wrong_sign_in_a_fast_backward_fails_on_its_own_device(device, wrong_on, monkeypatch):
    monkeypatch.setattr(Cube, "wrong_on", wrong_on)
    on_its_device = (device == "cpu") == (wrong_on == "cpu")
    if not on_its_device:
        testing.check_fast_paths(cube, testing.arrays(testing.shapes()), device=device)
        return
    with pytest.raises(
        AssertionError, match=r"gradient of x \(float32 on [\w-]+\): fast path and reference differ"
    ):
        testing.check_fast_paths(cube, testing.arrays(testing.shapes()), device=device)


def test_inputs_a_test_gives_are_compared_as_check_fast_paths_compares_drawn_ones(device, monkeypatch):
    """assert_fast_path_matches: check_fast_paths's comparison for given inputs; `reference` holds the
    reference run alone."""
    x = np.linspace(-2.0, 2.0, 12).reshape(3, 4)
    held, runs = [], []

    @contextlib.contextmanager
    def reference():
        held.append(True)
        yield
        held.pop()

    def watched_cube(x):
        runs.append((kernels.reference_only(), bool(held)))
        return cube(x)

    testing.assert_fast_path_matches(watched_cube, x, device=device, dtype=np.float32, reference=reference())
    assert runs == [(False, False), (True, True)]  # the fast run outside the context, the reference's in it
    monkeypatch.setattr(Cube, "wrong_on", "cpu" if device == "cpu" else "gpu")
    with pytest.raises(AssertionError, match=r"gradient of x \(float32 on [\w-]+\): fast path and reference"):
        testing.assert_fast_path_matches(cube, x, device=device, dtype=np.float32)


def test_scale_widens_the_absolute_tolerance_by_the_largest_magnitude(monkeypatch):
    """An error of 5e-4 next to values up to 8 passes an atol of 1e-4 scaled, not the atol alone."""
    off = staticmethod(lambda ctx, x: setattr(ctx, "x", x) or x * x * x + 5e-4)
    monkeypatch.setattr(Cube, "forward_cpu", off)
    x = np.linspace(-2.0, 2.0, 12)
    options = dict(device="cpu", dtype=np.float32, tolerances={np.float32: (0.0, 1e-4)})
    testing.assert_fast_path_matches(cube, x, scale=0.0, **options)
    with pytest.raises(AssertionError, match=r"output \(float32 on cpu\): fast path and reference differ"):
        testing.assert_fast_path_matches(cube, x, **options)


def off_by(error, at=slice(None)):
    """A fast forward for Cube whose entries `at` are off by `error` (a number, NaN or an infinity)."""

    def forward_cpu(ctx, x):
        ctx.x = x
        out = x * x * x
        out[at] = out[at] + error
        return out

    return staticmethod(forward_cpu)


def test_scale_is_the_largest_magnitude_given_where_the_results_are_small(monkeypatch):
    """Results under 1 (x^3 for |x| <= 0.5): an error of 5e-4 passes an atol of 1e-4 scaled by 8, not
    scaled by the results alone."""
    monkeypatch.setattr(Cube, "forward_cpu", off_by(5e-4))
    x = np.linspace(-0.5, 0.5, 12)
    options = dict(device="cpu", dtype=np.float32, tolerances={np.float32: (0.0, 1e-4)})
    testing.assert_fast_path_matches(cube, x, scale=8.0, **options)
    with pytest.raises(AssertionError, match=r"output \(float32 on cpu\): fast path and reference differ"):
        testing.assert_fast_path_matches(cube, x, scale=0.0, **options)


def test_slack_forgives_each_result_its_own_amount(monkeypatch):
    """slack[0] for the output, a number or an array of its shape, on top of the tolerance: 2e-3 off
    passes a slack of 2e-3 less the atol, and fails where one entry's slack is short."""
    monkeypatch.setattr(Cube, "forward_cpu", off_by(2e-3))
    x = np.linspace(-2.0, 2.0, 6)
    options = dict(device="cpu", dtype=np.float32, tolerances={np.float32: (0.0, 1e-4)})
    testing.assert_fast_path_matches(cube, x, slack=[1.95e-3], **options)
    short = np.full(6, 1.95e-3)
    short[4] = 1.8e-3
    with pytest.raises(AssertionError, match=r"(?s)output .*differ.*Mismatched elements: 1 / 6"):
        testing.assert_fast_path_matches(cube, x, slack=[short], **options)
    with pytest.raises(AssertionError, match=r"output .*differ"):
        testing.assert_fast_path_matches(cube, x, slack=[0.0, 1.0], **options)  # the gradient's slack


@pytest.mark.parametrize("odd", [np.nan, np.inf, -np.inf])
def test_a_nan_or_an_infinity_passes_only_where_both_paths_have_it(monkeypatch, odd):
    """A kernel that writes NaN (a barrier missing before a read of shared memory) fails the
    comparison, however the tolerance is scaled or slackened; the same value on both sides passes."""
    forgiving = dict(device="cpu", dtype=np.float32, scale=1e30, slack=[1e30, 1e30])
    testing.assert_fast_path_matches(cube, np.array([1.0, odd, 3.0]), **forgiving)
    monkeypatch.setattr(Cube, "forward_cpu", off_by(odd, at=1))
    with pytest.raises(AssertionError, match=r"output \(float32 on cpu\): fast path and reference differ"):
        testing.assert_fast_path_matches(cube, np.array([1.0, 2.0, 3.0]), **forgiving)


def test_each_input_may_have_a_type_of_its_own():
    """Layer norm under bf16 takes a bfloat16 x and a float32 weight: each input is made in its type, the
    output held to the least precise one's tolerance, each gradient to its input's; the count is checked."""
    x, weight = np.linspace(-2.0, 2.0, 12).reshape(3, 4), np.linspace(0.5, 1.5, 4)
    seen = []

    def layer_norm(x, weight):
        seen.append((x.dtype, weight.dtype))
        return ag.functional.layer_norm(x, weight=weight)

    testing.assert_fast_path_matches(layer_norm, x, weight, device="cpu", dtype=[ag.bfloat16, np.float32])
    assert seen == [(ag.bfloat16, np.float32)] * 2  # the fast run and the reference's

    def off_on_the_reference(x, weight):  # by 2^-6: within bfloat16's tolerance, not float32's
        return layer_norm(x, weight) * (1 + 2**-6 * kernels.reference_only())

    with pytest.raises(AssertionError, match=r"gradient of weight \(float32 on cpu\): fast path and"):
        testing.assert_fast_path_matches(
            off_on_the_reference, x, weight, device="cpu", dtype=[ag.bfloat16, np.float32]
        )
    with pytest.raises(AssertionError, match=r"gradient of weight \(float32 on cpu\): fast path and"):
        testing.assert_fast_path_matches(  # the weight's gradient alone: still float32's tolerance
            off_on_the_reference,
            x,
            weight,
            device="cpu",
            dtype=[ag.bfloat16, np.float32],
            requires_grad=[False, True],
        )
    with pytest.raises(ValueError, match="1 dtypes, 2 requires_grad for 2 arrays"):
        testing.assert_fast_path_matches(layer_norm, x, weight, device="cpu", dtype=[np.float32])
    with pytest.raises(ValueError, match="2 dtypes, 1 requires_grad for 2 arrays"):
        testing.assert_fast_path_matches(
            layer_norm, x, weight, device="cpu", dtype=np.float32, requires_grad=[1]
        )


def test_a_tensor_given_passes_as_it_is_and_the_arrays_gradients_are_still_compared(monkeypatch):
    """A tensor among the inputs is fn's as given (its gradient, added up over both runs, is not compared);
    the gradients of the arrays made into tensors are, each with its own slack."""
    shift, x = ag.tensor(np.ones(4), requires_grad=True), np.linspace(-2.0, 2.0, 4)
    options = dict(device="cpu", dtype=np.float32)
    testing.assert_fast_path_matches(lambda shift, x: cube(x) + shift, shift, x, **options)
    monkeypatch.setattr(Cube, "wrong_on", "cpu")
    with pytest.raises(AssertionError, match=r"gradient of x \(float32 on cpu\)"):
        testing.assert_fast_path_matches(
            lambda shift, x: cube(x) + shift, shift, x, slack=[0.0, 0.0], **options
        )


@pytest.mark.parametrize("slack", [1e-3, None, [0.0, 0.0, 0.0]], ids=["a number", "None", "one too many"])
def test_slack_is_a_list_of_at_most_one_for_each_result(slack):
    with pytest.raises(TypeError, match="slack is a list, the output's then each gradient's"):
        testing.assert_fast_path_matches(cube, np.ones(3), device="cpu", dtype=np.float32, slack=slack)


def test_check_gradients_on_a_gpu_device_checks_the_fast_path_too(gpu_device, monkeypatch):
    """float64 on a GPU runs the reference; the float32 property then finds a wrong GPU backward."""
    ran = testing.check_gradients(cube, testing.arrays(testing.shapes()), device=gpu_device).splitlines()
    assert ran[0].startswith(f"float64 on {gpu_device}: gradients match finite differences")
    assert ran[0].endswith("(no fast path ran)") and "calls on a fast path: Cube" in ran[1]
    monkeypatch.setattr(Cube, "wrong_on", "gpu")
    testing.check_gradients(cube, testing.arrays(testing.shapes()), device="cpu")  # the CPU cannot see it
    with pytest.raises(AssertionError, match="fast path and reference differ"):
        testing.check_gradients(cube, testing.arrays(testing.shapes()), device=gpu_device)


def test_a_function_without_a_fast_path_is_named_not_passed(device):
    """check_fast_paths fails where nothing was compared; check_gradients on a GPU device says so."""
    with pytest.raises(
        AssertionError, match=f"float32 on {device}: no fast path ran, so nothing was compared"
    ):
        testing.check_fast_paths(softplus, testing.arrays(testing.shapes()), device=device)
    ran = testing.check_gradients(softplus, testing.arrays(()), device=device).splitlines()
    assert len(ran) == 1 if device == "cpu" else ran[1].startswith(f"float32 on {device}: no fast path ran")


def test_tolerances_are_per_dtype_and_can_be_given():
    tight = {"float32": (0.0, 0.0)}  # x * x * x and x ** 3 differ in float32's last bits somewhere
    with pytest.raises(AssertionError, match="fast path and reference differ"):
        testing.check_fast_paths(
            cube, testing.arrays(testing.shapes(min_dims=1, min_side=4)), tolerances=tight
        )


@pytest.mark.parametrize(
    "call, error",
    [
        (
            lambda: testing.check_gradients(cube, testing.arrays(()), tol=1e-3),
            r"no argument tol \(its tolerances",
        ),
        (lambda: testing.check_fast_paths(cube, testing.arrays(()), tolerances=(0, 0)), "tolerances are"),
        (lambda: testing.check_fast_paths(cube, testing.arrays(()), tolerances={"bf16": (0, 0)}), "'bf16'"),
        (lambda: testing.check_fast_paths(cube, testing.arrays(()), tolerances={"float32": 0.1}), "not"),
        (
            lambda: testing.check_fast_paths(lambda x: (cube(x), x), testing.arrays(())),
            "gave a tuple, not a Tensor",
        ),
    ],
    ids=["a tolerance misnamed", "tolerances not a dict", "a dtype misnamed", "one number", "two outputs"],
)
def test_the_properties_name_a_wrong_argument(call, error):
    with pytest.raises(TypeError, match=error):
        call()


def test_a_tolerance_may_be_keyed_by_the_dtype_itself():
    tight = {np.float32: (0.0, 0.0)}
    with pytest.raises(AssertionError, match="fast path and reference differ"):
        testing.check_fast_paths(
            cube, testing.arrays(testing.shapes(min_dims=1, min_side=4)), tolerances=tight
        )


def test_a_numpy_scalar_drawn_is_a_0_d_input_that_may_require_grad(wrong_above_one):
    scalars = testing.arrays((), 1.5, 3.0).map(lambda a: a[()])  # np.float64, as a[0] or a + b give
    with pytest.raises(ag.GradcheckError, match=r"input x\[\]"):
        testing.check_gradients(softplus, scalars)


def test_the_devices_are_the_cpu_the_emulated_device_and_a_gpu_skipped_without_one():
    assert testing.DEVICES[:2] == ["cpu", "cuda-emulated"] and testing.DEVICES[2].values == ("cuda",)
    [skip] = testing.DEVICES[2].marks
    assert skip.args == (not ag.cuda_available(),)


# ----- the registry


def write_package(root, name, files):
    for path, text in files.items():
        (root / name / path).parent.mkdir(parents=True, exist_ok=True)
        (root / name / path).write_text(textwrap.dedent(text))


def test_the_registry_names_every_function_no_test_checks(tmp_path, monkeypatch):
    ops = """
        from autograd import Function
        class Square(Function): pass
        class Cube(Function):
            forward_gpu = staticmethod(lambda ctx, x: x ** 3)
    """
    test = """
        from autograd.testing import checks_fast_path_of, checks_gradient_of
        from userops.nested import Cube
        from userops.ops import Square
        @checks_gradient_of(Square)
        @checks_fast_path_of(Cube)
        def test_square_and_the_fast_cube(): pass
    """
    write_package(tmp_path, "userops", {"__init__.py": "", "ops.py": ops, "nested/__init__.py": ops})
    write_package(tmp_path, "usertests", {"__init__.py": "", "test_ops.py": test})
    monkeypatch.syspath_prepend(str(tmp_path))
    import userops
    import usertests

    missing = ["userops.nested.Cube", "userops.nested.Square", "userops.ops.Cube"]
    assert testing.untested_functions(userops, usertests) == missing
    with pytest.raises(AssertionError, match="no gradient test for: userops.nested.Cube, "):
        testing.assert_every_function_tested(userops, usertests)
    assert testing.untested_functions(userops, usertests, "fast path") == ["userops.ops.Cube"]
    with pytest.raises(AssertionError, match="^no fast path test for: userops.ops.Cube$"):
        testing.assert_every_function_tested(userops, usertests, "fast path")


def test_the_engine_does_not_need_hypothesis_and_testing_says_what_to_install():
    block = "import sys; sys.modules['hypothesis'] = None\n"
    engine = "import autograd, tinygpt, train.pretrain, train.finetune, train.evaluate"
    subprocess.run([sys.executable, "-c", block + engine], check=True)
    result = subprocess.run(
        [sys.executable, "-c", block + "import autograd.testing"], capture_output=True, text=True
    )
    assert result.returncode == 1 and "pip install hypothesis pytest" in result.stderr


@pytest.mark.parametrize("package", [None, "autograd", ag.Tensor], ids=["None", "a name", "a class"])
def test_the_registry_refuses_what_is_not_a_package(package):
    with pytest.raises(TypeError, match="^package must be a module or package"):
        testing.assert_every_function_tested(package)
    with pytest.raises(TypeError, match="^tests must be a module or package"):
        testing.untested_functions(ag, tests="tests")
    wrong_check = "^untested_functions: check is 'gradient' or 'fast path', not 'fast paths'$"
    with pytest.raises(ValueError, match=wrong_check):
        testing.assert_every_function_tested(ag, check="fast paths")
    with pytest.raises(ValueError, match="^untested_functions: check is 'gradient' or 'fast path', not"):
        testing.untested_functions(ag, check=["gradient"])


@pytest.mark.parametrize("marked", ["Softplus", Softplus.apply, int])
def test_the_marks_take_function_subclasses_only(marked):
    with pytest.raises(TypeError, match="^checks_gradient_of: takes Function subclasses"):
        checks_gradient_of(marked)
    with pytest.raises(TypeError, match="^checks_fast_path_of: takes Function subclasses"):
        testing.checks_fast_path_of(marked)
