"""autograd.optim: Adam in both L2 modes against the update rules computed by hand, its state
round trip, global-norm gradient clipping, and the learning-rate schedules of GPT-1's code.
"""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autograd import backend
from autograd.nn import Parameter
from autograd.optim import Adam, clip_grad_norm, warmup_constant, warmup_cosine, warmup_linear
from autograd.testing import arrays, away_from_zero, shapes

HAND = dict(rtol=1e-9, atol=1e-12)  # float64 against the same formula written out in NumPy
LRS = st.floats(1e-3, 0.1)
L2S = st.floats(0.01, 0.5)
BETAS = st.tuples(st.floats(0.0, 0.95), st.floats(0.5, 0.9999))
MODES = st.sampled_from(["decoupled", "coupled"])
OPTIONS = st.fixed_dictionaries(
    dict(
        lr=LRS, betas=BETAS, eps=st.sampled_from([1e-8, 1e-3]), l2=L2S, l2_mode=MODES, vector_l2=st.booleans()
    )
)


def on(device):
    return backend.parse_device(device)


def parameter(array, device):
    """A float64 Parameter on `device` holding a copy of `array`."""
    return Parameter(backend.to_device(np.array(array, dtype=np.float64), on(device)))


@st.composite
def trajectories(draw, n_steps=st.integers(2, 4)):
    """(initial values, gradients for each step) of a matrix parameter and a vector parameter."""
    kinds = [draw(shapes(min_dims=2, max_dims=2, max_side=3)), draw(shapes(min_dims=1, max_dims=1))]
    initial = [draw(arrays(shape)) for shape in kinds]
    grads = [[draw(arrays(shape)) for shape in kinds] for _ in range(draw(n_steps))]
    return initial, grads


def run_adam(initial, grads, device, lrs=None, **options):
    """Parameters made from `initial`, stepped by Adam(**options) once per entry of `grads`
    (lr set to lrs[t] before step t when given); their final host values and the optimizer."""
    params = [parameter(a, device) for a in initial]
    opt = Adam(params, **options)
    for t, step_grads in enumerate(grads):
        if lrs is not None:
            opt.lr = lrs[t]
        for p, g in zip(params, step_grads):
            p.grad = None if g is None else backend.to_device(g, on(device))
        opt.step()
    return [p.numpy() for p in params], opt


def decoupled_by_hand(initial, grads, lrs, betas, eps, l2, vector_l2):
    """GPT-1's rule (t from 1): m, v moments; lr_t = lr sqrt(1 - b2^t) / (1 - b1^t);
    p -= lr_t (m / (sqrt(v) + eps) + l2 p), the l2 term only for 2-D and up unless vector_l2."""
    (b1, b2), params = betas, [a.copy() for a in initial]
    m, v = [np.zeros_like(a) for a in initial], [np.zeros_like(a) for a in initial]
    for t, (step_grads, lr) in enumerate(zip(grads, lrs), start=1):
        lr_t = lr * math.sqrt(1 - b2**t) / (1 - b1**t)
        for i, g in enumerate(step_grads):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            decay = l2 * params[i] if params[i].ndim > 1 or vector_l2 else 0.0
            params[i] = params[i] - lr_t * (m[i] / (np.sqrt(v[i]) + eps) + decay)
    return params


def coupled_by_hand(initial, grads, lrs, betas, eps, l2):
    """Classic Adam with L2 on every parameter: g += l2 p; m, v; bias-corrected m_hat, v_hat;
    p -= lr m_hat / (sqrt(v_hat) + eps)."""
    (b1, b2), params = betas, [a.copy() for a in initial]
    m, v = [np.zeros_like(a) for a in initial], [np.zeros_like(a) for a in initial]
    for t, (step_grads, lr) in enumerate(zip(grads, lrs), start=1):
        for i, g in enumerate(step_grads):
            g = g + l2 * params[i]
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            m_hat, v_hat = m[i] / (1 - b1**t), v[i] / (1 - b2**t)
            params[i] = params[i] - lr * m_hat / (np.sqrt(v_hat) + eps)
    return params


def assert_all_close(actual, expected, **tolerance):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(a, e, **tolerance)


# Adam: the update rules ------------------------------------------------------------------------------


