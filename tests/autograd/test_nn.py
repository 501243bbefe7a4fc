"""autograd.nn: how Modules find, name, save, load and move their parameters, their training
mode, and each layer checked against a direct NumPy computation and, in float64, against finite
differences with respect to its input and every one of its parameters.
"""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import autograd as ag
from autograd import backend, nn
from autograd.testing import arrays, away_from_zero, indices, leaf, shapes
from tests.helpers import EXACT, SEEDS, check_layer_gradients, host, on, with_values

pytestmark = pytest.mark.usefixtures("each_path")  # every test on the fast and the reference paths


def assert_bitwise_equal(arrays_a, arrays_b):
    assert list(arrays_a) == list(arrays_b)
    for name in arrays_a:
        a, b = backend.to_host(arrays_a[name]), backend.to_host(arrays_b[name])
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), name


# NumPy references -------------------------------------------------------------------------------


def ref_layer_norm(x, weight, bias, eps):
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps) * weight + bias


# A model to exercise registration -----------------------------------------------------------------


class Block(nn.Module):
    """LayerNorm then Linear, with dropout after."""

    def __init__(self, d):
        self.ln = nn.LayerNorm(d)
        self.fc = nn.Linear(d, d)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.fc(self.ln(x)))


class Net(nn.Module):
    """Embedding, a list of Blocks (names h.0..., h.1...), and a bias-free head; a plain Tensor
    attribute and a None bias are not parameters."""

    def __init__(self, vocab=5, d=3, n_blocks=2):
        self.embed = nn.Embedding(vocab, d)
        self.h = [Block(d) for _ in range(n_blocks)]
        self.head = nn.Linear(d, vocab, bias=False)
        self.not_a_parameter = ag.tensor(np.ones(d), requires_grad=True)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.h:
            x = block(x)
        return self.head(x)


def net_names(n_blocks):
    """Net's parameter names in assignment order, written out."""
    blocks = [
        f"h.{i}.{name}" for i in range(n_blocks) for name in ("ln.weight", "ln.bias", "fc.weight", "fc.bias")
    ]
    return ["embed.weight", *blocks, "head.weight"]


# Registration --------------------------------------------------------------------------------------


@given(st.integers(0, 3), st.integers(1, 4), st.integers(1, 4))
def test_named_parameters_are_dotted_paths_in_assignment_order(n_blocks, vocab, d):
    """Names are dotted attribute paths (list items by index), in the order assigned; parameters()
    are the same objects in that order; num_parameters() counts every entry."""
    net = Net(vocab, d, n_blocks)
    named = list(net.named_parameters())
    assert [name for name, _ in named] == net_names(n_blocks)
    assert net.parameters()[0] is net.embed.weight and net.parameters()[-1] is net.head.weight
    assert all(p is q for p, (_, q) in zip(net.parameters(), named)) and len(net.parameters()) == len(named)
    if n_blocks:
        assert dict(named)["h.0.fc.weight"] is net.h[0].fc.weight
    assert net.num_parameters() == vocab * d + n_blocks * (d + d + d * d + d) + d * vocab
    assert list(net.state_dict()) == net_names(n_blocks)


def test_a_parameter_assigned_between_submodules_keeps_its_place():
    """The order is that of assignment even when a Parameter comes after a sub-module."""

    class Mixed(nn.Module):
        def __init__(self):
            self.first = nn.Linear(2, 2)
            self.scale = nn.Parameter(np.ones(2, dtype=np.float32))
            self.last = nn.Linear(2, 2)

    names = [name for name, _ in Mixed().named_parameters()]
    assert names == ["first.weight", "first.bias", "scale", "last.weight", "last.bias"]


def test_layers_name_their_parameters_like_the_gpt_checkpoints():
    """Names and shapes of the layers' parameters (the openai-gpt state-dict layout; GPT's own layers
    in tests/tinygpt/test_model_layers.py)."""
    shapes_of = lambda m: [(name, p.shape) for name, p in m.named_parameters()]  # noqa: E731
    assert shapes_of(nn.Linear(3, 5)) == [("weight", (3, 5)), ("bias", (5,))]
    assert shapes_of(nn.Linear(3, 5, bias=False)) == [("weight", (3, 5))]
    assert shapes_of(nn.Embedding(7, 4)) == [("weight", (7, 4))]
    assert shapes_of(nn.LayerNorm(6)) == [("weight", (6,)), ("bias", (6,))]
    assert shapes_of(nn.Dropout(0.1)) == []


# state_dict / load_state_dict ------------------------------------------------------------------------


