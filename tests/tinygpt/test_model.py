"""GPT: the openai-gpt parameter layout, tied head, causality, training, and checkpoints in and out."""

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import autograd as ag
from autograd import backend, nn
from autograd import functional as F
from autograd.gradcheck import gradcheck
from autograd.optim import Adam
from autograd.serialization import load_file, load_file_with_metadata, save_file
from autograd.testing import indices
from tests import tf32
from tinygpt import GPT, GPTConfig
from tinygpt.weights import dependencies

SHARED = Path(__file__).parents[2] / ".." / "shared"
GPT1_PARAMETERS = 116_534_784
SMALL = dict(vocab_size=23, n_ctx=8, n_embd=16, n_layer=2, n_head=2)
NO_DROPOUT = dict(embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)
BLOCK_PARAMETERS = (
    "attn.c_attn.weight",
    "attn.c_attn.bias",
    "attn.c_proj.weight",
    "attn.c_proj.bias",
    "ln_1.weight",
    "ln_1.bias",
    "mlp.c_fc.weight",
    "mlp.c_fc.bias",
    "mlp.c_proj.weight",
    "mlp.c_proj.bias",
    "ln_2.weight",
    "ln_2.bias",
)

# Examples of one test reuse its tmp_path, each writing its own files over the last ones.
reuses_tmp_path = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])


def block_shapes(c):
    """Shapes of one block's parameters, in BLOCK_PARAMETERS order (weights are (in, out))."""
    d, inner = c.n_embd, c.n_inner
    return [
        (d, 3 * d),
        (3 * d,),
        (d, d),
        (d,),
        (d,),
        (d,),
        (d, inner),
        (inner,),
        (inner, d),
        (d,),
        (d,),
        (d,),
    ]


def openai_gpt_layout(c):
    """(name, shape) of each parameter of the Hugging Face openai-gpt model, in state-dict order."""
    layout = [
        ("tokens_embed.weight", (c.vocab_size, c.n_embd)),
        ("positions_embed.weight", (c.n_ctx, c.n_embd)),
    ]
    for i in range(c.n_layer):
        layout += [(f"h.{i}.{name}", shape) for name, shape in zip(BLOCK_PARAMETERS, block_shapes(c))]
    return layout


def original_layout(c):
    """(name, shape) in the order of the original release's params_shapes.json: positions, tokens,
    then each block, with the 2-D block weights stored as [1, in, out] (1x1 convolutions)."""
    layout = [
        ("positions_embed.weight", [c.n_ctx, c.n_embd]),
        ("tokens_embed.weight", [c.vocab_size, c.n_embd]),
    ]
    for i in range(c.n_layer):
        layout += [
            (f"h.{i}.{name}", [1, *shape] if len(shape) == 2 else list(shape))
            for name, shape in zip(BLOCK_PARAMETERS, block_shapes(c))
        ]
    return layout


def small_model(device="cpu", seed=0, **overrides):
    ag.manual_seed(seed)
    return GPT(GPTConfig(**{**SMALL, **overrides})).to(device)


def randomize(model, seed, scale=0.3):
    """Give every parameter (gains and biases too) random values, so no two are alike."""
    rng = np.random.default_rng(seed)
    model.load_state_dict(
        {name: (rng.standard_normal(p.shape) * scale).astype(p.dtype) for name, p in model.named_parameters()}
    )
    return model


def host(x):
    return backend.to_host(x.data if isinstance(x, ag.Tensor) else x)


def token_ids(config):
    """(batch, time) token ids that fit `config`: up to 3 sequences of up to n_ctx tokens."""
    shapes = st.tuples(st.integers(1, 3), st.integers(1, config["n_ctx"]))
    return indices(config["vocab_size"], shapes)


@pytest.fixture(scope="module")
def gpt1():
    """The full-size GPT-1, built once for this module; tests only read it."""
    ag.manual_seed(0)
    return GPT(GPTConfig.gpt1())


# ----- size, names, shapes, init ---------------------------------------------------------------
def test_gpt1_has_116_534_784_parameters(gpt1):
    """The count from the architecture (embeddings + 12 blocks of attention, MLP and two LayerNorms)."""
    V, P, D, L, inner = 40478, 512, 768, 12, 3072
    per_block = (D * 3 * D + 3 * D) + (D * D + D) + 2 * D + (D * inner + inner) + (inner * D + D) + 2 * D
    expected = V * D + P * D + L * per_block
    assert expected == GPT1_PARAMETERS
    assert gpt1.num_parameters() == sum(p.size for p in gpt1.parameters()) == GPT1_PARAMETERS


