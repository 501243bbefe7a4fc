"""The paper's input transformations (Figure 1): every task becomes token sequences that a GPT
reads left to right, framed by three tokens added to the vocabulary, _start_, _delimiter_ and
_classify_. The head reads the last block's state at _classify_.

    classification   [start] text [classify]                              (SST-2, CoLA)
    entailment       [start] premise [delim] hypothesis [classify]        (RTE, SNLI, MNLI, QNLI)
    similarity       [start] a [delim] b [classify], and the same with b first   (STS-B, MRPC)
    multiple choice  [start] context [delim] answer_i [classify], one per answer  (Story Cloze)

An example is a dict: {"text", "label"}, {"premise", "hypothesis", "label"},
{"text_a", "text_b", "label" or "score"}, {"context", "choices", "label"}, where "label" is a
class id (for multiple choice, the index of the right answer) and "score" a number.

Long inputs are cut as the original code did: a single text to n_ctx - 2 tokens, each segment
of a pair to n_ctx // 2 - 2, so that every sequence fits in n_ctx positions.

A byte-level BPE tokenizer reads the names `_start_`, `_delimiter_` and `_classify_` in a text as
the special tokens themselves, so a sentence that holds one is framed by a token more;
special_tokens_as_text=True reads them as plain text (GPT-1's own tokenizer always does).
"""

import functools
from dataclasses import dataclass

import numpy as np

from autograd.functional import IGNORE_INDEX

from .tokenizer import SPECIAL_TOKENS, BPETokenizer

KINDS = {  # kind -> the fields its examples hold besides the label
    "classification": ("text",),
    "entailment": ("premise", "hypothesis"),
    "similarity": ("text_a", "text_b"),
    "multiple_choice": ("context", "choices"),
}
IGNORE = IGNORE_INDEX  # an LM target that adds nothing to the loss (F.cross_entropy's ignore_index)


def kind_of(example):
    """The kind of task whose fields `example` has, or None."""
    for kind, fields in KINDS.items():
        if all(field in example for field in fields):
            return kind
    return None


@dataclass(frozen=True)
class SpecialTokens:
    """The ids of _start_, _delimiter_ and _classify_."""

    start: int
    delimiter: int
    classify: int

    @classmethod
    def of(cls, tokenizer):
        ids = tokenizer.special_tokens
        missing = [name for name in SPECIAL_TOKENS if name not in ids]
        if missing:
            raise ValueError(
                f"the tokenizer has no special tokens {missing}; fine-tuning needs {list(SPECIAL_TOKENS)}"
            )
        return cls(*(ids[name] for name in SPECIAL_TOKENS))


# ----- one example -> its token-id sequences ---------------------------------------------------
def single(text, special, n_ctx):
    """[start] text [classify], the text cut to n_ctx - 2 tokens -> (ids, whether it was cut)."""
    kept = text[: n_ctx - 2]
    return [special.start, *kept, special.classify], len(kept) < len(text)


def pair(first, second, special, n_ctx):
    """[start] first [delim] second [classify], each cut to n_ctx // 2 - 2 tokens
    -> (ids, whether either was cut)."""
    limit = n_ctx // 2 - 2
    a, b = first[:limit], second[:limit]
    return [special.start, *a, special.delimiter, *b, special.classify], len(a) + len(b) < len(first) + len(
        second
    )


def transform(example, kind, encode, special, n_ctx):
    """An example -> (its sequences, whether any segment was cut). There is one sequence for
    classification and entailment, two for similarity (both orderings), one per answer for
    multiple choice. `encode` turns text into token ids."""
    if kind == "classification":
        framed = [single(encode(example["text"]), special, n_ctx)]
    elif kind == "entailment":
        framed = [pair(encode(example["premise"]), encode(example["hypothesis"]), special, n_ctx)]
    elif kind == "similarity":
        a, b = encode(example["text_a"]), encode(example["text_b"])
        framed = [pair(a, b, special, n_ctx), pair(b, a, special, n_ctx)]
    elif kind == "multiple_choice":
        context = encode(example["context"])
        framed = [pair(context, encode(choice), special, n_ctx) for choice in example["choices"]]
    else:
        raise ValueError(f"unknown task kind {kind!r}; choose one of {', '.join(KINDS)}")
    return [ids for ids, _ in framed], any(cut for _, cut in framed)


