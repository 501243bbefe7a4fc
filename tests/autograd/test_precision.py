"""The precision policies: under bf16, activations in bfloat16 from the embedding on, weights
and their gradients in float32, statistics in float32; TF32 on only inside its block; a bf16
step of a GPT close to the float32 one; the bfloat16 copies a bf16 run's weights keep, which give
the bits of casting the weights at each use, are never read stale, and exist under bf16 alone."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autograd as ag
from autograd import backend, precision, products
from autograd import functional as F
from autograd.optim import Adam
from autograd.testing import arrays
from tests import tf32
from tinygpt import GPT, GPTConfig

BF16 = ag.bfloat16
ROUNDING = 2**-8  # a bfloat16 keeps 8 significant bits: one rounding moves a value by at most 2^-8 of it


def host(x):
    """A tensor's or an array's values on the host, in float64."""
    return backend.to_host(x.data if isinstance(x, ag.Tensor) else x).astype(np.float64)


def relative_error(a, b):
    return np.linalg.norm(np.asarray(a, np.float64) - b) / max(np.linalg.norm(b), 1e-30)


def test_a_policy_holds_inside_its_block_only():
    assert precision.current() == "fp32"
    with ag.use_precision("bf16"):
        assert precision.current() == "bf16"
        with ag.use_precision("tf32"):
            assert precision.current() == "tf32"
        with ag.use_precision(None):
            assert precision.current() == "bf16"
    assert precision.current() == "fp32"
    with pytest.raises(ValueError, match="fp32, tf32, bf16"), ag.use_precision("fp16"):
        pass


def test_tf32_is_on_inside_its_block_and_off_after(monkeypatch):
    settings_made = []

    def set_tf32(on):
        settings_made.append(on)
        return settings_made[-2] if len(settings_made) > 1 else False

    monkeypatch.setattr(products, "set_tf32", set_tf32)
    with ag.use_precision("tf32"):
        with ag.use_precision("fp32"):
            pass
    assert settings_made == [True, False, True, False]


@settings(max_examples=10)
@given(st.integers(1, 6), st.integers(2, 16), st.integers(2, 8), st.integers(0, 2**32 - 1))
def test_bf16_layers_give_bfloat16_activations_and_float32_weight_gradients(device, n, width, classes, seed):
    """Embedding -> linear -> layer norm -> GELU -> cross-entropy under bf16: each activation is
    bfloat16, the loss float32, every weight's gradient float32 and finite."""
    rng = np.random.default_rng(seed)
    table, w, b = (
        ag.tensor(rng.standard_normal(shape), requires_grad=True, device=device)
        for shape in [(10, width), (width, classes), (classes,)]
    )
    with ag.use_precision("bf16"):
        x = F.embedding(rng.integers(0, 10, n), table)
        h = F.gelu(F.layer_norm(F.linear(x, w, b)))
        loss = F.cross_entropy(h, np.arange(n) % classes)
    loss.backward()
    assert (x.dtype, h.dtype, loss.dtype) == (BF16, BF16, np.float32)
    for p in (table, w, b):
        assert p.grad.dtype == np.float32 and np.isfinite(backend.to_host(p.grad)).all()


@given(st.integers(1, 8), st.integers(1, 32), st.integers(1, 8), st.integers(0, 2**32 - 1))
def test_bf16_linear_multiplies_bfloat16_values_and_adds_in_float32(device, rows, n_in, n_out, seed):
    """y = x W + b for bfloat16 x: the product of x's values and W rounded to bfloat16, summed in
    float32, rounded to bfloat16, plus b, rounded again; dW = x^T dy the same, kept in float32."""
    rng = np.random.default_rng(seed)
    x_values, w_values = rng.standard_normal((rows, n_in)).astype(BF16), rng.standard_normal((n_in, n_out))
    bias_values, upstream = rng.standard_normal(n_out), rng.standard_normal((rows, n_out)).astype(BF16)
    x = ag.tensor(x_values, dtype=BF16, requires_grad=True, device=device)
    w, b = (ag.tensor(v, requires_grad=True, device=device) for v in (w_values, bias_values))
    with ag.use_precision("bf16"):
        y = F.linear(x, w, b)
    y.backward(upstream)
    w_bf16 = w_values.astype(np.float32).astype(BF16).astype(np.float64)
    expected = x_values.astype(np.float64) @ w_bf16 + bias_values.astype(np.float32)
    scale = np.abs(x_values.astype(np.float64)) @ np.abs(w_bf16) + np.abs(
        bias_values
    )  # what rounding scales with
    assert y.dtype == BF16 and w.grad.dtype == np.float32 and x.grad.dtype == BF16
    assert (np.abs(host(y) - expected) <= 2 * ROUNDING * scale + 1e-6).all()
    expected_grad_w = x_values.astype(np.float64).T @ upstream.astype(np.float64)
    grad_scale = np.abs(x_values.astype(np.float64)).T @ np.abs(upstream.astype(np.float64))
    assert (np.abs(host(w.grad) - expected_grad_w) <= ROUNDING * grad_scale + 1e-6).all()


