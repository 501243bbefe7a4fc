"""The paper's input transformations: framing with the special tokens, cutting, padding, LM targets."""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers import WORDS, WordTokenizer
from tinygpt.tokenizer import BPETokenizer, GPT1Tokenizer
from tinygpt.transformations import (
    IGNORE,
    SPECIAL_TOKENS,
    SpecialTokens,
    collate,
    encode_examples,
    kind_of,
    pair,
    single,
    transform,
)

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
TOKENIZER = WordTokenizer()
S, D, C = 11, 12, 13  # _start_, _delimiter_, _classify_ of WordTokenizer
SPECIAL = SpecialTokens(S, D, C)
THE, CAT, SAT, ON, A, MAT, DOG, RAN, FAR, YES, NO = range(11)


def frame(example, kind, n_ctx=32):
    return transform(example, kind, TOKENIZER.encode, SPECIAL, n_ctx)


# ----- each transformation on hand-made examples ----------------------------------------------
def test_classification_is_start_text_classify():
    assert frame({"text": "the cat sat", "label": 1}, "classification") == ([[S, THE, CAT, SAT, C]], False)


def test_entailment_is_start_premise_delimiter_hypothesis_classify():
    example = {"premise": "a dog ran", "hypothesis": "the dog sat", "label": 0}
    assert frame(example, "entailment") == ([[S, A, DOG, RAN, D, THE, DOG, SAT, C]], False)


def test_similarity_gives_both_orderings():
    example = {"text_a": "a cat", "text_b": "the dog ran", "score": 2.5}
    sequences, cut = frame(example, "similarity")
    assert sequences == [[S, A, CAT, D, THE, DOG, RAN, C], [S, THE, DOG, RAN, D, A, CAT, C]]
    assert not cut


def test_multiple_choice_gives_one_sequence_per_answer():
    example = {"context": "the cat sat", "choices": ["yes", "no", "on a mat"], "label": 2}
    sequences, _ = frame(example, "multiple_choice")
    assert sequences == [
        [S, THE, CAT, SAT, D, YES, C],
        [S, THE, CAT, SAT, D, NO, C],
        [S, THE, CAT, SAT, D, ON, A, MAT, C],
    ]


def test_kind_is_recognised_from_the_fields():
    assert kind_of({"text": "", "label": 0}) == "classification"
    assert kind_of({"premise": "", "hypothesis": "", "label": 0}) == "entailment"
    assert kind_of({"text_a": "", "text_b": "", "score": 1.0}) == "similarity"
    assert kind_of({"context": "", "choices": [], "label": 0}) == "multiple_choice"
    assert kind_of({"sentence": "", "label": 0}) is None


def test_unknown_kind_and_tiny_n_ctx_are_refused():
    with pytest.raises(ValueError, match="unknown task kind"):
        frame({"text": "the"}, "ranking")
    with pytest.raises(ValueError, match="n_ctx=3"):
        encode_examples([{"text": "the", "label": 0}], "classification", TOKENIZER, n_ctx=3)


def test_a_tokenizer_without_the_special_tokens_is_refused():
    tokenizer = WordTokenizer()
    tokenizer.special_tokens = {"_start_": 11}
    with pytest.raises(ValueError, match="_delimiter_"):
        SpecialTokens.of(tokenizer)


# ----- cutting long inputs as the original did -------------------------------------------------
token_lists = st.lists(st.integers(0, 10), max_size=40)


@given(token_lists, st.integers(4, 24))
def test_a_single_text_is_cut_to_n_ctx_minus_2(text, n_ctx):
    ids, cut = single(text, SPECIAL, n_ctx)
    kept = min(len(text), n_ctx - 2)
    assert ids == [S, *text[:kept], C]
    assert len(ids) <= n_ctx
    assert cut == (len(text) > n_ctx - 2)


@given(token_lists, token_lists, st.integers(4, 24))
def test_each_segment_of_a_pair_is_cut_to_half_n_ctx_minus_2(first, second, n_ctx):
    ids, cut = pair(first, second, SPECIAL, n_ctx)
    limit = n_ctx // 2 - 2
    assert ids == [S, *first[:limit], D, *second[:limit], C]
    assert len(ids) <= n_ctx
    assert cut == (len(first) > limit or len(second) > limit)


def test_cut_examples_are_counted():
    examples = [
        {"text": "the cat sat on a mat", "label": 0},  # 6 words: cut when n_ctx - 2 < 6
        {"text": "the cat", "label": 1},
        {"text": "a dog ran far", "label": 1},
    ]
    assert encode_examples(examples, "classification", TOKENIZER, n_ctx=6).n_cut == 1
    assert encode_examples(examples, "classification", TOKENIZER, n_ctx=5).n_cut == 2
    assert encode_examples(examples, "classification", TOKENIZER, n_ctx=8).n_cut == 0
    pairs = [{"context": "the cat sat on a mat", "choices": ["yes", "no"], "label": 0}]
    assert encode_examples(pairs, "multiple_choice", TOKENIZER, n_ctx=12).n_cut == 1  # limit 4 < 6


# ----- padding, classify positions and LM targets ----------------------------------------------
def examples_of_sequences():
    """N examples of S sequences each, every sequence 1 to 9 token ids long."""
    shape = st.tuples(st.integers(1, 4), st.integers(1, 3))
    sequence = st.lists(st.integers(1, 13), min_size=1, max_size=9)
    return shape.flatmap(
        lambda ns: st.lists(
            st.lists(sequence, min_size=ns[1], max_size=ns[1]), min_size=ns[0], max_size=ns[0]
        )
    )