def test_parameter_names_and_shapes_are_the_openai_gpt_layout(gpt1):
    """Names, order and shapes equal the openai-gpt state dict: no lm_head, no final LayerNorm."""
    layout = [(name, p.shape) for name, p in gpt1.named_parameters()]
    assert layout == openai_gpt_layout(gpt1.config)
    assert dict(layout)["h.0.attn.c_attn.weight"] == (768, 2304)
    assert list(gpt1.state_dict()) == [name for name, _ in layout]


def test_original_params_shapes_json_is_the_gpt1_layout(gpt1):
    """../shared's params_shapes.json lists the gpt1 parameters in the original order and shapes."""
    path = SHARED / "data" / "gpt1-bpe" / "params_shapes.json"
    if not path.exists():
        pytest.skip(f"{path} is not present")
    shapes = json.loads(path.read_text())
    params = dict(gpt1.named_parameters())
    expected = original_layout(gpt1.config)
    assert shapes == [shape for _, shape in expected]
    assert [int(np.prod(shape)) for shape in shapes] == [params[name].size for name, _ in expected]


def test_init_is_normal_with_std_002_zero_biases_and_unit_gains(gpt1):
    """Every weight matrix is N(0, 0.02^2) (mean, std and the share within one std), independently
    drawn per layer; every bias is 0 and every LayerNorm gain is 1; all float32."""
    for name, p in gpt1.named_parameters():
        values = p.data
        assert values.dtype == np.float32, name
        if ".ln_" in name:
            assert np.all(values == (1 if name.endswith("weight") else 0)), name
        elif name.endswith("bias"):
            assert np.all(values == 0), name
        else:
            n = values.size
            assert abs(values.mean(dtype=np.float64)) < 6 * 0.02 / math.sqrt(n), name
            assert abs(values.std(dtype=np.float64) - 0.02) < 6 * 0.02 / math.sqrt(2 * n), name
            inside = np.mean(np.abs(values) < 0.02)
            assert abs(inside - 0.6827) < 6 * math.sqrt(0.6827 * 0.3173 / n), name
    first, second = (gpt1.state_dict()[f"h.{i}.attn.c_attn.weight"] for i in (0, 1))
    assert not np.array_equal(first, second)


@given(st.floats(0.005, 2.0))
def test_init_std_follows_initializer_range(std):
    """initializer_range sets the std of the weights."""
    ag.manual_seed(1)
    model = GPT(GPTConfig(vocab_size=300, n_ctx=4, n_embd=64, n_layer=1, n_head=2, initializer_range=std))
    for name, p in model.named_parameters():
        if p.ndim == 2:
            assert abs(p.data.std() / std - 1) < 6 / math.sqrt(2 * p.size), name


# ----- forward: no final LayerNorm, tied head, causality, dropout -------------------------------
@given(token_ids(SMALL), st.floats(2.0, 5.0), st.floats(0.5, 3.0))
def test_hidden_states_are_the_last_blocks_ln_2_output(device, ids, gain, shift):
    """With the last ln_2 set to gain g and bias c, every hidden vector has mean c and std g:
    nothing (no final LayerNorm) comes after the last block."""
    model = small_model(device).eval()
    last = model.h[-1].ln_2
    last.weight.data = last.weight.xp.full_like(last.weight.data, gain)
    last.bias.data = last.bias.xp.full_like(last.bias.data, shift)
    hidden = host(model.hidden_states(ids))
    assert hidden.shape == ids.shape + (SMALL["n_embd"],)
    np.testing.assert_allclose(hidden.mean(axis=-1), shift, atol=1e-4)
    np.testing.assert_allclose(hidden.std(axis=-1), gain, rtol=1e-2)
    assert sum(isinstance(m, nn.LayerNorm) for _, m in model.named_modules()) == 2 * SMALL["n_layer"]


@given(token_ids(SMALL), st.integers(0, 2**32 - 1))
def test_logits_are_hidden_states_times_the_token_embedding(device, ids, seed):
    """The LM head is tied: logits == hidden_states @ tokens_embed.weight.T, shape (B, T, V)."""
    model = randomize(small_model(device), seed).eval()
    logits, hidden = host(model(ids)), host(model.hidden_states(ids))
    assert logits.shape == ids.shape + (SMALL["vocab_size"],)
    table = host(model.tokens_embed.weight)
    terms = (np.abs(hidden) @ np.abs(table).T).max()  # a TF32 product's error is of their size
    np.testing.assert_allclose(logits, hidden @ table.T, **tf32.tolerance(device, 1e-5, 1e-5, scale=terms))