@pytest.mark.parametrize("vector_l2", [False, True])
@given(trajectories(), LRS, BETAS, L2S)
def test_adam_decoupled_matches_gpt1_rule_by_hand(device, vector_l2, trajectory, lr, betas, l2):
    """Decoupled mode follows GPT-1's rule step by step: bias correction folded into lr_t and
    the L2 term added to the update, for the matrix always and for the vector only with vector_l2."""
    initial, grads = trajectory
    ours, _ = run_adam(initial, grads, device, lr=lr, betas=betas, l2=l2, vector_l2=vector_l2)
    expected = decoupled_by_hand(initial, grads, [lr] * len(grads), betas, 1e-8, l2, vector_l2)
    assert_all_close(ours, expected, **HAND)


@given(trajectories(), LRS, L2S)
def test_adam_decoupled_leaves_vectors_without_l2_by_default(device, trajectory, lr, l2):
    """Without vector_l2, the vector moves exactly as with l2 = 0, while the matrix does not."""
    initial, grads = trajectory
    with_l2, _ = run_adam(initial, grads, device, lr=lr, l2=l2)
    without_l2, _ = run_adam(initial, grads, device, lr=lr, l2=0.0)
    np.testing.assert_array_equal(with_l2[1], without_l2[1])
    if np.abs(initial[0]).max() > 0.1:
        assert not np.allclose(with_l2[0], without_l2[0], rtol=0, atol=1e-12)


@given(trajectories(), LRS, BETAS, L2S)
def test_adam_coupled_matches_classic_l2_by_hand(device, trajectory, lr, betas, l2):
    """Coupled mode is classic Adam with g += l2 p on every parameter, vector included."""
    initial, grads = trajectory
    ours, _ = run_adam(initial, grads, device, lr=lr, betas=betas, l2=l2, l2_mode="coupled")
    assert_all_close(ours, coupled_by_hand(initial, grads, [lr] * len(grads), betas, 1e-8, l2), **HAND)


@given(
    trajectories(n_steps=st.integers(3, 4)), st.lists(LRS | st.just(0.0), min_size=4, max_size=4), MODES, L2S
)
def test_adam_uses_the_lr_set_before_each_step(device, trajectory, lrs, l2_mode, l2):
    """Changing opt.lr between steps (as a schedule does) changes the next step accordingly;
    lr = 0 leaves the parameters where they are."""
    initial, grads = trajectory
    lrs = lrs[: len(grads)]
    ours, _ = run_adam(initial, grads, device, lrs=lrs, l2=l2, l2_mode=l2_mode)
    if l2_mode == "decoupled":
        expected = decoupled_by_hand(initial, grads, lrs, (0.9, 0.999), 1e-8, l2, vector_l2=False)
    else:
        expected = coupled_by_hand(initial, grads, lrs, (0.9, 0.999), 1e-8, l2)
    assert_all_close(ours, expected, **HAND)


@given(trajectories(), MODES, L2S)
def test_adam_leaves_parameters_without_gradient_alone(device, trajectory, l2_mode, l2):
    """A parameter whose grad is None is not touched (no L2 either) and its moments stay 0; the
    others are updated as usual."""
    initial, grads = trajectory
    frozen = np.full((2, 2), 1.5)
    ours, opt = run_adam(
        [*initial, frozen],
        [[*g, None] for g in grads],
        device,
        lr=0.01,
        l2=l2,
        l2_mode=l2_mode,
        vector_l2=True,
    )
    np.testing.assert_array_equal(ours[2], frozen)
    state = opt.state_dict()
    assert not backend.to_host(state["m"][2]).any() and not backend.to_host(state["v"][2]).any()
    expected, _ = run_adam(initial, grads, device, lr=0.01, l2=l2, l2_mode=l2_mode, vector_l2=True)
    assert_all_close(ours[:2], expected, rtol=0, atol=0)


@given(st.integers(2, 4), st.floats(1e-4, 1e-2), st.data())
def test_adam_coupled_equals_torch(steps, lr, data):
    """Coupled mode gives torch.optim.Adam(weight_decay=l2)'s numbers in float32."""
    torch = pytest.importorskip("torch")
    l2 = data.draw(st.sampled_from([0.0, 0.01, 0.3]))
    kinds = [(3, 2), (2,)]
    initial = [data.draw(arrays(shape, dtype=np.float32)) for shape in kinds]
    ours = [Parameter(a.copy()) for a in initial]
    theirs = [torch.tensor(a.copy(), requires_grad=True) for a in initial]
    opt, reference = (
        Adam(ours, lr=lr, l2=l2, l2_mode="coupled"),
        torch.optim.Adam(theirs, lr=lr, weight_decay=l2),
    )
    for _ in range(steps):
        for p, q, shape in zip(ours, theirs, kinds):
            g = data.draw(arrays(shape, dtype=np.float32))
            p.grad, q.grad = g.copy(), torch.tensor(g.copy())
        opt.step()
        reference.step()
    for p, q in zip(ours, theirs):
        np.testing.assert_allclose(p.numpy(), q.detach().numpy(), rtol=1e-5, atol=1e-6)


