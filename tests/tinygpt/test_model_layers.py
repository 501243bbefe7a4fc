"""GPT-1's own layers (tinygpt/model.py): masked multi-head self-attention and the MLP, each checked
against a direct NumPy computation and, in float64, against finite differences with respect to its
input and every one of its parameters; their parameters named as the openai-gpt checkpoints name them.
"""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import autograd as ag
from autograd.testing import arrays, away_from_zero, leaf, shapes
from tests.helpers import EXACT, SEEDS, check_layer_gradients, host, ref_gelu_tanh, with_values
from tinygpt.model import MLP, CausalSelfAttention

pytestmark = pytest.mark.usefixtures("each_path")  # every test on the fast and the reference paths


def test_the_layers_name_their_parameters_like_the_gpt_checkpoints():
    shapes_of = lambda m: [(name, p.shape) for name, p in m.named_parameters()]  # noqa: E731
    assert shapes_of(CausalSelfAttention(6, 2)) == [
        ("c_attn.weight", (6, 18)),
        ("c_attn.bias", (18,)),
        ("c_proj.weight", (6, 6)),
        ("c_proj.bias", (6,)),
    ]
    assert shapes_of(MLP(4, 10)) == [
        ("c_fc.weight", (4, 10)),
        ("c_fc.bias", (10,)),
        ("c_proj.weight", (10, 4)),
        ("c_proj.bias", (4,)),
    ]