@given(st.integers(0, 2**32 - 1))
def test_token_embedding_gradient_includes_the_lm_heads_part(device, seed):
    """For tokens absent from the input, the embedding's gradient is the head's alone,
    sum over positions of dL/dlogits[..., v] * hidden; for present tokens the lookup adds to it."""
    model = randomize(small_model(device, **NO_DROPOUT), seed).eval()
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 10, (2, SMALL["n_ctx"]))
    weights = rng.standard_normal((2, SMALL["n_ctx"], SMALL["vocab_size"])).astype(np.float32)
    hidden = host(model.hidden_states(ids))
    (model(ids) * backend.to_device(weights, model.tokens_embed.weight.device)).sum().backward()
    grad = host(model.tokens_embed.weight.grad)
    head_part = np.einsum("btv,btd->vd", weights, hidden)
    absent = np.setdiff1d(np.arange(SMALL["vocab_size"]), ids)
    present = np.unique(ids)
    # the size of the terms summed into an entry, of which a TF32 product's error is a fraction
    terms = np.einsum("btv,btd->vd", np.abs(weights), np.abs(hidden)).max()
    tolerance = tf32.tolerance(device, rtol=1e-4, atol=1e-5, scale=terms)
    np.testing.assert_allclose(grad[absent], head_part[absent], **tolerance)
    assert np.abs(grad[present] - head_part[present]).max() > 1e-3


@given(st.data())
def test_changing_later_tokens_leaves_earlier_logits_unchanged(device, data):
    """Causality: in eval mode, replacing the tokens after position t changes no logit at 0..t,
    while the logits at the first changed position do change."""
    ids = data.draw(token_ids(SMALL).filter(lambda ids: ids.shape[1] >= 2), label="ids")
    t = data.draw(st.integers(0, ids.shape[1] - 2), label="t")
    shift = data.draw(st.integers(1, SMALL["vocab_size"] - 1), label="shift")
    model = randomize(small_model(device), data.draw(st.integers(0, 2**32 - 1), label="seed")).eval()
    changed = ids.copy()
    changed[:, t + 1 :] = (changed[:, t + 1 :] + shift) % SMALL["vocab_size"]
    before, after = host(model(ids)), host(model(changed))
    np.testing.assert_allclose(after[:, : t + 1], before[:, : t + 1], rtol=1e-6, atol=1e-6)
    assert not np.allclose(after[:, t + 1], before[:, t + 1], rtol=1e-4, atol=1e-4)


def test_eval_is_deterministic_and_train_applies_dropout(device):
    """eval(): repeated calls give the same logits as the same weights with no dropout at all;
    train() with dropout gives different logits on each call."""
    ids = np.random.default_rng(0).integers(0, SMALL["vocab_size"], (2, SMALL["n_ctx"]))
    model = randomize(small_model(device, embd_pdrop=0.1, attn_pdrop=0.1, resid_pdrop=0.1), 3)
    plain = small_model(device, **NO_DROPOUT)
    plain.load_state_dict(model.state_dict())
    assert model.eval() is model and not any(m.training for _, m in model.named_modules())
    first, second = host(model(ids)), host(model(ids))
    assert np.array_equal(first, second)
    assert np.array_equal(first, host(plain(ids)))
    assert model.train() is model and all(m.training for _, m in model.named_modules())
    one, two = host(model(ids)), host(model(ids))
    assert not np.array_equal(one, two) and not np.array_equal(one, first)


# ----- gradients and training ------------------------------------------------------------------
def test_whole_model_gradient_matches_finite_differences(device):
    """gradcheck of a 2-layer, 8-wide, 2-head GPT (vocab 11, 6 positions) in float64, with
    respect to every parameter."""
    config = dict(vocab_size=11, n_ctx=6, n_embd=8, n_layer=2, n_head=2, **NO_DROPOUT)
    model = randomize(small_model(device, **config), seed=5, scale=0.5)
    for p in model.parameters():
        p.data = p.data.astype(np.float64)
    ids = np.random.default_rng(5).integers(0, 11, (2, 6))
    params = model.parameters()
    assert len(params) == 2 + 12 * 2
    gradcheck(lambda *_: model(ids), params)


