"""GPTConfig: the presets, checks at construction, and the openai-gpt config.json mapping."""

import json
import math
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


# ----- every field checked, sizes bounded, config.json named in every error -----------------------
@pytest.mark.parametrize(
    "field, bad",
    [
        ("afn", ["gelu"]),
        ("embd_pdrop", "0.1"),
        ("attn_pdrop", None),
        ("resid_pdrop", math.nan),
        ("layer_norm_epsilon", "1e-5"),
        ("layer_norm_epsilon", 0.0),
        ("layer_norm_epsilon", math.inf),
        ("initializer_range", [0.02]),
        ("initializer_range", math.nan),
        ("initializer_range", -0.02),
    ],
)
def test_a_field_of_the_wrong_type_or_range_is_refused_by_name(field, bad):
    """Not only the sizes: the activation, the rates, epsilon and the init's std are checked too,
    each a ValueError naming the field (never a TypeError, nor a config that fails later)."""
    with pytest.raises(ValueError, match=field):
        GPTConfig(**{field: bad})


@pytest.mark.parametrize(
    "sizes",
    [
        dict(vocab_size=10**12),
        dict(n_inner=10**9),
        dict(n_ctx=10**9, n_embd=64, n_head=4),
        dict(n_layer=10**7, n_embd=1, n_head=1),
    ],
)
def test_a_model_too_large_to_build_is_refused_by_the_config(sizes):
    """More than MAX_PARAMETERS parameters, or MAX_LAYERS blocks, is refused at construction, so
    GPT never starts allocating them (a vocab_size of 10**12 would be petabytes)."""
    with pytest.raises(ValueError, match="more than the"):
        GPTConfig(**sizes)


@given(configs())
def test_parameter_shapes_and_count_are_the_models(config):
    """parameter_shapes() names and shapes GPT(config)'s parameters; n_parameters counts them."""
    model = GPT(config)
    assert config.parameter_shapes() == {name: p.shape for name, p in model.named_parameters()}
    assert config.n_parameters == model.num_parameters()


SMALL = dict(vocab_size=23, n_ctx=8, n_embd=16, n_layer=2, n_head=2)
SMALL_HF = json.dumps(GPTConfig(**SMALL).to_hf_dict())


def pretrained_folder(folder, config_text):
    """A folder as save_pretrained writes it for a small model, its config.json then replaced."""
    GPT(GPTConfig(**SMALL)).save_pretrained(folder)
    (folder / "config.json").write_bytes(
        config_text if isinstance(config_text, bytes) else config_text.encode()
    )
    return folder


@pytest.mark.parametrize(
    "config_text, why",
    [
        (b'{"n_embd": 16,\n "afn": "\xff"}', r"line 2: not valid UTF-8"),
        ('{"n_embd": 16,\n "n_head": }', r"line 2 column 12: not valid JSON"),
        ("[16, 2]", "expected a JSON object"),
        ('{"afn": ["gelu"]}', "afn must be one of"),
        ('{"layer_norm_epsilon": "small"}', "layer_norm_epsilon"),
        (SMALL_HF.replace('"vocab_size": 23', '"vocab_size": 1000000000000'), "more than the"),
        (SMALL_HF.replace('"n_layer": 2', '"n_layer": 3'), r"missing keys: h\.2\.attn\.c_attn\.weight"),
        (SMALL_HF.replace('"n_inner": 64', '"n_inner": 100000'), r"h\.0\.mlp\.c_fc\.weight \(16, 64\)"),
    ],
)
def test_from_pretrained_names_config_json_and_what_is_wrong(tmp_path, config_text, why):
    """A config.json that is not UTF-8 or JSON, of the wrong shape, with a field of the wrong type,
    or with sizes its weights do not have: a ValueError that names the file and what is wrong."""
    folder = pretrained_folder(tmp_path / "model", config_text)
    with pytest.raises(ValueError, match=why) as error:
        GPT.from_pretrained(folder)
    assert str(folder) in str(error.value)


def test_from_pretrained_checks_the_weights_before_building_the_model(tmp_path, monkeypatch):
    """A config.json whose sizes ask for more than the weights hold is refused before GPT(config)
    allocates anything (here 10**8 rows of embedding that model.safetensors does not have)."""
    folder = pretrained_folder(
        tmp_path / "model", SMALL_HF.replace('"vocab_size": 23', '"vocab_size": 100000000')
    )
    monkeypatch.setattr(GPT, "__init__", lambda self, config: pytest.fail("GPT(config) was built"))
    with pytest.raises(
        ValueError, match=r"tokens_embed\.weight \(23, 16\), the config makes \(100000000, 16\)"
    ):
        GPT.from_pretrained(folder)
