"""GPTConfig: the presets, checks at construction, and the openai-gpt config.json mapping."""

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinygpt import GPT, GPTConfig

SIZES = ("vocab_size", "n_ctx", "n_embd", "n_layer", "n_head", "n_inner")
RATES = ("embd_pdrop", "attn_pdrop", "resid_pdrop")

# config.json of the openai-gpt checkpoint on the Hugging Face hub
HF_OPENAI_GPT = {
    "afn": "gelu",
    "architectures": ["OpenAIGPTLMHeadModel"],
    "attn_pdrop": 0.1,
    "embd_pdrop": 0.1,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "model_type": "openai-gpt",
    "n_ctx": 512,
    "n_embd": 768,
    "n_head": 12,
    "n_layer": 12,
    "n_positions": 512,
    "n_special": 0,
    "predict_special_tokens": True,
    "resid_pdrop": 0.1,
    "summary_activation": None,
    "summary_first_dropout": 0.1,
    "summary_proj_to_labels": True,
    "summary_type": "cls_index",
    "summary_use_proj": True,
    "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
    "vocab_size": 40478,
}


def non_embedding_parameters(c):
    """Weights and biases of the blocks: attention, projections, MLP, two LayerNorms each."""
    d, inner = c.n_embd, c.n_inner
    per_block = (d * 3 * d + 3 * d) + (d * d + d) + (d * inner + inner) + (inner * d + d) + 2 * (2 * d)
    return c.n_layer * per_block


@st.composite
def configs(draw):
    """Valid configs with small sizes and drawn rates and activation."""
    n_head = draw(st.integers(1, 4))
    return GPTConfig(
        vocab_size=draw(st.integers(1, 100)),
        n_ctx=draw(st.integers(1, 64)),
        n_embd=n_head * draw(st.integers(1, 8)),
        n_layer=draw(st.integers(1, 4)),
        n_head=n_head,
        n_inner=draw(st.integers(1, 64)),
        afn=draw(st.sampled_from(["gelu", "gelu_new", "gelu_exact"])),
        embd_pdrop=draw(st.floats(0, 0.9)),
        attn_pdrop=draw(st.floats(0, 0.9)),
        resid_pdrop=draw(st.floats(0, 0.9)),
        layer_norm_epsilon=draw(st.floats(1e-12, 1e-3)),
        initializer_range=draw(st.floats(1e-3, 1.0)),
    )


def test_gpt1_preset_has_the_papers_sizes():
    """gpt1: 40478 tokens, 512 positions, 768 wide, 12 layers of 12 heads, MLP 3072 wide."""
    c = GPTConfig.gpt1()
    assert (c.vocab_size, c.n_ctx, c.n_embd, c.n_layer, c.n_head, c.n_inner) == (
        40478,
        512,
        768,
        12,
        12,
        3072,
    )
    assert (c.embd_pdrop, c.attn_pdrop, c.resid_pdrop) == (0.1, 0.1, 0.1)
    assert c.afn == "gelu" and c.layer_norm_epsilon == 1e-5 and c.initializer_range == 0.02


def test_mini_preset_sizes():
    """mini: 4 layers, 256 wide, 4 heads, 256 positions, MLP four times as wide."""
    c = GPTConfig.mini()
    assert (c.n_layer, c.n_embd, c.n_head, c.n_ctx, c.n_inner) == (4, 256, 4, 256, 1024)


def test_tiny_preset_has_about_a_million_parameters_besides_embeddings():
    """tiny: roughly 1M parameters in its blocks (the model built from it agrees), fewer than mini."""
    tiny, mini = GPTConfig.tiny(), GPTConfig.mini()
    assert 0.8e6 <= non_embedding_parameters(tiny) <= 1.2e6
    assert GPT(GPTConfig.tiny(vocab_size=50)).num_parameters() - (
        50 + tiny.n_ctx
    ) * tiny.n_embd == non_embedding_parameters(tiny)
    assert non_embedding_parameters(tiny) < non_embedding_parameters(mini)


@pytest.mark.parametrize("name", ["gpt1", "mini", "tiny"])
def test_preset_by_name_equals_the_classmethod(name):
    """GPTConfig.preset(name) is the same config as GPTConfig.<name>(), overrides included."""
    assert GPTConfig.preset(name) == getattr(GPTConfig, name)()
    assert GPTConfig.preset(name, vocab_size=99) == getattr(GPTConfig, name)(vocab_size=99)


def test_unknown_preset_is_refused_with_the_choices():
    """An unknown preset name is a ValueError that names it and lists the real ones."""
    with pytest.raises(ValueError, match="gpt7") as error:
        GPTConfig.preset("gpt7")
    assert all(name in str(error.value) for name in ("gpt1", "mini", "tiny"))