def test_tiny_model_overfits_one_batch(device):
    """GPTConfig.tiny cut to two layers, with a small vocabulary and no dropout, learns one batch to
    near-zero loss with Adam within 60 steps."""
    ag.manual_seed(0)
    model = GPT(GPTConfig.tiny(vocab_size=16, n_ctx=8, n_layer=2, **NO_DROPOUT)).to(device)
    ids = np.random.default_rng(1).integers(0, 16, (4, 9))
    ids[:, 0] = np.arange(4)  # distinct first tokens: every prefix determines its next token
    optimizer = Adam(model.parameters(), lr=5e-3)
    first = None
    for _ in range(60):
        loss = F.cross_entropy(model(ids[:, :-1]), ids[:, 1:])
        first = loss.item() if first is None else first
        if loss.item() < 0.02:
            break
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert first > 2.0 and loss.item() < 0.02


LR = 1e-2


def test_a_training_step_gives_the_same_numbers_on_numpy_and_cupy(gpu_device):
    """One forward, backward and Adam step of the same model on the CPU and on the GPU agree to
    float32 tolerance: the loss, every gradient, and every updated parameter. The CPU's numbers are
    the reference; where the GPU's float32 products run in TF32 (CUPY_TF32=1), its results are held
    to TF32's error of the size of their terms."""
    config = GPTConfig(**{**SMALL, **NO_DROPOUT})
    ids = np.random.default_rng(3).integers(0, config.vocab_size, (3, config.n_ctx + 1))
    results = []
    for device in ("cpu", gpu_device):
        model = randomize(GPT(config), seed=4).to(device)
        optimizer = Adam(model.parameters(), lr=LR, l2=0.01)
        loss = F.cross_entropy(model(ids[:, :-1]), ids[:, 1:])
        loss.backward()
        grads = {name: host(p.grad) for name, p in model.named_parameters()}
        optimizer.step()
        results.append((loss.item(), grads, {name: host(p) for name, p in model.named_parameters()}))
    (cpu_loss, cpu_grads, cpu_params), (gpu_loss, gpu_grads, gpu_params) = results
    loss_tolerance = tf32.tolerance(gpu_device, rtol=1e-5, atol=0.0)  # logits of about unit size
    assert gpu_loss == pytest.approx(cpu_loss, rel=loss_tolerance["rtol"], abs=loss_tolerance["atol"])
    for name in cpu_grads:
        scale = np.abs(cpu_grads[name]).max()  # the size of the largest terms of a gradient's sums
        tolerance = tf32.tolerance(gpu_device, rtol=1e-3, atol=1e-6, scale=scale)
        np.testing.assert_allclose(gpu_grads[name], cpu_grads[name], **tolerance, err_msg=name)
        # Adam's first step moves each entry by about lr * sign(g): only a clear sign is reproducible
        clear = np.abs(cpu_grads[name]) > 1e-4
        tolerance = tf32.tolerance(gpu_device, rtol=1e-5, atol=1e-6, scale=LR)  # the step's size
        np.testing.assert_allclose(
            gpu_params[name][clear], cpu_params[name][clear], **tolerance, err_msg=name
        )


# ----- vocabulary growth and input checks ------------------------------------------------------
@given(st.integers(1, 5))
def test_resize_token_embeddings_keeps_old_rows_and_adds_new_ones(device, extra):
    """Growing to V + k tokens keeps the V old rows bit for bit, adds k rows, updates vocab_size;
    the new ids are accepted, get logits, and get gradients through the tied head."""
    model = small_model(device, **NO_DROPOUT)
    old = host(model.tokens_embed.weight).copy()
    n = SMALL["vocab_size"] + extra
    model.resize_token_embeddings(n)
    weight = model.tokens_embed.weight
    assert weight.shape == (n, SMALL["n_embd"]) and weight.dtype == np.float32
    assert np.array_equal(host(weight)[: SMALL["vocab_size"]], old)
    assert model.config.vocab_size == n
    assert any(p is weight for p in model.parameters())
    ids = np.array([[n - 1, 0, n - 1]])
    logits = model(ids)
    assert logits.shape == (1, 3, n)
    logits.sum().backward()
    assert np.abs(host(weight.grad)[SMALL["vocab_size"] :]).sum() > 0


