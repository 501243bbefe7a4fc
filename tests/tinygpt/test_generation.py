"""Generation: the sampling rules (temperature, top-k, top-p) and generating with a small random
model, with and without the key/value cache, within n_ctx and beyond it."""

from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import autograd as ag
from autograd import backend
from tinygpt import GPT, GPTConfig
from tinygpt.generation import generate, generate_batch, sample_next

SMALL = dict(vocab_size=40, n_ctx=8, n_embd=16, n_layer=2, n_head=2)
PROBS = np.array([0.5, 0.3, 0.15, 0.05])  # a distribution whose nuclei are easy to work out by hand

logit_arrays = hnp.arrays(np.float64, st.integers(1, 30), elements=st.floats(-8, 8))
seeds = st.integers(0, 2**32 - 1)


def random_model(device="cpu", seed=2):
    """A small GPT whose weight matrices are drawn N(0, 1), far from GPT-1's N(0, 0.02), so that its
    next-token distributions are far from uniform and change with the context (random gains and
    biases would make the last LayerNorm favour one token whatever came before)."""
    ag.manual_seed(seed)
    model = GPT(GPTConfig(**SMALL)).to(device)
    rng = np.random.default_rng(seed)
    model.load_state_dict(
        {
            name: rng.standard_normal(p.shape).astype(p.dtype)
            for name, p in model.named_parameters()
            if p.data.ndim == 2
        },
        strict=False,
    )
    return model.eval()


def softmax(logits):
    e = np.exp(logits - logits.max())
    return e / e.sum()


def draws(n, **settings):
    """How often each token of PROBS comes out in n draws with these settings."""
    rng = np.random.default_rng(0)
    counts = Counter(sample_next(np.log(PROBS), rng, **settings) for _ in range(n))
    return {token: count / n for token, count in counts.items()}


# -- sample_next ---------------------------------------------------------------------------------


@given(logit_arrays, seeds)
def test_temperature_zero_is_argmax_and_draws_nothing(logits, seed):
    rng = np.random.default_rng(seed)
    assert sample_next(logits, rng, temperature=0, top_k=3, top_p=0.5) == np.argmax(logits)
    assert rng.random() == np.random.default_rng(seed).random()


@given(logit_arrays, st.integers(1, 35), st.floats(0.05, 5), seeds)
def test_top_k_never_picks_outside_the_k_most_likely(logits, k, temperature, seed):
    rng = np.random.default_rng(seed)
    tokens = [sample_next(logits, rng, temperature=temperature, top_k=k) for _ in range(50)]
    kth_largest = np.sort(logits)[::-1][min(k, len(logits)) - 1]
    assert all(logits[token] >= kth_largest for token in tokens)


@given(logit_arrays, st.floats(0.01, 1), st.floats(0.05, 5), seeds)
def test_top_p_picks_inside_the_nucleus(logits, p, temperature, seed):
    """A token is in the smallest set reaching p only if the tokens more likely than it hold less than p."""
    rng = np.random.default_rng(seed)
    probs = softmax(logits / temperature)
    for token in [sample_next(logits, rng, temperature=temperature, top_p=p) for _ in range(50)]:
        assert probs[probs > probs[token]].sum() < p + 1e-9


@pytest.mark.parametrize(
    "p, nucleus", [(0.45, {0}), (0.79, {0, 1}), (0.81, {0, 1, 2}), (0.96, {0, 1, 2, 3}), (1.0, {0, 1, 2, 3})]
)
def test_top_p_keeps_the_smallest_set_reaching_p(p, nucleus):
    frequencies = draws(2000, top_p=p)
    assert set(frequencies) == nucleus
    kept = PROBS[sorted(nucleus)] / PROBS[sorted(nucleus)].sum()  # the nucleus, renormalised
    for token in nucleus:
        assert frequencies[token] == pytest.approx(kept[token], abs=0.04)


def test_top_k_draws_from_the_k_most_likely_renormalised():
    frequencies = draws(2000, top_k=2)
    assert set(frequencies) == {0, 1}
    assert frequencies[0] == pytest.approx(0.5 / 0.8, abs=0.04)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_draws_from_softmax_of_scaled_logits(temperature):
    frequencies = draws(4000, temperature=temperature)
    expected = softmax(np.log(PROBS) / temperature)
    for token, probability in enumerate(expected):
        assert frequencies.get(token, 0) == pytest.approx(probability, abs=0.03)