@given(arrays((3, 16), -0.5, 0.5))
def test_bf16_statistics_are_float32(device, noise):
    """Rows of 1000 plus small noise: in bfloat16 arithmetic the variance would be rounding noise;
    in float32 it is right, so layer norm of the bfloat16 rows is within one bfloat16 rounding
    of its float64 reference, and cross-entropy of bfloat16 logits is exactly float32's."""
    rows = (1000 + noise).astype(BF16)
    x = ag.tensor(rows, dtype=BF16, device=device)
    exact = rows.astype(np.float64)
    exact = (exact - exact.mean(axis=-1, keepdims=True)) / np.sqrt(exact.var(axis=-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(host(F.layer_norm(x)), exact, rtol=2 * ROUNDING, atol=2 * ROUNDING)
    targets = np.arange(3)
    losses = F.cross_entropy(x, targets, reduction="none")
    widened = F.cross_entropy(ag.tensor(rows.astype(np.float32), device=device), targets, reduction="none")
    assert losses.dtype == np.float32
    np.testing.assert_allclose(host(losses), host(widened), rtol=1e-6)


def test_bfloat16_stays_bfloat16_where_numpy_promotes_it(device):
    """bfloat16 times a Python number comes out of NumPy as float32; the engine gives bfloat16,
    forward and backward."""
    x = ag.tensor(np.ones((2, 3)), dtype=BF16, requires_grad=True, device=device)
    y = (x * 0.5 + 1.0) ** 2
    assert y.dtype == BF16
    y.sum().backward()
    assert x.grad.dtype == BF16
    np.testing.assert_array_equal(host(x.grad), np.full((2, 3), 1.5))


def test_a_module_carries_its_policy(device):
    ag.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, n_ctx=8, n_embd=16, n_layer=1, n_head=2)).to(device)
    ids = np.arange(6).reshape(1, 6)
    assert model(ids).dtype == np.float32
    model.precision = "bf16"
    assert model(ids).dtype == BF16 and precision.current() == "fp32"


def test_a_bf16_gpt_step_is_close_to_the_float32_step(device):
    """One training step of a small GPT, dropout on: the loss within 1e-3 and every parameter's
    gradient (float32) within 3% of the float32 step's, as bfloat16 rounding allows."""
    config = GPTConfig(vocab_size=64, n_ctx=16, n_embd=32, n_layer=2, n_head=4)
    ids = np.random.default_rng(0).integers(0, 64, (4, 17))
    steps = {}
    for policy in ("fp32", "bf16"):
        ag.manual_seed(0)
        model = GPT(config).to(device).train()
        with ag.use_precision(policy), ag.random.use_masks(ag.random.MaskStream(3, 1)):
            loss = F.cross_entropy(model(ids[:, :-1]), ids[:, 1:])
            loss.backward()
        steps[policy] = host(loss), {name: backend.to_host(p.grad) for name, p in model.named_parameters()}
    (loss32, grads32), (loss16, grads16) = steps["fp32"], steps["bf16"]
    assert abs(loss16 - loss32) <= 1e-3 * loss32
    for name, grad in grads16.items():
        assert grad.dtype == np.float32, name
        assert relative_error(grad, grads32[name]) <= 3e-2, name


def test_tf32_rounds_float32_products_and_spares_layer_norm(gpu_device):
    """On a GPU, a float32 product under tf32 differs from fp32's by about TF32's rounding, and
    layer norm, whose statistics are no product, gives the same bits under both. (TF32 off outside
    the tf32 block, whatever CUPY_TF32 asked for.)"""
    rng = np.random.default_rng(0)
    a, b = (ag.tensor(rng.standard_normal((256, 256)), device=gpu_device) for _ in range(2))
    exact = host(a) @ host(b)
    x = ag.tensor(rng.standard_normal((8, 768)) + 3, device=gpu_device)
    with tf32.off(gpu_device), ag.use_precision("fp32"):
        product32, norm32 = host(a @ b), host(F.layer_norm(x))
    with tf32.off(gpu_device), ag.use_precision("tf32"):
        product_tf32, norm_tf32 = host(a @ b), host(F.layer_norm(x))
    assert relative_error(product32, exact) < 1e-6 < relative_error(product_tf32, exact) < 1e-2
    np.testing.assert_array_equal(norm_tf32, norm32)


# ----- the bfloat16 copies that a bf16 run's weights keep (precision.kept_cast)

SMALL = GPTConfig(vocab_size=64, n_ctx=16, n_embd=32, n_layer=1, n_head=4)
IDS = np.random.default_rng(0).integers(0, 64, (2, 17))


def small_gpt(device, seed=0):
    ag.manual_seed(seed)
    return GPT(SMALL).to(device).train()