def test_resized_rows_are_drawn_like_the_rest():
    """The new rows are N(0, initializer_range^2), not zeros or copies."""
    model = small_model()
    model.resize_token_embeddings(SMALL["vocab_size"] + 2000)
    new = host(model.tokens_embed.weight)[SMALL["vocab_size"] :]
    assert abs(new.std() - 0.02) < 6 * 0.02 / math.sqrt(2 * new.size)
    assert abs(new.mean()) < 6 * 0.02 / math.sqrt(new.size)


@given(st.integers(1, 22))
def test_resize_token_embeddings_refuses_to_shrink(fewer):
    """Asking for fewer tokens is a ValueError and changes nothing."""
    model = small_model()
    before = host(model.tokens_embed.weight).copy()
    with pytest.raises(ValueError, match=str(SMALL["vocab_size"] - fewer)):
        model.resize_token_embeddings(SMALL["vocab_size"] - fewer)
    assert (
        np.array_equal(host(model.tokens_embed.weight), before)
        and model.config.vocab_size == SMALL["vocab_size"]
    )


BAD_IDS = {
    "id equal to the vocabulary size": (np.array([[0, SMALL["vocab_size"]]]), r"\[0, 23\)"),
    "negative id": (np.array([[-1, 3]]), r"\[0, 23\)"),
    "longer than n_ctx": (np.zeros((1, SMALL["n_ctx"] + 1), np.int64), r"longer than n_ctx=8"),
    "float ids": (np.zeros((1, 3), np.float32), r"integer"),
    "bool ids": (np.zeros((1, 3), bool), r"integer"),
    "1-D ids": (np.zeros(3, np.int64), r"\(batch, time\)"),
    "3-D ids": (np.zeros((1, 2, 3), np.int64), r"\(batch, time\)"),
    "no tokens": (np.zeros((1, 0), np.int64), r"of shape \(1, 0\) hold no tokens"),
    "no sequences": (np.zeros((0, 3), np.int64), r"of shape \(0, 3\) hold no tokens"),
    "text": ("the cat", r"integer"),
    "None": (None, r"integer"),
}


@pytest.mark.parametrize("case", list(BAD_IDS))
def test_bad_token_ids_are_a_value_error_that_says_why(device, case):
    """Ids outside the vocabulary, too long, not integer, or not 2-D: ValueError saying which."""
    ids, message = BAD_IDS[case]
    model = small_model(device)
    for call in (model, model.hidden_states):
        with pytest.raises(ValueError, match=message):
            call(ids)


@given(st.integers(SMALL["vocab_size"], 10**6) | st.integers(-(10**6), -1))
def test_any_id_outside_the_vocabulary_is_refused(device, bad):
    """Every id below 0 or at least vocab_size is refused with the valid range."""
    with pytest.raises(ValueError, match=r"\[0, 23\)"):
        small_model(device)(np.array([[1, bad, 2]]))


# ----- checkpoints: save_pretrained / from_pretrained -------------------------------------------
def test_save_pretrained_round_trip_is_bitwise(device, tmp_path):
    """from_pretrained(save_pretrained(m)) has the same config, state dict (names, order, bits)
    and logits, on the device asked for."""
    model = randomize(small_model(device), 7).eval()
    model.save_pretrained(tmp_path / "ckpt")
    loaded = GPT.from_pretrained(tmp_path / "ckpt", device=device).eval()
    assert loaded.config == model.config
    assert list(loaded.state_dict()) == list(model.state_dict())
    for name, array in model.state_dict().items():
        other = loaded.state_dict()[name]
        assert backend.device_of(other) == backend.device_of(array)
        assert other.dtype == array.dtype and np.array_equal(host(other), host(array)), name
    ids = np.random.default_rng(7).integers(0, SMALL["vocab_size"], (2, SMALL["n_ctx"]))
    assert np.array_equal(host(loaded(ids)), host(model(ids)))


def test_save_pretrained_writes_the_openai_gpt_files(tmp_path):
    """config.json says model_type openai-gpt with n_positions; model.safetensors holds the
    state dict under the openai-gpt names."""
    model = small_model()
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "openai-gpt"
    assert config["n_positions"] == SMALL["n_ctx"]
    assert {k: config[k] for k in ("vocab_size", "n_embd", "n_layer", "n_head")} == {
        k: SMALL[k] for k in ("vocab_size", "n_embd", "n_layer", "n_head")
    }
    weights = load_file(tmp_path / "model.safetensors")
    assert [(k, v.shape) for k, v in weights.items()] == openai_gpt_layout(model.config)