@pytest.mark.parametrize(
    "settings",
    [
        dict(temperature=-1),
        dict(temperature=float("nan")),
        dict(top_k=0),
        dict(top_k=1.5),
        dict(top_k=True),
        dict(top_p=0),
        dict(top_p=1.5),
        dict(top_p=float("nan")),
    ],
)
def test_bad_settings_are_refused_by_name(settings):
    with pytest.raises(ValueError, match=next(iter(settings))):
        sample_next(np.zeros(4), np.random.default_rng(0), **settings)


# -- generate ------------------------------------------------------------------------------------


def greedy_by_hand(model, prompt, steps):
    """Greedy decoding written out: run the model on the last n_ctx tokens, take the argmax."""
    ids = list(prompt)
    with ag.no_grad():
        for _ in range(steps):
            logits = model(np.array([ids[-model.config.n_ctx :]]))
            ids.append(int(np.argmax(backend.to_host(logits.data)[0, -1])))
    return ids[len(prompt) :]


@pytest.mark.parametrize("use_cache", [True, False])
# within n_ctx=8, and beyond it
@pytest.mark.parametrize("prompt_length, steps", [(1, 5), (3, 5), (3, 14), (11, 4)])
def test_greedy_equals_argmax_step_by_step(device, use_cache, prompt_length, steps):
    model = random_model(device)
    prompt = [(7 * i + 3) % SMALL["vocab_size"] for i in range(prompt_length)]
    new = generate(model, prompt, steps, temperature=0, use_cache=use_cache)
    assert new == greedy_by_hand(model, prompt, steps)
    assert len(set(new)) > 1  # the model does not just repeat one token, whatever the context


@pytest.mark.parametrize(
    "settings",
    [
        dict(temperature=0),
        dict(temperature=1.0),
        dict(temperature=1.5, top_k=10),
        dict(temperature=0.8, top_p=0.9),
    ],
)
@pytest.mark.parametrize("steps", [6, 20])  # within n_ctx=8 with a prompt of 2, and far beyond it
def test_cached_and_uncached_generation_give_the_same_tokens(device, settings, steps):
    model = random_model(device)
    cached = generate(model, [5, 9], steps, seed=11, **settings)
    assert cached == generate(model, [5, 9], steps, seed=11, use_cache=False, **settings)
    assert len(cached) == steps and all(0 <= t < SMALL["vocab_size"] for t in cached)


def test_same_seed_same_tokens_other_seed_other_tokens():
    model = random_model()
    first = generate(model, [1, 2, 3], 20, temperature=1.5, seed=4)
    assert generate(model, [1, 2, 3], 20, temperature=1.5, seed=4) == first
    assert generate(model, [1, 2, 3], 20, temperature=1.5, seed=5) != first


def test_generation_runs_in_eval_mode_without_a_graph_and_restores_the_mode():
    model = random_model().train()  # dropout on: generation must switch it off
    first = generate(model, [1, 2, 3], 6, temperature=0)
    assert generate(model, [1, 2, 3], 6, temperature=0) == first
    assert all(module.training for _, module in model.named_modules())
    assert all(p.grad is None for p in model.parameters())
    assert ag.is_grad_enabled()


def test_a_batch_of_prompts_continues_each_as_alone_when_greedy():
    model = random_model()
    prompts = [[1, 2, 3], [30, 20, 10], [4, 4, 4]]
    batch = generate_batch(model, prompts, 10, temperature=0)
    assert batch == [generate(model, prompt, 10, temperature=0) for prompt in prompts]


def test_zero_new_tokens_and_bad_arguments():
    model = random_model()
    assert generate(model, [1, 2], 0) == []
    with pytest.raises(ValueError, match="prompts"):
        generate(model, [], 3)
    with pytest.raises(ValueError, match="prompts"):
        generate_batch(model, [[1, 2], [3]], 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, [1], -1)
    with pytest.raises(ValueError, match="top_p"):
        generate(model, [1], 3, top_p=2.0)