def test_state_dict_round_trip_is_bitwise_and_copies(device):
    """Loading one model's state_dict into another gives bitwise the same parameters, as copies:
    changing the source afterwards leaves the loaded model alone."""
    source, target = Net().to(device), Net().to(device)
    for p in source.parameters():
        p.data += 0.5  # so that no parameter of the target starts equal to the source's
    assert target.load_state_dict(source.state_dict()) == ([], [])
    assert_bitwise_equal(host(target), host(source))
    loaded = host(target)
    for p in source.parameters():
        p.data += 1
    assert_bitwise_equal(host(target), loaded)


def test_load_state_dict_keeps_dtype_and_device(device):
    """Host float64 arrays load into float32 parameters on the module's device as float32."""
    net = Net().to(device)
    state = {name: np.full(p.shape, 0.1, dtype=np.float64) for name, p in net.named_parameters()}
    net.load_state_dict(state)
    for name, p in net.named_parameters():
        assert p.device == on(device) and p.dtype == np.float32, name
        np.testing.assert_array_equal(p.numpy(), np.float32(0.1))


def broken_state(net, missing, unexpected, misshaped):
    """A host copy of net's state_dict, every value + 1 (so that a load shows), with, as asked,
    'h.1.fc.bias' removed, 'h.9.ln.weight' added and 'head.weight' transposed; and
    {word the error should use: key} for each problem made."""
    state = {name: backend.to_host(a).copy() for name, a in net.state_dict().items()}
    problems = {}
    if missing:
        del state["h.1.fc.bias"]
        problems["missing"] = "h.1.fc.bias"
    if unexpected:
        state["h.9.ln.weight"] = np.zeros(3, dtype=np.float32)
        problems["unexpected"] = "h.9.ln.weight"
    if misshaped:
        state["head.weight"] = state["head.weight"].T.copy()
        problems["shape"] = "head.weight"
    for a in state.values():
        a += 1  # so that a load that happened shows
    return state, problems


@given(st.booleans(), st.booleans(), st.booleans())
def test_strict_load_names_every_bad_key_in_one_error_and_changes_nothing(missing, unexpected, misshaped):
    """With strict=True, missing, unexpected and mis-shaped keys all appear, by name, in one
    ValueError, and no parameter changes; a clean state_dict loads."""
    net = Net()
    before = host(net)
    state, problems = broken_state(net, missing, unexpected, misshaped)
    if not problems:
        assert net.load_state_dict(state) == ([], [])
        assert_bitwise_equal(host(net), {name: state[name] for name in before})
        return
    with pytest.raises(ValueError) as error:
        net.load_state_dict(state)
    message = str(error.value)
    for kind, key in problems.items():
        assert kind in message and key in message
    for key in {"h.1.fc.bias", "h.9.ln.weight", "head.weight"} - set(problems.values()):
        assert key not in message
    assert_bitwise_equal(host(net), before)


@given(st.booleans(), st.booleans())
def test_non_strict_load_returns_missing_and_unexpected_but_refuses_mis_shaped(missing, unexpected):
    """With strict=False, the keys present load and (missing, unexpected) come back; a
    mis-shaped key is still a ValueError that names it, with nothing changed."""
    net = Net()
    before = host(net)
    state, problems = broken_state(net, missing, unexpected, misshaped=True)
    with pytest.raises(ValueError, match="head.weight"):
        net.load_state_dict(state, strict=False)
    assert_bitwise_equal(host(net), before)

    state["head.weight"] = state["head.weight"].T.copy()
    result = net.load_state_dict(state, strict=False)
    assert result == (
        [problems["missing"]] if missing else [],
        [problems["unexpected"]] if unexpected else [],
    )
    for name, value in host(net).items():
        np.testing.assert_array_equal(value, state[name] if name in state else before[name])


@pytest.mark.parametrize("state", [[1, 2], "weights.safetensors", None], ids=["list", "path", "None"])
def test_load_state_dict_refuses_what_is_not_a_dict(state):
    net = Net()
    with pytest.raises(TypeError, match=r"^load_state_dict: state must be a dict of name -> array, not "):
        net.load_state_dict(state)


def test_load_state_dict_names_the_entries_that_are_not_arrays_of_numbers():
    """Lists, None and text are refused by name, with nothing loaded; a Tensor gives its array."""
    net = Net()
    before = host(net)
    state = {name: p for name, p in net.named_parameters()}
    state["head.weight"], state["head.bias"] = [[0.0]], np.array(["a"])
    with pytest.raises(TypeError, match=r"not arrays of numbers: head.weight \(list\), head.bias \(<U1\)$"):
        net.load_state_dict(state)
    assert_bitwise_equal(host(net), before)


# Modes, devices, gradients --------------------------------------------------------------------------