@given(examples_of_sequences())
def test_collate_pads_and_marks_each_sequence(sequences):
    labels = np.arange(len(sequences))
    batch = collate(sequences, labels)
    n, s = len(sequences), len(sequences[0])
    longest = max(len(seq) for seqs in sequences for seq in seqs)
    assert batch.ids.shape == batch.mask.shape == batch.lm_targets.shape == (n, s, longest)
    assert batch.clf_positions.shape == (n, s)
    np.testing.assert_array_equal(batch.labels, labels)
    for i, seqs in enumerate(sequences):
        for j, seq in enumerate(seqs):
            length = len(seq)
            assert batch.ids[i, j, :length].tolist() == seq
            assert not batch.ids[i, j, length:].any()
            assert batch.mask[i, j].tolist() == [True] * length + [False] * (longest - length)
            assert batch.clf_positions[i, j] == length - 1
            # position t predicts token t + 1; nothing is predicted from the last token or padding
            assert batch.lm_targets[i, j].tolist() == seq[1:] + [IGNORE] * (longest - length + 1)


def test_examples_with_different_numbers_of_answers_do_not_share_a_batch():
    with pytest.raises(ValueError, match=r"\[2, 3\]"):
        collate([[[1, 2], [1, 3]], [[1, 2], [1, 3], [1, 4]]], [0, 1])


def test_encode_examples_gives_class_ids_or_scores():
    classes = encode_examples(
        [{"text": "the", "label": 1}, {"text": "cat", "label": 0}], "classification", TOKENIZER, n_ctx=8
    )
    assert classes.labels.dtype == np.int64 and classes.labels.tolist() == [1, 0]
    scores = encode_examples([{"text_a": "the", "text_b": "cat", "score": 3.2}], "similarity", TOKENIZER, 8)
    assert scores.labels.dtype == np.float32 and scores.labels.tolist() == [pytest.approx(3.2)]
    batch = scores.batch([0])
    assert batch.ids.shape == (1, 2, 5)
    assert batch.ids[0, :, 1].tolist() == [THE, CAT]


def test_examples_without_labels_are_encoded_to_be_predicted():
    data = encode_examples([{"text": "the"}, {"text": "cat"}], "classification", TOKENIZER, n_ctx=8)
    assert data.labels is None and next(data.batches(2)).labels is None
    assert [seqs[0][1] for seqs in data.sequences] == [THE, CAT]


@given(st.integers(1, 30), st.integers(1, 8), st.integers(0, 2**32 - 1))
def test_batches_visit_every_example_once(n, batch_size, seed):
    examples = [{"text": " ".join(WORDS[: 1 + i % 5]), "label": i} for i in range(n)]
    data = encode_examples(examples, "classification", TOKENIZER, n_ctx=8)
    batches = list(data.batches(batch_size, np.random.default_rng(seed)))
    assert [len(b.labels) for b in batches[:-1]] == [batch_size] * (len(batches) - 1)
    assert sorted(np.concatenate([b.labels for b in batches]).tolist()) == list(range(n))
    for b in batches:  # each example's sequence is still its own: its length gives its label
        assert ((b.clf_positions[:, 0] - 2) == b.labels % 5).all()
    in_order = np.concatenate([b.labels for b in data.batches(batch_size)])
    assert in_order.tolist() == list(range(n))


# ----- with the project's tokenizers -----------------------------------------------------------
def test_a_trained_bpe_tokenizer_frames_with_its_own_special_ids():
    tokenizer = BPETokenizer.train(["the cat sat on the mat. the dog ran."], vocab_size=270)
    start, delimiter, classify = (tokenizer.special_tokens[name] for name in SPECIAL_TOKENS)
    example = {"premise": "the cat sat", "hypothesis": "the dog ran", "label": 0}
    [ids], _ = transform(example, "entailment", tokenizer.encode, SpecialTokens.of(tokenizer), 64)
    premise, hypothesis = tokenizer.encode("the cat sat"), tokenizer.encode("the dog ran")
    assert ids == [start, *premise, delimiter, *hypothesis, classify]


def test_the_special_tokens_names_in_a_text_are_the_tokens_unless_read_as_text():
    """ "_classify_" in a sentence is the classify token by default, so the head would read a state
    in mid-sentence; special_tokens_as_text=True reads it as the text it is."""
    tokenizer = BPETokenizer.train(["the cat sat on the mat. the dog ran."], vocab_size=270)
    start, _, classify = (tokenizer.special_tokens[name] for name in SPECIAL_TOKENS)
    example = [{"text": "the cat _classify_ sat", "label": 0}]
    [[as_tokens]] = encode_examples(example, "classification", tokenizer, 64).sequences
    [[as_text]] = encode_examples(
        example, "classification", tokenizer, 64, special_tokens_as_text=True
    ).sequences
    assert as_tokens.count(classify) == 2 and as_text.count(classify) == 1
    assert as_text == [start, *tokenizer.encode("the cat _classify_ sat", special_tokens=False), classify]
    assert tokenizer.decode(as_text[1:-1]) == "the cat _classify_ sat"


@pytest.mark.skipif(not (SHARED / "data" / "gpt1-bpe").is_dir(), reason="../shared/data is absent")
def test_gpt1_tokenizer_frames_with_ids_40478_to_40480():
    files = SHARED / "data" / "gpt1-bpe"
    tokenizer = GPT1Tokenizer.from_files(files / "encoder_bpe_40000.json", files / "vocab_40000.bpe")
    data = encode_examples(
        [{"text": "A charming and often affecting journey.", "label": 1}],
        "classification",
        tokenizer,
        n_ctx=512,
    )
    ids = data.sequences[0][0]
    assert ids[0] == 40478 and ids[-1] == 40480
    assert ids[1:-1] == tokenizer.encode("A charming and often affecting journey.")
