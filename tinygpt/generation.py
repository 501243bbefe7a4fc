"""Text generation: sample one token at a time from a GPT's next-token distribution.

Each step turns the logits of the last position into a token with `sample_next`: temperature
scales the logits (0 means greedy: always the most likely token), top-k keeps only the k most
likely tokens, top-p (nucleus sampling) keeps the smallest set of most likely tokens whose
probability reaches p, and one token is drawn from what is left, renormalised.

With the key/value cache the prompt is run through the model once, and after that each call feeds
only the newest token, whose attention reads the keys and values of the earlier positions from the
cache. The model has n_ctx positions; once the text outgrows them, generation continues with a
sliding window: every step recomputes the last n_ctx tokens without the cache (cached keys belong
to fixed positions, and in a sliding window every token moves one position left each step).

The model runs on its own device; one row of logits per sequence comes to the host each step, and
the sampling runs there with NumPy, so a seed gives the same tokens on the CPU and on a GPU.
"""

import numpy as np

from autograd import backend
from autograd.tensor import no_grad

from .model import KVCache


def check_sampling(temperature=1.0, top_k=None, top_p=None):
    """Raise a ValueError naming the setting that is out of range."""
    if not (temperature >= 0 and np.isfinite(temperature)):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None and (
        isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1
    ):
        raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must lie in (0, 1] or be None, got {top_p!r}")


def sample_next(logits, rng, temperature=1.0, top_k=None, top_p=None):
    """One token id drawn from a 1-D array of logits with numpy Generator `rng`.

    temperature 0 is greedy (the first of the largest logits; `rng` is not used). Otherwise the
    logits are divided by the temperature, cut to the top_k most likely, then to the nucleus of
    probability top_p, and a token is drawn in proportion to the probabilities that remain.
    """
    check_sampling(temperature, top_k, top_p)
    logits = np.asarray(logits, dtype=np.float64)
    if temperature == 0:
        return int(np.argmax(logits))
    order = np.argsort(-logits, kind="stable")  # token ids, most likely first
    if top_k is not None:
        order = order[:top_k]
    scaled = logits[order] / temperature
    probs = np.exp(scaled - scaled[0])
    probs /= probs.sum()
    if top_p is not None:
        # The nucleus ends at the first token where the running total reaches top_p (all of
        # them if rounding keeps the total just below a top_p of 1).
        size = int(np.searchsorted(np.cumsum(probs), top_p)) + 1
        order, probs = order[:size], probs[:size] / probs[:size].sum()
    return int(order[rng.choice(len(order), p=probs)])


def generate(
    model, prompt_ids, max_new_tokens, temperature=1.0, top_k=None, top_p=None, seed=None, use_cache=True
):
    """The ids of max_new_tokens tokens that continue the list `prompt_ids`.

    seed fixes the sampling (None draws fresh randomness); use_cache=False recomputes the whole
    sequence each step, which gives the same tokens, only slower.
    """
    return generate_batch(model, [prompt_ids], max_new_tokens, temperature, top_k, top_p, seed, use_cache)[0]


def generate_batch(
    model, prompts, max_new_tokens, temperature=1.0, top_k=None, top_p=None, seed=None, use_cache=True
):
    """Continue several prompts of the same length at once: a list with one list of new ids each.

    The model has no padding mask, so prompts of different lengths must go one by one (or through
    `generate`). Each step samples the rows in order from one generator, so a row's tokens depend
    on the seed and on its place in the batch.
    """
    check_sampling(temperature, top_k, top_p)
    if (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, (int, np.integer))
        or max_new_tokens < 0
    ):
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if len({len(prompt) for prompt in prompts}) != 1 or not len(prompts[0]):
        raise ValueError("prompts must be non-empty lists of token ids, all of the same length")
    ids = np.array(prompts, dtype=np.int64)
    rng = np.random.default_rng(seed)
    n_ctx = model.config.n_ctx
    cache = KVCache() if use_cache else None
    pending = ids  # the positions the cache has not seen yet
    was_training = model.training
    model.eval()
    try:
        with no_grad():
            for _ in range(max_new_tokens):
                if cache is not None and cache.length + pending.shape[1] <= n_ctx:
                    logits = model(pending, cache)
                else:
                    cache = None  # past n_ctx: a sliding window, recomputed every step
                    logits = model(ids[:, -n_ctx:])
                last = backend.to_host(logits.data[:, -1])
                pending = np.array([[sample_next(row, rng, temperature, top_k, top_p)] for row in last])
                ids = np.concatenate([ids, pending], axis=1)
    finally:
        model.train(was_training)
    return ids[:, ids.shape[1] - max_new_tokens :].tolist()