def ref_causal_self_attention(x, p, n_head):
    """c_attn, split into q, k, v, each into heads; causal softmax attention; heads merged; c_proj."""
    batch, time, width = x.shape
    q, k, v = np.split(x @ p["c_attn.weight"] + p["c_attn.bias"], 3, axis=-1)
    q, k, v = (a.reshape(batch, time, n_head, width // n_head).transpose(0, 2, 1, 3) for a in (q, k, v))
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(width // n_head)
    future = np.arange(time)[None, :] > np.arange(time)[:, None]
    scores = np.where(future, -np.inf, scores)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    y = (weights @ v).transpose(0, 2, 1, 3).reshape(batch, time, width)
    return y @ p["c_proj.weight"] + p["c_proj.bias"]


def ref_mlp(x, p):
    hidden = ref_gelu_tanh(x @ p["c_fc.weight"] + p["c_fc.bias"])
    return hidden @ p["c_proj.weight"] + p["c_proj.bias"]


# CausalSelfAttention ------------------------------------------------------------------------------------


@st.composite
def attention_cases(draw, min_time=1):
    """(n_head, x of shape (batch, time, n_head * head width), seed for the parameters)."""
    n_head, head_width = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    batch, time = draw(st.integers(1, 2)), draw(st.integers(min_time, 4))
    return n_head, draw(arrays((batch, time, n_head * head_width))), draw(SEEDS)


@pytest.mark.parametrize("n_embd, n_head", [(5, 2), (6, 4), (3, 6)])
def test_attention_rejects_width_not_divisible_by_heads(n_embd, n_head):
    with pytest.raises(ValueError):
        CausalSelfAttention(n_embd, n_head)


@given(attention_cases())
def test_attention_in_eval_equals_numpy_computation(device, case):
    """With dropout switched off by eval() (attn and resid p = 0.5), the output is, on every call,
    c_proj of the merged heads of causal softmax(q k^T / sqrt(head width)) v, computed directly."""
    n_head, x, seed = case
    attn = with_values(
        CausalSelfAttention(x.shape[-1], n_head, attn_pdrop=0.5, resid_pdrop=0.5), seed, device
    )
    attn.eval()
    expected = ref_causal_self_attention(x, host(attn), n_head)
    np.testing.assert_allclose(attn(leaf(x, device)).numpy(), expected, **EXACT)
    np.testing.assert_allclose(attn(leaf(x, device)).numpy(), expected, **EXACT)


@given(attention_cases(), SEEDS)
def test_attention_dropout_is_on_in_training(device, case, dropout_seed):
    """In training mode with p = 0.5 the output is not the dropout-free one."""
    n_head, x, seed = case
    attn = with_values(
        CausalSelfAttention(x.shape[-1], n_head, attn_pdrop=0.5, resid_pdrop=0.5), seed, device
    )
    ag.manual_seed(dropout_seed)
    out = attn(leaf(x, device)).numpy()
    assert not np.allclose(out, ref_causal_self_attention(x, host(attn), n_head))


@given(attention_cases(min_time=2), st.data())
def test_attention_is_causal(device, case, data):
    """Changing the inputs after position t leaves the outputs up to t unchanged (and does change
    the output at t + 1)."""
    n_head, x, seed = case
    attn = with_values(CausalSelfAttention(x.shape[-1], n_head), seed, device).eval()
    t = data.draw(st.integers(0, x.shape[1] - 2))
    changed = x.copy()
    changed[:, t + 1 :] += data.draw(away_from_zero(changed[:, t + 1 :].shape))
    before, after = attn(leaf(x, device)).numpy(), attn(leaf(changed, device)).numpy()
    np.testing.assert_allclose(after[:, : t + 1], before[:, : t + 1], rtol=1e-12, atol=1e-12)
    assert not np.allclose(after[:, t + 1], before[:, t + 1], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("training", [False, True])
@given(attention_cases(), SEEDS)
def test_attention_gradient(device, training, case, dropout_seed):
    """Gradients of x and of c_attn's and c_proj's weight and bias match finite differences, with
    dropout off (eval) and on (training, masks fixed by the seed)."""
    n_head, x, seed = case
    attn = with_values(
        CausalSelfAttention(x.shape[-1], n_head, attn_pdrop=0.3, resid_pdrop=0.3), seed, device
    )
    check_layer_gradients(attn.train(training), leaf(x, device), dropout_seed)


# MLP ---------------------------------------------------------------------------------------------------


@st.composite
def mlp_cases(draw):
    """(x of shape (..., n_embd), n_inner, seed for the parameters)."""
    return draw(arrays(shapes(min_dims=1, max_dims=3))), draw(st.integers(1, 6)), draw(SEEDS)


@given(mlp_cases())
def test_mlp_in_eval_equals_numpy_computation(device, case):
    """With dropout off (eval, p = 0.5), MLP(x) = c_proj(gelu_tanh(c_fc(x))), computed directly."""
    x, n_inner, seed = case
    mlp = with_values(MLP(x.shape[-1], n_inner, resid_pdrop=0.5), seed, device).eval()
    np.testing.assert_allclose(mlp(leaf(x, device)).numpy(), ref_mlp(x, host(mlp)), **EXACT)


@pytest.mark.parametrize("training", [False, True])
@given(mlp_cases(), SEEDS)
def test_mlp_gradient(device, training, case, dropout_seed):
    """Gradients of x and of c_fc's and c_proj's weight and bias match finite differences, with
    dropout off (eval) and on (training, mask fixed by the seed)."""
    x, n_inner, seed = case
    mlp = with_values(MLP(x.shape[-1], n_inner, resid_pdrop=0.3), seed, device)
    check_layer_gradients(mlp.train(training), leaf(x, device), dropout_seed)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("sublayer", ["attention", "mlp"])
def test_a_sublayer_called_alone_is_its_projection_plus_its_bias(sublayer, precision):
    """forward (what a user calls) and project (what a post-LN block hands its residual layer norm)
    differ by c_proj's bias and the dropout alone, under bf16 too (its activations bfloat16, the bias
    float32)."""
    ag.manual_seed(0)
    layer = (CausalSelfAttention(16, 2) if sublayer == "attention" else MLP(16, 64)).eval()
    dtype = ag.bfloat16 if precision == "bf16" else np.float32
    x = ag.tensor(np.random.default_rng(0).standard_normal((2, 5, 16)), dtype=dtype)
    with ag.use_precision(precision):
        out, projected = layer(x), layer.project(x)
    assert out.dtype == x.dtype
    expected = projected.numpy().astype(np.float64) + layer.c_proj.bias.numpy()
    np.testing.assert_allclose(out.numpy().astype(np.float64), expected, rtol=2**-7, atol=2**-7)