# ----- many examples -> padded arrays ----------------------------------------------------------
@dataclass
class Batch:
    """N examples of S sequences each (S = 1, 2 or the number of answers), padded to length T.

    ids (N, S, T) int64, 0 after each sequence's end; mask (N, S, T) bool, True on real tokens;
    clf_positions (N, S), where each sequence's _classify_ token is; labels (N,), class ids
    (int64) or scores (float32), or None for examples to predict.
    """

    ids: np.ndarray
    mask: np.ndarray
    clf_positions: np.ndarray
    labels: np.ndarray

    @property
    def lm_targets(self):
        """The auxiliary LM loss's targets (N, S, T): at each position the next token, where there
        is one, else IGNORE. So padding adds nothing, and _start_ is never a target."""
        targets = np.full_like(self.ids, IGNORE)
        targets[..., :-1] = np.where(self.mask[..., 1:], self.ids[..., 1:], IGNORE)
        return targets


def longest(sequences):
    """The length of the longest token-id list of the examples' sequences (at least 1)."""
    return max((len(ids) for seqs in sequences for ids in seqs), default=1)


def collate(sequences, labels, length=None):
    """Pad the examples' sequences (a list of N lists of S token-id lists) into a Batch, to
    `length` tokens (by default their longest)."""
    counts = sorted({len(seqs) for seqs in sequences})
    if len(counts) > 1:
        raise ValueError(
            f"examples in one batch must have the same number of sequences (answers), got {counts}"
        )
    n, s = len(sequences), counts[0] if counts else 1
    length = length or longest(sequences)
    ids = np.zeros((n, s, length), dtype=np.int64)
    mask = np.zeros((n, s, length), dtype=bool)
    for i, seqs in enumerate(sequences):
        for j, seq in enumerate(seqs):
            ids[i, j, : len(seq)] = seq
            mask[i, j, : len(seq)] = True
    return Batch(ids, mask, mask.sum(axis=-1) - 1, None if labels is None else np.asarray(labels))


@dataclass
class TaskData:
    """A task's examples as token ids, to be cut into batches. n_cut: how many examples had a
    segment cut to fit n_ctx."""

    kind: str
    sequences: list  # per example, its list of token-id sequences
    labels: np.ndarray  # class ids (int64) or scores (float32); None for examples without labels
    n_cut: int

    def __len__(self):
        return len(self.sequences)

    @functools.cached_property
    def length(self):
        """The longest sequence of all the examples: every batch is padded to it, as GPT-1's code
        did, so a batch's shape (and where dropout's masks fall in it) does not depend on which
        examples it holds or how a step's batch is shared out among ranks."""
        return longest(self.sequences)

    def batch(self, indices):
        labels = None if self.labels is None else self.labels[np.asarray(indices, dtype=np.int64)]
        return collate([self.sequences[i] for i in indices], labels, self.length)

    def batches(self, batch_size, rng=None):
        """Batches of up to batch_size examples, in order, or shuffled by a numpy Generator."""
        order = rng.permutation(len(self)) if rng is not None else np.arange(len(self))
        for start in range(0, len(self), batch_size):
            yield self.batch(order[start : start + batch_size])


def text_encoder(tokenizer, special_tokens_as_text=False):
    """The tokenizer's encode; with special_tokens_as_text, one that reads the special tokens'
    names in a text as plain text (see the top of this file)."""
    if special_tokens_as_text and isinstance(tokenizer, BPETokenizer):
        return functools.partial(tokenizer.encode, special_tokens=False)
    return tokenizer.encode


def encode_examples(examples, kind, tokenizer, n_ctx, special_tokens_as_text=False):
    """Examples (dicts, see the top of this file) -> TaskData, through the tokenizer's encode and
    its special tokens. Examples with a "score" give float32 labels, with a "label" class ids, and
    with neither (examples to predict) labels None."""
    if n_ctx < 4:
        raise ValueError(f"n_ctx={n_ctx} leaves no room for text: a pair needs 3 special tokens")
    special, encode = SpecialTokens.of(tokenizer), text_encoder(tokenizer, special_tokens_as_text)
    sequences, n_cut = [], 0
    for example in examples:
        seqs, cut = transform(example, kind, encode, special, n_ctx)
        sequences.append(seqs)
        n_cut += cut
    target = "score" if examples and "score" in examples[0] else "label"
    labelled = not examples or target in examples[0]
    dtype = np.float32 if target == "score" else np.int64
    labels = np.array([example[target] for example in examples], dtype=dtype) if labelled else None
    return TaskData(kind, sequences, labels, n_cut)