# Adam: state and arguments ------------------------------------------------------------------------------


def host_state(state):
    """A copy of an Adam state_dict with the moments on the host, as a checkpoint would keep it."""
    return {
        key: [backend.to_host(a).copy() for a in value] if key in ("m", "v") else value
        for key, value in state.items()
    }


@given(trajectories(n_steps=st.integers(2, 5)), st.data())
def test_adam_state_dict_resumes_bitwise(device, trajectory, data):
    """Stopping after k steps, saving parameters and optimizer state, and resuming in a fresh
    Adam (made with default options) gives bitwise the same parameters as never stopping."""
    initial, grads = trajectory
    k = data.draw(st.integers(1, len(grads) - 1))
    options = data.draw(OPTIONS)
    uninterrupted, _ = run_adam(initial, grads, device, **options)
    halfway, opt = run_adam(initial, grads[:k], device, **options)
    saved = host_state(opt.state_dict())

    params = [parameter(a, device) for a in halfway]
    resumed = Adam(params)
    resumed.load_state_dict(saved)
    assert resumed.step_count == k
    for step_grads in grads[k:]:
        for p, g in zip(params, step_grads):
            p.grad = backend.to_device(g, on(device))
        resumed.step()
    for ours, expected in zip(params, uninterrupted):
        assert ours.numpy().tobytes() == expected.tobytes()


def test_adam_load_state_dict_rejects_wrong_count_or_shape(device):
    """A state for a different number of parameters, or for differently shaped ones, is a
    ValueError, and the optimizer is left as it was."""
    _, source = run_adam([np.ones((2, 3)), np.ones(3)], [[np.ones((2, 3)), np.ones(3)]], device)
    state = host_state(source.state_dict())
    for shapes_ in ([(2, 3), (3,), (3,)], [(2, 3)], [(3, 2), (3,)], [(2, 3), (4,)]):
        target = Adam([parameter(np.zeros(s), device) for s in shapes_])
        with pytest.raises(ValueError):
            target.load_state_dict(state)
        assert target.step_count == 0 and all(not backend.to_host(m).any() for m in target.m)


@pytest.mark.parametrize(
    "options",
    [
        dict(l2_mode="l1"),
        dict(l2_mode="Decoupled"),
        dict(lr=-1e-3),
        dict(lr=float("nan")),
        dict(betas=(1.0, 0.999)),
        dict(betas=(0.9, -0.1)),
        dict(eps=-1.0),
        dict(l2=-0.1),
    ],
)
def test_adam_rejects_bad_arguments(options):
    with pytest.raises(ValueError):
        Adam([Parameter(np.zeros(2))], **options)


# clip_grad_norm ---------------------------------------------------------------------------------------


@st.composite
def gradients(draw):
    """1 to 3 gradients of any shapes (0-d included), float32 or float64, every entry with
    magnitude in [0.5, 3]."""
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    grad_shapes = draw(st.lists(shapes(min_dims=0, max_dims=2), min_size=1, max_size=3))
    return [draw(away_from_zero(shape)).astype(dtype) for shape in grad_shapes]


def with_grads(grads, device):
    """Parameters holding the gradients `grads` (copies, on `device`), plus one without a gradient."""
    params = [Parameter(backend.to_device(np.zeros_like(g), on(device))) for g in grads]
    for p, g in zip(params, grads):
        p.grad = backend.to_device(g.copy(), on(device))
    return params + [Parameter(backend.to_device(np.zeros(2, dtype=grads[0].dtype), on(device)))]


def global_norm(grads):
    return math.sqrt(sum(float((np.asarray(g, dtype=np.float64) ** 2).sum()) for g in grads))


@given(gradients(), st.floats(0.01, 0.99))
def test_clip_scales_a_larger_norm_down_to_max_norm(device, grads, fraction):
    """When the global norm exceeds max_norm: the norm before clipping is returned, and every
    gradient is scaled by the same factor so that the global norm becomes max_norm."""
    params = with_grads(grads, device)
    norm = global_norm(grads)
    max_norm = fraction * norm
    tolerance = dict(rtol=1e-5) if grads[0].dtype == np.float32 else dict(rtol=1e-9)
    np.testing.assert_allclose(float(clip_grad_norm(params, max_norm)), norm, **tolerance)
    clipped = [backend.to_host(p.grad) for p in params[:-1]]
    assert all(c.dtype == g.dtype for c, g in zip(clipped, grads))
    assert params[-1].grad is None
    np.testing.assert_allclose(global_norm(clipped), max_norm, rtol=1e-5)
    for c, g in zip(clipped, grads):
        np.testing.assert_allclose(c, g * fraction, rtol=1e-5)