@given(
    st.sampled_from(["gpt1", "mini", "tiny"]),
    st.integers(1, 50_000),
    st.integers(1, 1024),
    st.integers(1, 6),
    st.floats(0, 0.99),
)
def test_overrides_replace_only_the_fields_given(name, vocab_size, n_ctx, n_layer, dropout):
    """Keyword overrides change those fields of a preset and leave the rest as they were."""
    base = GPTConfig.preset(name)
    c = GPTConfig.preset(name, vocab_size=vocab_size, n_ctx=n_ctx, n_layer=n_layer, attn_pdrop=dropout)
    assert (c.vocab_size, c.n_ctx, c.n_layer, c.attn_pdrop) == (vocab_size, n_ctx, n_layer, dropout)
    assert (c.n_embd, c.n_head, c.n_inner, c.embd_pdrop, c.resid_pdrop) == (
        base.n_embd,
        base.n_head,
        base.n_inner,
        base.embd_pdrop,
        base.resid_pdrop,
    )


@given(st.integers(1, 64))
def test_n_inner_defaults_to_four_times_the_width(n_embd):
    """Without n_inner, the MLP is 4 * n_embd wide; given, it is kept."""
    assert GPTConfig(n_embd=n_embd, n_head=1).n_inner == 4 * n_embd
    assert GPTConfig(n_embd=n_embd, n_head=1, n_inner=7).n_inner == 7


@given(st.integers(1, 2048), st.integers(1, 64))
def test_width_not_divisible_by_heads_is_refused(n_embd, n_head):
    """n_embd % n_head != 0 is a ValueError at construction that names both numbers."""
    if n_embd % n_head == 0:
        GPTConfig(n_embd=n_embd, n_head=n_head)
        return
    with pytest.raises(ValueError) as error:
        GPTConfig(n_embd=n_embd, n_head=n_head)
    message = str(error.value)
    assert re.search(rf"\bn_embd\b\D*\b{n_embd}\b", message) and re.search(
        rf"\bn_head\b\D*\b{n_head}\b", message
    )


@pytest.mark.parametrize("field", SIZES)
@given(bad=st.one_of(st.integers(-1000, 0), st.sampled_from([2.0, "8", True])))
def test_non_positive_or_non_integer_sizes_are_refused(field, bad):
    """Every size must be a positive int: zero, negatives, floats, strings and bools name the field."""
    with pytest.raises(ValueError, match=field):
        GPTConfig(**{"n_head": 1, field: bad})


@pytest.mark.parametrize("field", RATES)
@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5])
def test_dropout_rates_outside_zero_to_one_are_refused(field, bad):
    """Dropout probabilities must lie in [0, 1)."""
    with pytest.raises(ValueError, match=field):
        GPTConfig(**{field: bad})


def test_unknown_activation_is_refused():
    """afn must be a GELU variant the model knows."""
    with pytest.raises(ValueError, match="afn"):
        GPTConfig(afn="relu6")


@given(configs())
def test_hf_dict_round_trip(config):
    """from_hf_dict(to_hf_dict(c)) == c, through JSON, with n_ctx written as n_positions."""
    hf = json.loads(json.dumps(config.to_hf_dict()))
    assert hf["model_type"] == "openai-gpt"
    assert hf["n_positions"] == config.n_ctx
    assert GPTConfig.from_hf_dict(hf) == config


@given(configs())
def test_to_dict_round_trip(config):
    """GPTConfig(**c.to_dict()) == c."""
    assert GPTConfig(**config.to_dict()) == config


def test_hub_openai_gpt_config_reads_as_gpt1():
    """The openai-gpt config.json from the hub, with its extra keys, is the gpt1 preset."""
    assert GPTConfig.from_hf_dict(HF_OPENAI_GPT) == GPTConfig.gpt1()


@given(
    st.integers(1, 4096),
    st.dictionaries(
        st.text(min_size=1).filter(lambda k: k not in GPTConfig().to_dict() and k != "n_positions"),
        st.none() | st.integers() | st.text(),
        max_size=5,
    ),
)
def test_from_hf_dict_takes_n_positions_and_ignores_unknown_keys(n_positions, extra):
    """n_positions becomes n_ctx; keys GPTConfig does not know are ignored."""
    c = GPTConfig.from_hf_dict({**extra, "n_positions": n_positions, "n_embd": 64, "n_head": 4})
    assert c == GPTConfig(n_ctx=n_positions, n_embd=64, n_head=4)