def bf16_steps(model, optimizer, steps, first=0):
    """The losses (host arrays) of bf16 training steps first, first + 1, ... of `model`, dropout on."""
    losses = []
    for step in range(first, first + steps):
        with ag.use_precision("bf16"), ag.random.use_masks(ag.random.MaskStream(0, step)):
            loss = F.cross_entropy(model(IDS[:, :-1]), IDS[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(host(loss))
    return losses


def cast_at_each_use(tensor, dtype):
    """precision.kept_cast without the keeping: what a bf16 step did before the copies."""
    with backend.device_scope(tensor._data):
        return tensor._data.astype(dtype, copy=False)


def weights(model):
    """Host copies of the parameters, by name (read without `.data`, which lets the copies go)."""
    return {name: p.numpy() for name, p in model.named_parameters()}


def test_bf16_steps_on_the_kept_copies_give_the_bits_of_casting_the_weights_at_each_use(device, monkeypatch):
    """Four bf16 steps of a small GPT, the weights read from their kept bfloat16 copies (on a GPU,
    written by Adam's kernel) and the run resumed after two from the state dicts into a new model and
    optimizer: the losses and weights of four steps that cast every weight at every use, bit for bit.
    The matrices keep copies (the tied embedding's included), nothing else does; the state dict holds
    the float32 weights alone."""
    model = small_gpt(device)
    optimizer = Adam(model.parameters(), lr=1e-2, l2=0.01)
    losses = bf16_steps(model, optimizer, 2)
    assert {name for name, p in model.named_parameters() if p._kept is not None} == {
        name for name, p in model.named_parameters() if p.ndim == 2 and name != "positions_embed.weight"
    }
    state, optimizer_state = model.state_dict(), optimizer.state_dict()
    assert state.keys() == weights(model).keys() and {a.dtype for a in state.values()} == {
        np.dtype(np.float32)
    }
    resumed = small_gpt(device, seed=1)
    bf16_steps(resumed, Adam(resumed.parameters()), 1)  # copies of other weights, which the load makes stale
    resumed.load_state_dict(state)
    optimizer = Adam(resumed.parameters())
    optimizer.load_state_dict(optimizer_state)
    losses += bf16_steps(resumed, optimizer, 2, first=2)

    monkeypatch.setattr(precision, "kept_cast", cast_at_each_use)
    model = small_gpt(device)
    expected = bf16_steps(model, Adam(model.parameters(), lr=1e-2, l2=0.01), 4)
    np.testing.assert_array_equal(losses, expected)
    for (name, got), want in zip(weights(resumed).items(), weights(model).values(), strict=True):
        np.testing.assert_array_equal(got, want, err_msg=name)


CHANGES = [
    "write into .data",
    "set .data",
    "scale .data",
    "load_state_dict",
    "Adam",
    "Adam's reference",
    "to",
]


@pytest.mark.parametrize("change", CHANGES)
def test_a_changed_weight_is_never_read_from_a_stale_copy(device, change):
    """A bf16 forward of a small GPT makes its weights' copies; after the weights change (or move to another
    device), the next bf16 forward gives the bits of a new model that holds the changed weights."""
    model = small_gpt(device).eval()
    with ag.use_precision("bf16"):
        before = host(model(IDS[:, :-1]))
    params, on = dict(model.named_parameters()), backend.parse_device(device)
    other = "cpu" if on != "cpu" else "cuda-emulated"
    new = {name: values * 1.5 + 0.01 for name, values in weights(model).items()}
    if change == "write into .data":
        for name, p in params.items():
            p.data[...] = backend.to_device(new[name], on)
    elif change == "set .data":
        for name, p in params.items():
            p.data = backend.to_device(new[name], on)
    elif change == "scale .data":
        for p in params.values():
            p.data *= 1.5
    elif change == "load_state_dict":
        model.load_state_dict(new)
    elif change in ("Adam", "Adam's reference"):
        for p in params.values():
            p.grad = p.xp.ones_like(p._data)
        with ag.use_reference(change == "Adam's reference"):
            Adam(model.parameters(), lr=0.1).step()
    else:
        model.to(other)
    fresh = small_gpt("cpu", seed=1).eval()
    fresh.load_state_dict(weights(model))
    fresh.to(other if change == "to" else device)
    with ag.use_precision("bf16"):
        after, expected = host(model(IDS[:, :-1])), host(fresh(IDS[:, :-1]))
    np.testing.assert_array_equal(after, expected)
    assert change == "to" or not np.array_equal(after, before)


@pytest.mark.parametrize("policy", ["fp32", "tf32"])
def test_fp32_and_tf32_steps_keep_no_copies(device, policy):
    model = small_gpt(device)
    optimizer = Adam(model.parameters())
    with ag.use_precision(policy):
        F.cross_entropy(model(IDS[:, :-1]), IDS[:, 1:]).backward()
    optimizer.step()
    assert all(p._kept is None for p in model.parameters())