def test_saved_weights_carry_the_format_transformers_requires(tmp_path):
    """transformers 4.x refuses a model.safetensors whose metadata format is not pt/tf/flax/mlx;
    the weights are PyTorch-layout tensors, so the format must be "pt"."""
    small_model().save_pretrained(tmp_path)
    _, metadata = load_file_with_metadata(tmp_path / "model.safetensors")
    assert metadata.get("format") == "pt"


# ----- a training run folder (as train/checkpoint.py and train.finetune write it, here by hand)
def run_folder(root, steps, unfinished=()):
    """A run folder: its own config.json (the run's, not a model's), checkpoints/<step>/ for each
    step with a model of its own, state.json only in the finished ones, and a .partial folder as a
    killed save leaves. Returns {step: model}."""
    root.mkdir(exist_ok=True)
    (root / "config.json").write_text(json.dumps({"model": SMALL, "settings": {}}))
    models = {step: randomize(small_model(), step) for step in (*steps, *unfinished)}
    for step, model in models.items():
        model.save_pretrained(root / "checkpoints" / str(step))
        if step in steps:
            (root / "checkpoints" / str(step) / "state.json").write_text(json.dumps({"step": step}))
        (root / "checkpoints" / str(step) / "digests.json").write_text(json.dumps(dependencies(root)))
    randomize(small_model(), 99).save_pretrained(root / "checkpoints" / ".partial-1000-123")
    return models


def assert_same_weights(model, other):
    for name, array in other.state_dict().items():
        assert np.array_equal(model.state_dict()[name], array), name


def test_from_pretrained_takes_a_run_folders_newest_whole_checkpoint(tmp_path):
    """Steps are compared as numbers (10 is newer than 5), and a checkpoint whose state.json was
    never written (its save did not finish) is passed over, as is a .partial folder."""
    models = run_folder(tmp_path / "run", steps=(5, 10), unfinished=(20,))
    assert_same_weights(GPT.from_pretrained(tmp_path / "run"), models[10])
    assert_same_weights(GPT.from_pretrained(tmp_path / "run" / "checkpoints" / "5"), models[5])


def test_from_pretrained_takes_a_fine_tunes_best_epoch_over_its_newest_checkpoint(tmp_path):
    run_folder(tmp_path / "run", steps=(5, 10))
    best = randomize(small_model(), 3)
    best.save_pretrained(tmp_path / "run" / "best")
    (tmp_path / "run" / "best" / "digests.json").write_text(json.dumps(dependencies(tmp_path / "run")))
    assert_same_weights(GPT.from_pretrained(tmp_path / "run"), best)


@pytest.mark.parametrize("case", ["empty", "run without checkpoints", "missing"])
def test_from_pretrained_of_a_folder_without_weights_says_so(tmp_path, case):
    folder = tmp_path / "run"
    if case == "run without checkpoints":
        run_folder(folder, steps=(), unfinished=(5,))
    elif case == "empty":
        folder.mkdir()
    message = "no such folder" if case == "missing" else "no weights here"
    with pytest.raises(FileNotFoundError, match=f"{re.escape(str(folder))}: {message}"):
        GPT.from_pretrained(folder)


def write_checkpoint(directory, config, state):
    directory.mkdir(exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config.to_hf_dict()))
    save_file(state, directory / "model.safetensors")
    return directory


def test_from_pretrained_accepts_the_transformer_prefix_and_skips_head_and_mask_buffers(tmp_path):
    """Keys as transformers writes them ('transformer.' prefix, a tied lm_head.weight, causal-mask
    buffers h.N.attn.bias and masked_bias) load into the same parameters."""
    model = randomize(small_model(), 11)
    state = {f"transformer.{name}": array for name, array in model.state_dict().items()}
    state["lm_head.weight"] = np.zeros((SMALL["vocab_size"], SMALL["n_embd"]), np.float32)
    for i in range(SMALL["n_layer"]):
        state[f"transformer.h.{i}.attn.bias"] = np.tril(np.ones((SMALL["n_ctx"],) * 2, np.float32))[
            None, None
        ]
        state[f"transformer.h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)
    loaded = GPT.from_pretrained(write_checkpoint(tmp_path / "hf", model.config, state))
    for name, array in model.state_dict().items():
        assert np.array_equal(loaded.state_dict()[name], array), name


@pytest.mark.parametrize("fault", ["missing", "mis-shaped", "unexpected"])
@reuses_tmp_path
@given(st.sampled_from([name for name, _ in openai_gpt_layout(GPTConfig(**SMALL))]))
def test_from_pretrained_names_a_missing_misshaped_or_unexpected_key(tmp_path, fault, name):
    """A checkpoint lacking a parameter, holding one of the wrong shape, or holding one the
    model does not have is a ValueError that names that key."""
    model = small_model()
    state = dict(model.state_dict())
    if fault == "missing":
        del state[name]
    elif fault == "mis-shaped":
        state[name] = np.zeros(state[name].shape + (1,), np.float32)
    else:
        name = name.replace("h.0.", "h.7.").replace("h.1.", "h.7.").replace("_embed", "_embed_extra")
        state[name] = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match=re.escape(name)):
        GPT.from_pretrained(write_checkpoint(tmp_path / "bad", model.config, state))


