"""Task heads: the state at _classify_, the four heads, L3 = L2 + lambda L1, their gradients, and a
tiny fine-tune that learns a separable task."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autograd as ag
from autograd import backend
from autograd.gradcheck import gradcheck
from autograd.optim import Adam
from tests.helpers import WORDS, WordTokenizer
from tinygpt import GPT, GPTConfig
from tinygpt.heads import (
    GPTForClassification,
    GPTForEntailment,
    GPTForMultipleChoice,
    GPTForSimilarity,
    lm_loss,
    make_head,
    resize,
)
from tinygpt.transformations import IGNORE, collate, encode_examples

VOCAB = 14  # WordTokenizer's 11 words and 3 special tokens
NO_DROPOUT = dict(embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)


def tiny_gpt(device="cpu", seed=0, **overrides):
    ag.manual_seed(seed)
    config = dict(vocab_size=VOCAB, n_ctx=12, n_embd=16, n_layer=1, n_head=2, **NO_DROPOUT)
    return GPT(GPTConfig(**{**config, **overrides})).to(device)


def in_float64(model, seed=0, scale=0.5):
    """Every parameter random (biases and gains too) and float64, for finite differences."""
    rng = np.random.default_rng(seed)
    for p in model.parameters():
        p.data = p.xp.asarray(rng.standard_normal(p.shape) * scale)
    return model


def host(x):
    return backend.to_host(x.data if isinstance(x, ag.Tensor) else x)


def batches(n_sequences, labels):
    """Batches of 1-3 examples of n_sequences token sequences (2-9 tokens) with drawn labels."""
    sequence = st.lists(st.integers(0, VOCAB - 1), min_size=2, max_size=9)
    example = st.lists(sequence, min_size=n_sequences, max_size=n_sequences)
    return st.lists(st.tuples(example, labels), min_size=1, max_size=3).map(
        lambda rows: collate([seqs for seqs, _ in rows], [label for _, label in rows])
    )


HEADS = {  # name -> (how to build it, sequences per example, labels)
    "classification": (lambda gpt: GPTForClassification(gpt, 3), 1, st.integers(0, 2)),
    "similarity": (lambda gpt: GPTForSimilarity(gpt, 2), 2, st.integers(0, 1)),
    "similarity score": (lambda gpt: GPTForSimilarity(gpt), 2, st.floats(0, 5)),
    "multiple choice": (lambda gpt: GPTForMultipleChoice(gpt), 3, st.integers(0, 2)),
}


# ----- adding the special tokens ---------------------------------------------------------------
def test_resize_adds_the_tokenizers_extra_tokens_and_keeps_the_old_rows():
    gpt = tiny_gpt(vocab_size=VOCAB - 3)
    before = gpt.tokens_embed.weight.numpy()
    assert resize(gpt, WordTokenizer()) == 3
    assert gpt.tokens_embed.weight.shape == (VOCAB, 16) and gpt.config.vocab_size == VOCAB
    np.testing.assert_array_equal(gpt.tokens_embed.weight.numpy()[: VOCAB - 3], before)
    assert gpt(np.array([[13, 12, 11]])).shape == (1, 3, VOCAB)  # the special ids now have rows
    assert resize(gpt, WordTokenizer()) == 0 and gpt.tokens_embed.weight.shape == (VOCAB, 16)


@pytest.mark.parametrize("rows", [1, VOCAB - 4, VOCAB + 1, VOCAB + 100])
def test_resize_refuses_a_tokenizer_that_is_not_the_models(rows):
    """Only special tokens may be added: a tokenizer with ordinary tokens past the model's table,
    or with fewer tokens than it has rows, is another model's; the error gives both sizes and the
    model is left as it was."""
    gpt = tiny_gpt(vocab_size=rows)
    with pytest.raises(
        ValueError, match=rf"the tokenizer has {VOCAB} tokens and the model's embedding table {rows} rows"
    ):
        resize(gpt, WordTokenizer())
    assert gpt.config.vocab_size == rows and gpt.tokens_embed.weight.shape == (rows, 16)


def test_resize_refuses_a_tokenizer_without_the_special_tokens():
    tokenizer = WordTokenizer()
    tokenizer.special_tokens = {}
    with pytest.raises(ValueError, match="_start_"):
        resize(tiny_gpt(), tokenizer)


# ----- what the heads read and return -----------------------------------------------------------
def test_parameter_names_read_transformer_then_head():
    model = GPTForClassification(tiny_gpt(), 3)
    names = [name for name, _ in model.named_parameters()]
    assert names[0] == "transformer.tokens_embed.weight" and "transformer.h.0.attn.c_attn.weight" in names
    assert names[-2:] == ["head.weight", "head.bias"]
    assert model.state_dict()["head.weight"].shape == (16, 3)
    assert model.dropout.p == 0.1  # the paper's classifier dropout


def test_make_head_picks_the_head_of_each_kind():
    gpt = tiny_gpt()
    assert type(make_head("classification", gpt, 2)) is GPTForClassification is GPTForEntailment
    assert type(make_head("entailment", gpt, 3)) is GPTForClassification
    assert make_head("similarity", gpt, None).regression and not make_head("similarity", gpt, 2).regression
    assert type(make_head("multiple_choice", gpt)) is GPTForMultipleChoice
    with pytest.raises(ValueError, match="n_classes"):
        make_head("classification", gpt)
    with pytest.raises(ValueError, match="unknown task kind"):
        make_head("ranking", gpt, 2)


@settings(max_examples=10)
@given(st.sampled_from(sorted(HEADS)), st.data())
def test_logits_are_W_y_times_the_last_state_of_each_sequence_read_alone(name, data):
    """Padding and batching change nothing: each sequence's state at its last token (the
    classify token) gives its logits, as if it had gone through the model alone."""
    build, n_sequences, labels = HEADS[name]
    model = in_float64(build(tiny_gpt()), scale=0.3).eval()
    batch = data.draw(batches(n_sequences, labels))
    logits, lm_logits = model(batch.ids, batch.clf_positions)
    W, b = model.head.weight.numpy(), model.head.bias.numpy()
    for i in range(len(batch.labels)):
        states = [
            host(model.transformer.hidden_states(ids[mask][None]))[0, -1]
            for ids, mask in zip(batch.ids[i], batch.mask[i])
        ]
        if name == "multiple choice":
            expected = [state @ W[:, 0] + b[0] for state in states]
        elif name.startswith("similarity"):
            expected = (states[0] + states[1]) @ W + b
        else:
            expected = states[0] @ W + b
        np.testing.assert_allclose(host(logits)[i], expected, rtol=1e-10, atol=1e-12)
        for j, (ids, mask) in enumerate(zip(batch.ids[i], batch.mask[i])):
            alone = host(model.transformer(ids[mask][None]))[0]
            np.testing.assert_allclose(host(lm_logits)[i, j, : mask.sum()], alone, rtol=1e-10, atol=1e-12)


@given(st.lists(st.integers(0, 10), max_size=5), st.lists(st.integers(0, 10), max_size=5), st.booleans())
def test_similarity_is_symmetric_in_its_two_texts(a, b, regression):
    text_a, text_b = (" ".join(WORDS[i] for i in ids) for ids in (a, b))
    model = in_float64(GPTForSimilarity(tiny_gpt(), None if regression else 2), seed=3).eval()
    data = encode_examples(
        [{"text_a": text_a, "text_b": text_b, "label": 0}, {"text_a": text_b, "text_b": text_a, "label": 0}],
        "similarity",
        WordTokenizer(),
        12,
    )
    batch = data.batch([0, 1])
    logits, _ = model(batch.ids, batch.clf_positions, lm=False)
    np.testing.assert_array_equal(host(logits)[0], host(logits)[1])


def test_multiple_choice_scores_follow_their_answers():
    model = in_float64(GPTForMultipleChoice(tiny_gpt()), seed=4).eval()
    answers = [[11, 1, 2, 12, 5, 13], [11, 1, 2, 12, 7, 8, 13], [11, 1, 2, 12, 9, 13]]
    order = [2, 0, 1]
    straight = collate([answers], [0])
    shuffled = collate([[answers[k] for k in order]], [0])
    scores = host(model(straight.ids, straight.clf_positions, lm=False)[0])
    np.testing.assert_allclose(
        host(model(shuffled.ids, shuffled.clf_positions, lm=False)[0]), scores[:, order]
    )
    assert model.predict(model(straight.ids, straight.clf_positions, lm=False)[0]).tolist() == [
        scores[0].argmax()
    ]


@pytest.mark.parametrize("name", list(HEADS))
@settings(max_examples=10)
@given(data=st.data())
def test_a_batch_cut_in_two_gets_the_dropout_masks_of_the_whole(name, data):
    """Dropout on everywhere: the logits of a batch equal those of its two parts, each part drawn
    with its place in the batch (as ranks and gradient-accumulation parts draw them), though the
    transformer sees several sequences per example where the head sees one state."""
    make, n_sequences, labels = HEADS[name]
    head = make(tiny_gpt(embd_pdrop=0.3, attn_pdrop=0.3, resid_pdrop=0.3)).train()
    head.dropout.p = 0.3
    rows = data.draw(
        st.lists(
            st.lists(
                st.lists(st.integers(0, VOCAB - 1), min_size=2, max_size=9),
                min_size=n_sequences,
                max_size=n_sequences,
            ),
            min_size=2,
            max_size=5,
        )
    )
    cut = data.draw(st.integers(1, len(rows) - 1))
    length = max(len(ids) for seqs in rows for ids in seqs)

    def logits(part, first_example):
        batch = collate(part, [0] * len(part), length)
        with ag.random.use_masks(ag.random.MaskStream(5, 2, first_example)):
            return host(head(batch.ids, batch.clf_positions)[0])

    whole = logits(rows, 0)
    np.testing.assert_allclose(
        np.concatenate([logits(rows[:cut], 0), logits(rows[cut:], cut)]), whole, rtol=1e-5, atol=1e-6
    )
    assert not np.allclose(whole, logits(rows, 1))  # other masks: the test can tell them apart


def test_classifier_dropout_acts_in_training_only():
    model = GPTForClassification(tiny_gpt(), 2, clf_pdrop=0.5)
    batch = collate([[[11, 1, 2, 13]]] * 4, [0] * 4)
    train_runs = [host(model(batch.ids, batch.clf_positions, lm=False)[0]) for _ in range(2)]
    assert not np.allclose(*train_runs)
    model.eval()
    eval_runs = [host(model(batch.ids, batch.clf_positions, lm=False)[0]) for _ in range(2)]
    np.testing.assert_array_equal(*eval_runs)
    np.testing.assert_allclose(eval_runs[0][0], eval_runs[0][1])  # the same input, the same logits


# ----- the losses --------------------------------------------------------------------------------
@given(st.integers(1, 3), st.integers(1, 4), st.integers(0, 2**32 - 1))
def test_lm_loss_averages_each_sequence_then_the_sequences(n_sequences, length, seed):
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((n_sequences, length, 5)) * 2
    targets = rng.integers(0, 5, (n_sequences, length))
    targets[rng.random((n_sequences, length)) < 0.3] = IGNORE
    per_sequence = []
    for row_logits, row_targets in zip(logits, targets):
        counted = [(z, t) for z, t in zip(row_logits, row_targets) if t != IGNORE]
        losses = [np.log(np.exp(z).sum()) - z[t] for z, t in counted]
        per_sequence.append(sum(losses) / len(losses) if losses else 0.0)
    got = lm_loss(ag.tensor(logits, dtype=np.float64), targets).item()
    assert got == pytest.approx(np.mean(per_sequence), rel=1e-12, abs=1e-12)


def test_regression_loss_is_the_mean_squared_error():
    model = GPTForSimilarity(tiny_gpt())
    logits = ag.tensor([[1.0], [2.5], [-1.0]], dtype=np.float64)
    assert model.task_loss(logits, np.array([0.0, 3.0, 1.0], dtype=np.float32)).item() == pytest.approx(
        (1 + 0.25 + 4) / 3
    )
    assert model.predict(logits).tolist() == [1.0, 2.5, -1.0]


def test_loss_is_the_task_loss_plus_lambda_times_the_lm_loss():
    model = in_float64(GPTForClassification(tiny_gpt(), 3), seed=1).eval()
    batch = collate([[[11, 1, 2, 13]], [[11, 4, 5, 6, 13]]], [2, 0])
    total, task, lm = model.loss(batch, lm_coef=0.5)
    logits, lm_logits = model(batch.ids, batch.clf_positions)
    log_probs = host(logits) - np.log(np.exp(host(logits)).sum(axis=1, keepdims=True))
    assert task.item() == pytest.approx(-(log_probs[0, 2] + log_probs[1, 0]) / 2, rel=1e-12)
    assert lm.item() == pytest.approx(lm_loss(lm_logits, batch.lm_targets).item(), rel=1e-12)
    assert total.item() == pytest.approx(task.item() + 0.5 * lm.item(), rel=1e-12)
    total, task, lm = model.loss(batch, lm_coef=0)
    assert lm is None and total is task


@settings(max_examples=8)
@given(st.sampled_from(sorted(HEADS)), st.sampled_from([0.0, 0.5, 1.7]), st.data())
def test_head_gradients_match_finite_differences(device, name, lm_coef, data):
    """L3 of every head, in float64, against finite differences in every parameter."""
    build, n_sequences, labels = HEADS[name]
    model = in_float64(build(tiny_gpt(device)), seed=data.draw(st.integers(0, 99))).eval()
    batch = data.draw(batches(n_sequences, labels))
    params = model.parameters()
    gradcheck(lambda *_: model.loss(batch, lm_coef)[0], params)


# ----- a tiny fine-tune -----------------------------------------------------------------------------
WORD_SETS = (("the", "cat", "sat", "on", "a"), ("mat", "dog", "ran", "far", "yes"))


def separable(kind, n, rng):
    """Classification: 2-6 words, all from one of two sets; the set is the label. Multiple choice:
    such a context and two one-word answers, one from each set; the right one shares its set."""
    examples = []
    for word_set in rng.integers(0, 2, n):
        text = " ".join(rng.choice(WORD_SETS[word_set], rng.integers(2, 7)))
        if kind == "classification":
            examples.append({"text": text, "label": int(word_set)})
        else:
            right = int(rng.integers(0, 2))
            answers = [rng.choice(WORD_SETS[word_set if k == right else 1 - word_set]) for k in range(2)]
            examples.append({"context": text, "choices": answers, "label": right})
    return examples


@pytest.mark.parametrize("kind, n_layer", [("classification", 1), ("multiple_choice", 2)])
def test_a_tiny_fine_tune_learns_a_separable_task(kind, n_layer):
    """A GPT pre-trained on nothing, a head, Adam on L3: at least 95% right on held-out examples.
    (Matching an answer to its context takes two layers.)"""
    rng = np.random.default_rng(0)
    tokenizer = WordTokenizer()
    train = encode_examples(separable(kind, 256, rng), kind, tokenizer, n_ctx=12)
    test = encode_examples(separable(kind, 200, rng), kind, tokenizer, n_ctx=12)
    model = make_head(kind, tiny_gpt(n_embd=32, n_head=4, n_layer=n_layer), n_classes=2)
    optimizer = Adam(model.parameters(), lr=3e-3)
    for _ in range(6):
        for batch in train.batches(16, rng):
            optimizer.zero_grad()
            model.loss(batch, lm_coef=0.5)[0].backward()
            optimizer.step()
    model.eval()
    batch = test.batch(np.arange(len(test)))
    predictions = model.predict(model(batch.ids, batch.clf_positions, lm=False)[0])
    assert (predictions == batch.labels).mean() >= 0.95


IDS = np.zeros((2, 1, 5), np.int64)
BAD_BATCHES = {  # case: (ids, clf_positions, what the error says)
    "2-D ids": (IDS[:, 0], np.zeros((2, 1), np.int64), r"ids shaped \(examples, sequences, time\)"),
    "positions of another shape": (IDS, np.zeros(2, np.int64), r"got \(2, 1, 5\) and int64 \(2,\)"),
    "float positions": (IDS, np.zeros((2, 1)), r"integer clf_positions .* float64 \(2, 1\)"),
    "a position past the end": (IDS, np.full((2, 1), 5), r"clf_positions must lie in \[0, 5\)"),
    "a negative position": (IDS, np.full((2, 1), -1), r"clf_positions must lie in \[0, 5\)"),
}


@pytest.mark.parametrize("case", BAD_BATCHES)
def test_heads_refuse_ids_and_positions_that_do_not_fit(device, case):
    """A classify position outside its sequence is refused, not read from somewhere else."""
    ids, positions, message = BAD_BATCHES[case]
    model = GPTForClassification(tiny_gpt(device), 3)
    with pytest.raises(ValueError, match=message):
        model(ids, positions)