def test_train_and_eval_reach_every_submodule():
    """eval() and train() set the mode of the module and everything below it (list items too)
    and return the module; eval() on a child leaves its parent alone."""
    net = Net()
    modules = [m for _, m in net.named_modules()]
    assert len(modules) == 1 + 1 + 2 * 4 + 1 and all(m.training for m in modules)
    assert net.eval() is net and not any(m.training for m in modules)
    assert net.train() is net and all(m.training for m in modules)
    net.h[1].eval()
    assert net.training and net.h[0].drop.training and not net.h[1].drop.training and not net.h[1].fc.training
    net.train(False)
    assert not any(m.training for m in modules)


@given(st.lists(st.integers(0, 4), min_size=1, max_size=6), SEEDS)
def test_eval_switches_dropout_off(device, ids, seed):
    """In eval mode the output is deterministic and equals the same model with dropout p = 0;
    in training mode (p = 0.5) dropout changes it."""
    net = with_values(Net(), seed, device)
    ids = np.array([ids])
    net.eval()
    evaluated = net(ids).numpy()
    np.testing.assert_array_equal(net(ids).numpy(), evaluated)
    for block in net.h:
        block.drop.p = 0.0
    net.train()
    np.testing.assert_array_equal(net(ids).numpy(), evaluated)
    for block in net.h:
        block.drop.p = 0.5
    assert not np.allclose(net(ids).numpy(), evaluated)


def test_to_moves_parameters_and_gradients_and_back_to_cpu(device):
    """to(device) puts every parameter and gradient on that device, values unchanged; to('cpu')
    brings them back as NumPy arrays; both return the module."""
    net = Net()
    for p in net.parameters():
        p.grad = np.full(p.shape, 2.0, dtype=p.dtype)
    values = host(net)
    assert net.to(device) is net
    for p in net.parameters():
        assert p.device == on(device) and backend.device_of(p.grad) == on(device)
    assert_bitwise_equal(host(net), values)
    assert net.to("cpu") is net
    for p in net.parameters():
        assert isinstance(p.data, np.ndarray) and isinstance(p.grad, np.ndarray)
        np.testing.assert_array_equal(p.grad, 2.0)
    assert_bitwise_equal(host(net), values)


def test_zero_grad_clears_every_gradient(device):
    """After a backward pass every parameter has a gradient; zero_grad() sets them all to None."""
    net = Net().to(device).eval()
    net(np.array([[0, 3, 4]])).sum().backward()
    assert all(p.grad is not None for p in net.parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())


# Linear ------------------------------------------------------------------------------------------------


def test_linear_init_is_normal_002_with_zero_bias():
    """weight is (n_in, n_out) float32 with mean 0 and std 0.02 (or the std asked), bias is zero."""
    ag.manual_seed(0)
    layer = nn.Linear(200, 100)
    w = layer.weight.numpy()
    assert w.shape == (200, 100) and w.dtype == np.float32
    assert abs(w.mean()) < 6 * 0.02 / math.sqrt(w.size)
    assert abs(w.std() / 0.02 - 1) < 0.03
    assert layer.bias.dtype == np.float32 and layer.bias.shape == (100,) and not layer.bias.numpy().any()
    assert abs(nn.Linear(100, 100, std=0.5).weight.numpy().std() / 0.5 - 1) < 0.03
    assert layer.weight.requires_grad and layer.bias.requires_grad


@st.composite
def linear_cases(draw):
    """(x of shape (..., n_in), n_out, bias?, seed for the parameters)."""
    x = draw(arrays(shapes(min_dims=1, max_dims=3)))
    return x, draw(st.integers(1, 4)), draw(st.booleans()), draw(SEEDS)


@given(linear_cases())
def test_linear_is_x_times_weight_plus_bias(device, case):
    """Linear(x) = x @ weight + bias over the last axis; without bias, x @ weight."""
    x, n_out, bias, seed = case
    layer = with_values(nn.Linear(x.shape[-1], n_out, bias=bias), seed, device)
    assert (layer.bias is not None) == bias
    p = host(layer)
    np.testing.assert_allclose(layer(leaf(x, device)).numpy(), x @ p["weight"] + p.get("bias", 0.0), **EXACT)


@given(linear_cases())
def test_linear_gradient(device, case):
    """Gradients of x, weight and bias match finite differences."""
    x, n_out, bias, seed = case
    check_layer_gradients(
        with_values(nn.Linear(x.shape[-1], n_out, bias=bias), seed, device), leaf(x, device)
    )


# Embedding ---------------------------------------------------------------------------------------------