def test_transformers_loads_our_checkpoint_and_we_load_theirs(tmp_path):
    """save_pretrained -> transformers' OpenAIGPTLMHeadModel gives the same logits, and its
    save_pretrained -> from_pretrained gives back the same parameters."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = randomize(small_model(**NO_DROPOUT), 13).eval()
    model.save_pretrained(tmp_path / "ours")
    theirs = transformers.OpenAIGPTLMHeadModel.from_pretrained(tmp_path / "ours").eval()
    ids = np.random.default_rng(13).integers(0, SMALL["vocab_size"], (2, SMALL["n_ctx"]))
    with torch.no_grad():
        their_logits = theirs(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(host(model(ids)), their_logits, rtol=1e-4, atol=1e-5)
    theirs.save_pretrained(tmp_path / "theirs")
    back = GPT.from_pretrained(tmp_path / "theirs")
    for name, array in model.state_dict().items():
        assert np.array_equal(back.state_dict()[name], array), name


# ----- the original OpenAI release: params_shapes.json + params_{i}.npy ------------------------
ORIGINAL = GPTConfig(vocab_size=13, n_ctx=7, n_embd=12, n_layer=2, n_head=12)


def write_original_release(directory, config, cuts, extra=0):
    """Write params_shapes.json and the flat parameters 0, 1, 2, ... cut at `cuts` into
    params_0.npy, params_1.npy, ... (`extra` more numbers, or fewer when negative).
    Returns {name: array} each parameter should get, with [1, in, out] weights as (in, out)."""
    layout = original_layout(config)
    sizes = [int(np.prod(shape)) for _, shape in layout]
    directory.mkdir(exist_ok=True)
    (directory / "params_shapes.json").write_text(json.dumps([shape for _, shape in layout]))
    for i, piece in enumerate(np.split(np.arange(sum(sizes) + extra, dtype=np.float32), cuts)):
        np.save(directory / f"params_{i}.npy", piece)
    flat, offsets = np.arange(sum(sizes), dtype=np.float32), np.cumsum([0] + sizes)
    return {
        name: flat[offsets[k] : offsets[k + 1]].reshape(shape[1:] if len(shape) == 3 else shape)
        for k, (name, shape) in enumerate(layout)
    }


def three_shard_cuts(total):
    return st.lists(st.integers(0, total), min_size=2, max_size=2).map(sorted)


ORIGINAL_TOTAL = sum(int(np.prod(shape)) for _, shape in original_layout(ORIGINAL))


@reuses_tmp_path
@given(three_shard_cuts(ORIGINAL_TOTAL), st.booleans())
def test_from_openai_puts_every_original_parameter_in_its_place(tmp_path, cuts, pass_config):
    """Shards in the original layout (positions, tokens, then per block c_attn w [1,in,out], b,
    c_proj w, b, ln_1 g, b, c_fc w, b, mlp c_proj w, b, ln_2 g, b), split over three
    params_i.npy files, load with each number where it belongs; the config is read off the shapes."""
    expected = write_original_release(tmp_path / "orig", ORIGINAL, cuts)
    model = GPT.from_openai(
        tmp_path / "orig", config=GPTConfig(**{**ORIGINAL.to_dict(), "n_head": 3}) if pass_config else None
    )
    assert (model.config.vocab_size, model.config.n_ctx, model.config.n_embd, model.config.n_layer) == (
        13,
        7,
        12,
        2,
    )
    assert model.config.n_head == (3 if pass_config else 12)
    state = model.state_dict()
    assert set(state) == set(expected)
    for name, array in expected.items():
        assert np.array_equal(state[name], array), name


@reuses_tmp_path
@given(st.integers(-40, 40).filter(bool), st.data())
def test_from_openai_refuses_shards_of_the_wrong_total_size(tmp_path, extra, data):
    """Shards holding more or fewer numbers than the shapes need are a ValueError."""
    cuts = data.draw(three_shard_cuts(ORIGINAL_TOTAL + extra), label="cuts")
    write_original_release(tmp_path / "orig", ORIGINAL, cuts, extra=extra)
    with pytest.raises(ValueError, match="params"):
        GPT.from_openai(tmp_path / "orig")


BAD_SHAPES_FILES = {  # case: (params_shapes.json made from the right shapes, what the error says)
    "not JSON": (lambda shapes: "[[7, 12], [13", r"not JSON"),
    "a dict": (lambda shapes: '{"shapes": []}', r"must hold a list of shapes, not a dict"),
    "a side that is text": (lambda shapes: '[[7, 12], ["13", 12]]', r"shape 1 is \['13', 12\], not a list"),
    "a negative side": (lambda shapes: "[[7, 12], [-13, 12]]", r"shape 1 is \[-13, 12\]"),
    "a shape that is a number": (lambda shapes: "[[7, 12], 13]", r"shape 1 is 13"),
    "one shape for all": (
        lambda shapes: json.dumps([[ORIGINAL_TOTAL]]),
        r"1 shapes are not two 2-D embeddings and blocks of 12",
    ),
    "a flat embedding": (lambda shapes: json.dumps([[84], *shapes[1:]]), r"26 shapes are not two 2-D"),
}


@pytest.mark.parametrize("case", BAD_SHAPES_FILES)
def test_from_openai_names_a_bad_params_shapes_json(tmp_path, case):
    """A params_shapes.json that is not a list of shapes, or not GPT-1's, is a ValueError naming it."""
    write_original_release(tmp_path, ORIGINAL, [])
    path = tmp_path / "params_shapes.json"
    make_text, message = BAD_SHAPES_FILES[case]
    path.write_text(make_text(json.loads(path.read_text())))
    with pytest.raises(ValueError, match=re.escape(str(path)) + ": " + message):
        GPT.from_openai(tmp_path)


