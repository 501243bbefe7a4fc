"""The gradient checkers catch wrong backward passes and say where they are wrong."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import autograd as ag
from autograd import Function
from autograd.gradcheck import GradcheckError, gradcheck, jacobian_check
from autograd.testing import away_from_zero, leaf, shapes


class ScaledSquare(Function):
    """x * x with a backward scaled by `wrong` (1 is the right gradient)."""

    @staticmethod
    def forward(ctx, x, wrong):
        ctx.x, ctx.wrong = x, wrong
        return x * x

    @staticmethod
    def backward(ctx, grad):
        return grad * 2 * ctx.x * ctx.wrong, None


def square(x, wrong=1.0):
    return ScaledSquare.apply(x, wrong)


# |x| >= 1, so that the directional derivative is not tiny
@given(
    away_from_zero(shapes(min_dims=1), low=1.0, high=4.0),
    st.floats(0.5, 2.0).filter(lambda w: abs(w - 1) > 0.05),
)
def test_gradcheck_accepts_a_right_backward_and_rejects_a_scaled_one(device, values, wrong):
    x = leaf(values, device)
    gradcheck(square, [x])
    with pytest.raises(GradcheckError, match="input 0"):
        gradcheck(lambda x: square(x, wrong), [x])


def test_gradcheck_names_only_the_input_that_is_wrong(device):
    a, b = leaf(np.array([1.0, -2.0]), device), leaf(np.array([3.0, 0.5]), device)
    with pytest.raises(GradcheckError) as error:
        gradcheck(lambda a, b: a * square(b, wrong=1.5), [a, b])
    assert "input 1" in str(error.value) and "input 0" not in str(error.value)


def test_both_checkers_name_the_inputs_as_asked(device):
    a, b = leaf(np.array([1.0, -2.0]), device), leaf(np.array([3.0, 0.5]), device)
    wrong = lambda a, b: a * square(b, wrong=1.5)  # noqa: E731
    with pytest.raises(GradcheckError, match=r"input bias of shape \(2,\)"):
        gradcheck(wrong, [a, b], names=["scale", "bias"])
    with pytest.raises(
        GradcheckError, match=r"2 Jacobian entries disagree.*\n  input bias\[0\] -> output \[0\]"
    ):
        jacobian_check(wrong, [a, b], names=["scale", "bias"])


def test_jacobian_check_points_at_the_wrong_entry(device):
    class WrongAtOne(Function):
        """Identity whose backward drops the gradient of entry 1."""

        @staticmethod
        def forward(ctx, x):
            return x.copy()

        @staticmethod
        def backward(ctx, grad):
            out = grad.copy()
            out[1] = 0
            return out

    x = leaf(np.array([0.5, 1.5, -1.0]), device)
    jacobian_check(lambda x: x * 1.0, [x])
    with pytest.raises(GradcheckError, match=r"input 0\[1\] -> output \[1\]") as error:
        jacobian_check(WrongAtOne.apply, [x])
    assert "1 Jacobian entry disagrees" in str(error.value)


def test_checks_refuse_float32_and_inputs_without_grad(device):
    with pytest.raises(TypeError, match="float64"):
        gradcheck(lambda x: x * x, [ag.tensor([1.0, 2.0], requires_grad=True, device=device)])
    with pytest.raises(ValueError, match="nothing to check"):
        gradcheck(lambda x: x * x, [leaf(np.ones(2), device, requires_grad=False)])


CHECKERS = [gradcheck, jacobian_check]
OUT_OF_RANGE = [
    ("eps", 0.0),
    ("eps", -1e-6),
    ("eps", float("nan")),
    ("eps", float("inf")),
    ("atol", -1e-6),
    ("atol", float("nan")),
    ("rtol", -1e-5),
    ("rtol", float("inf")),
    ("rtol", "1e-5"),
]


@pytest.mark.parametrize("check", CHECKERS, ids=lambda check: check.__name__)
@pytest.mark.parametrize("option, value", OUT_OF_RANGE)
def test_checks_refuse_a_step_or_tolerance_out_of_range(check, option, value):
    """A zero step would divide by zero, a NaN one compare nothing, a negative tolerance call a
    right backward wrong: each is refused at the call, naming the argument."""
    x = leaf(np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match=rf"^{check.__name__}: {option} must be a finite number"):
        check(square, [x], **{option: value})


@pytest.mark.parametrize("check", CHECKERS, ids=lambda check: check.__name__)
def test_checks_refuse_a_function_that_returns_no_tensor(check):
    with pytest.raises(TypeError, match=rf"^{check.__name__}: fn returned 3 \(int\), not a Tensor"):
        check(lambda x: 3, [leaf(np.array([1.0, 2.0]))])


@pytest.mark.parametrize("check", CHECKERS, ids=lambda check: check.__name__)
def test_checks_refuse_a_bare_tensor_for_the_list_of_inputs(check):
    with pytest.raises(
        TypeError,
        match=rf"^{check.__name__}: inputs must be a list of fn's arguments \(\[x\] for one\), not a Tensor",
    ):
        check(square, leaf(np.array([1.0, 2.0])))


@pytest.mark.parametrize("check", CHECKERS, ids=lambda check: check.__name__)
def test_checks_refuse_names_that_do_not_match_the_inputs(check):
    with pytest.raises(ValueError, match=rf"^{check.__name__}: 2 names for 1 inputs"):
        check(square, [leaf(np.array([1.0, 2.0]))], names=["x", "y"])


@pytest.mark.parametrize("max_entries", [0, -1, 2.5])
def test_jacobian_check_refuses_a_max_entries_below_one(max_entries):
    with pytest.raises(ValueError, match="^jacobian_check: max_entries must be an integer >= 1"):
        jacobian_check(square, [leaf(np.array([1.0, 2.0]))], max_entries=max_entries)