@given(gradients(), st.floats(1.01, 100.0))
def test_clip_leaves_a_smaller_norm_alone(device, grads, factor):
    """When the global norm is below max_norm, the gradients are unchanged, bit for bit, and the
    norm is still returned."""
    params = with_grads(grads, device)
    norm = global_norm(grads)
    tolerance = dict(rtol=1e-5) if grads[0].dtype == np.float32 else dict(rtol=1e-9)
    np.testing.assert_allclose(float(clip_grad_norm(params, factor * norm)), norm, **tolerance)
    for p, g in zip(params, grads):
        np.testing.assert_array_equal(backend.to_host(p.grad), g)
    assert params[-1].grad is None


def test_clip_without_gradients_returns_zero(device):
    params = [Parameter(backend.to_device(np.ones(3), on(device)))]
    assert float(clip_grad_norm(params, 1.0)) == 0.0 and params[0].grad is None


# Schedules -----------------------------------------------------------------------------------------------

SCHEDULES = {
    "warmup_linear": warmup_linear,
    "warmup_cosine": warmup_cosine,
    "warmup_constant": warmup_constant,
}
PROGRESS = st.floats(0.0, 1.0)
WARMUPS = st.just(0.0) | st.floats(1e-4, 0.5)


def gpt1_schedule(name, x, warmup):
    """GPT-1's code: s = (x <= warmup), then s * x / warmup + (1 - s) * decay, with linear's
    (1 - x) multiplying both parts; warmup = 0 means no warmup (s = 0) here."""
    s = 1.0 if warmup > 0 and x <= warmup else 0.0
    ramp = x / warmup if s else 0.0
    if name == "warmup_linear":
        return (s * ramp + (1 - s)) * (1 - x)
    decay = 0.5 * (1 + math.cos(math.pi * x)) if name == "warmup_cosine" else 1.0
    return s * ramp + (1 - s) * decay


@pytest.mark.parametrize("name", SCHEDULES)
@given(PROGRESS, WARMUPS)
def test_schedules_follow_gpt1_code(name, x, warmup):
    """Each schedule equals the formula of GPT-1's opt.py at every x in [0, 1]."""
    assert math.isclose(
        SCHEDULES[name](x, warmup), gpt1_schedule(name, x, warmup), rel_tol=1e-12, abs_tol=1e-15
    )


@pytest.mark.parametrize("name", SCHEDULES)
@given(st.floats(1e-3, 0.5), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_schedules_rise_linearly_during_warmup(name, warmup, a, b):
    """For x in [0, warmup] the factor is x / warmup (times GPT-1's (1 - x) for warmup_linear),
    rising from 0, reaching 1 (1 - warmup for linear) at x = warmup itself."""
    schedule = SCHEDULES[name]
    low, high = sorted([a * warmup, b * warmup])
    damping = (lambda x: 1 - x) if name == "warmup_linear" else (lambda x: 1.0)
    assert math.isclose(schedule(low, warmup), low / warmup * damping(low), rel_tol=1e-12, abs_tol=1e-15)
    assert schedule(low, warmup) <= schedule(high, warmup)
    assert schedule(0.0, warmup) == 0.0
    assert math.isclose(schedule(warmup, warmup), damping(warmup), rel_tol=1e-12)


@given(WARMUPS)
def test_warmup_linear_reaches_zero_at_the_end(warmup):
    assert warmup_linear(1.0, warmup) == 0.0


@pytest.mark.parametrize("name", SCHEDULES)
@given(PROGRESS)
def test_zero_warmup_means_no_warmup(name, x):
    """With warmup = 0 there is no division by zero and no ramp: at x = 0 every schedule is at 1."""
    value = SCHEDULES[name](x, 0.0)
    after = {
        "warmup_linear": 1 - x,
        "warmup_cosine": 0.5 * (1 + math.cos(math.pi * x)),
        "warmup_constant": 1.0,
    }[name]
    assert math.isclose(value, after, rel_tol=1e-12, abs_tol=1e-15)
    assert SCHEDULES[name](0.0, 0.0) == 1.0