def test_embedding_init_is_normal_002():
    """The table is (n, d) float32 with mean 0 and std 0.02."""
    ag.manual_seed(0)
    w = nn.Embedding(500, 40).weight.numpy()
    assert w.shape == (500, 40) and w.dtype == np.float32
    assert abs(w.mean()) < 6 * 0.02 / math.sqrt(w.size) and abs(w.std() / 0.02 - 1) < 0.03


def int_ids(n):
    """Integer ids of 1 or 2 axes in [0, n), repeats likely."""
    return indices(n, shapes(min_dims=1, max_dims=2))


@given(st.data())
def test_embedding_picks_rows(device, data):
    """Embedding(ids)[..., :] is weight[ids], for ids as a plain array or a Tensor."""
    n, d = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 3))
    ids = data.draw(int_ids(n))
    layer = with_values(nn.Embedding(n, d), data.draw(SEEDS), device)
    expected = host(layer)["weight"][ids]
    np.testing.assert_array_equal(layer(ids).numpy(), expected)
    np.testing.assert_array_equal(layer(ag.tensor(ids, device=device)).numpy(), expected)


@given(st.data())
def test_embedding_gradient(device, data):
    """The weight's gradient (rows picked several times add up) matches finite differences."""
    n, d = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 3))
    ids = backend.to_device(data.draw(int_ids(n)), on(device))
    check_layer_gradients(with_values(nn.Embedding(n, d), data.draw(SEEDS), device), ids)


# LayerNorm ---------------------------------------------------------------------------------------------


@given(arrays(shapes(min_dims=1, max_dims=3)))
def test_layer_norm_starts_as_plain_normalisation(device, x):
    """At init the gain is 1 and the bias 0 (float32), so the output (here in float64) is
    (x - mean) / sqrt(var + eps)."""
    layer = nn.LayerNorm(x.shape[-1]).to(device)
    assert layer.weight.dtype == layer.bias.dtype == np.float32
    np.testing.assert_array_equal(layer.weight.numpy(), 1.0)
    np.testing.assert_array_equal(layer.bias.numpy(), 0.0)
    for p in layer.parameters():
        p.data = p.data.astype(np.float64)
    np.testing.assert_allclose(layer(leaf(x, device)).numpy(), ref_layer_norm(x, 1.0, 0.0, 1e-5), **EXACT)


@given(arrays(shapes(min_dims=1, max_dims=3)), st.sampled_from([1e-5, 0.5]), SEEDS)
def test_layer_norm_applies_gain_bias_and_eps(device, x, eps, seed):
    """LayerNorm(x) = (x - mean) / sqrt(var + eps) * weight + bias over the last axis."""
    layer = with_values(nn.LayerNorm(x.shape[-1], eps=eps), seed, device)
    p = host(layer)
    np.testing.assert_allclose(
        layer(leaf(x, device)).numpy(), ref_layer_norm(x, p["weight"], p["bias"], eps), **EXACT
    )


@given(arrays(shapes(min_dims=1, max_dims=3)), SEEDS)
def test_layer_norm_gradient(device, x, seed):
    """Gradients of x, gain and bias match finite differences."""
    check_layer_gradients(with_values(nn.LayerNorm(x.shape[-1]), seed, device), leaf(x, device))


# Dropout -----------------------------------------------------------------------------------------------


@given(away_from_zero(shapes(min_dims=1, max_dims=3)), st.sampled_from([0.1, 0.5, 0.9]), SEEDS)
def test_dropout_module_drops_in_training_and_not_in_eval(device, x, p, seed):
    """Training: each entry is 0 or x / (1 - p). Eval: the input unchanged."""
    ag.manual_seed(seed)
    drop = nn.Dropout(p)
    out = drop(leaf(x, device)).numpy()
    kept = out != 0
    np.testing.assert_allclose(out[kept], x[kept] / (1 - p), rtol=1e-12)
    np.testing.assert_array_equal(drop.eval()(leaf(x, device)).numpy(), x)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_module_drops_a_fraction_p(device, p):
    """In training, about a fraction p of 20000 entries become 0 (within 5 standard deviations)."""
    ag.manual_seed(0)
    out = nn.Dropout(p)(ag.tensor(np.ones(20000), device=device)).numpy()
    assert abs((out == 0).mean() - p) < 5 * math.sqrt(p * (1 - p) / out.size)


@given(arrays(shapes(min_dims=1, max_dims=3)), st.sampled_from([0.2, 0.5]), SEEDS)
def test_dropout_module_gradient(device, x, p, seed):
    """In training, with the mask fixed by the seed, the gradient matches finite differences."""
    check_layer_gradients(nn.Dropout(p), leaf(x, device), seed)