def test_from_openai_names_a_params_file_that_is_not_an_array(tmp_path):
    write_original_release(tmp_path, ORIGINAL, [])
    (tmp_path / "params_0.npy").write_bytes(b"not an array")
    with pytest.raises(
        ValueError, match=re.escape(str(tmp_path / "params_0.npy")) + ": not a NumPy array file"
    ):
        GPT.from_openai(tmp_path)


def test_from_openai_names_the_file_when_the_weights_do_not_fit_the_config(tmp_path):
    write_original_release(tmp_path, ORIGINAL, [])
    config = GPTConfig(**{**ORIGINAL.to_dict(), "n_embd": 24})
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / "params_shapes.json")) + ": .*mis-shaped"):
        GPT.from_openai(tmp_path, config=config)


@pytest.mark.parametrize("state", [[1, 2], None, "model.safetensors"], ids=["list", "None", "path"])
def test_load_state_dict_refuses_what_is_not_a_dict(state):
    with pytest.raises(TypeError, match="^load_state_dict: state must be a dict of name -> array"):
        small_model().load_state_dict(state)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_training_step_of_gpt_takes_no_copy_of_its_weights(monkeypatch, precision):
    """GPT's forward, the loss, backward, clipping and Adam read their arrays as the engine does
    (`_data`): reading `.data` while a graph holds a tensor would copy it, to notice in-place
    changes, and a step must not pay for that."""
    reads = []
    data = ag.Tensor.data
    monkeypatch.setattr(ag.Tensor, "data", property(lambda t: reads.append(t) or data.fget(t), data.fset))
    model = GPT(GPTConfig(**SMALL))
    optimizer = Adam(model.parameters(), lr=LR, l2=0.01)
    ids = np.random.default_rng(0).integers(0, SMALL["vocab_size"], (2, SMALL["n_ctx"] + 1))
    with ag.use_precision(precision):
        for _ in range(2):
            loss = F.cross_entropy(model(ids[:, :-1]), ids[:, 1:])
            loss.backward()
            ag.optim.clip_grad_norm(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
    assert reads == []


def test_from_openai_names_a_folder_that_is_not_there_or_is_a_file(tmp_path):
    (tmp_path / "a-file").write_text("")
    for path in (tmp_path / "missing", tmp_path / "a-file"):
        with pytest.raises(
            FileNotFoundError, match=rf"^GPT.from_openai: {re.escape(str(path))}: no such folder"
        ):
            GPT.from_openai(str(path))
