"""Task heads (the paper's section 3.2): a linear layer on the last block's state at _classify_.

    P(y | x^1..x^m) = softmax(h_l^m W_y)                 the task's prediction
    L3(C) = L2(C) + lambda * L1(C)                       the task loss plus the LM loss on the same inputs

Every head wraps a GPT as `transformer`, applies `dropout` (0.1, the paper's classifier dropout)
to h_l^m and then `head` (an nn.Linear), so a state dict reads `transformer.tokens_embed.weight`,
`transformer.h.0.attn.c_attn.weight`, ..., `head.weight`, `head.bias`.

A head takes the arrays of a tinygpt.transformations.Batch: ids (N, S, T) and clf_positions (N, S), with
S sequences per example (1; 2 for similarity; one per answer for multiple choice).
"""

import numpy as np

import autograd as ag
from autograd import backend, nn
from autograd import functional as F

from .transformations import IGNORE, SpecialTokens


def resize(transformer, tokenizer):
    """Add the tokenizer's extra tokens (the paper's _start_, _delimiter_, _classify_) to a GPT
    whose vocabulary is smaller, as when fine-tuning a pre-trained GPT-1. Returns how many rows
    were added (0 when the model already has them all).

    The tokenizer must be the model's: as many tokens as its embedding table has rows, or more by
    special tokens alone (the ids past the table). Any other size is a ValueError with both."""
    SpecialTokens.of(tokenizer)  # a ValueError if the tokenizer lacks any of them
    rows, size = transformer.config.vocab_size, tokenizer.vocab_size
    beyond = set(range(rows, size))
    if size < rows or not beyond <= set(tokenizer.special_tokens.values()):
        raise ValueError(
            f"the tokenizer has {size} tokens and the model's embedding table {rows} rows: only special "
            f"tokens may be added to it (at most {len(tokenizer.special_tokens)} here), so this is not "
            f"the tokenizer the model was trained with"
        )
    if beyond:
        transformer.resize_token_embeddings(size)
    return len(beyond)


def lm_loss(lm_logits, targets):
    """L1 on the task's own inputs: the next-token cross-entropy, averaged over each sequence's
    predicted tokens, then over sequences (as the original code). Targets equal to IGNORE add
    nothing."""
    targets = np.asarray(targets)
    per_token = F.cross_entropy(lm_logits, targets, ignore_index=IGNORE, reduction="none")
    counts = np.maximum((targets != IGNORE).sum(axis=-1), 1)
    return (per_token.sum(axis=-1) / counts).mean()


class TaskHead(nn.Module):
    """What the heads share: h_l^m of each sequence, the LM logits, dropout, W_y, and L3."""

    def __init__(self, transformer, n_out, clf_pdrop=0.1):
        self.transformer = transformer
        self.dropout = nn.Dropout(clf_pdrop)
        self.head = nn.Linear(transformer.config.n_embd, n_out, std=transformer.config.initializer_range)
        self.head.to(transformer.tokens_embed.weight.device)  # beside the transformer, on its GPU

    def forward(self, ids, clf_positions, lm=True):
        """-> (the task's logits, LM logits (N, S, T, vocab) or None when lm is False)."""
        ids, clf_positions = _checked_batch(ids, clf_positions)
        n, s, t = ids.shape
        with ag.random.rows_per_example(s):  # the transformer's dropout: a mask per sequence
            h = self.transformer.hidden_states(np.reshape(ids, (n * s, t)))
        columns = backend.to_device(clf_positions, h.device).reshape(-1)
        with backend.device_scope(columns):  # the model's GPU, whichever is current
            rows = h.xp.arange(n * s)
        states = h[rows, columns].reshape(n, s, h.shape[-1])  # h_l^m: the state at _classify_
        lm_logits = self.transformer.lm_logits(h).reshape(n, s, t, -1) if lm else None
        return self.logits(states), lm_logits

    def logits(self, states):
        """The task's logits from the classify-token states (N, S, n_embd)."""
        raise NotImplementedError

    def task_loss(self, logits, labels):
        """L2: cross-entropy of the logits against the class ids."""
        return F.cross_entropy(logits, np.asarray(labels))

    def predict(self, logits):
        """Predicted class ids, as a numpy array."""
        return logits.numpy().argmax(axis=-1)

    def loss(self, batch, lm_coef=0.5):
        """L3 = L2 + lm_coef * L1 on a Batch -> (L3, L2, L1); L1 is None (and its logits never
        computed) when lm_coef is 0."""
        logits, lm_logits = self(batch.ids, batch.clf_positions, lm=lm_coef != 0)
        task = self.task_loss(logits, batch.labels)
        if lm_logits is None:
            return task, task, None
        lm = lm_loss(lm_logits, batch.lm_targets)
        return task + lm_coef * lm, task, lm


def _checked_batch(ids, clf_positions):
    """ids (N, S, T) and clf_positions (N, S) as arrays, each position inside its sequence (checked
    where they are on the host: a GPU would read a wrong one from some other place, silently)."""
    ids, clf_positions = ((a if backend.on_gpu(a) else np.asarray(a)) for a in (ids, clf_positions))
    if ids.ndim != 3 or clf_positions.shape != ids.shape[:2] or clf_positions.dtype.kind not in "iu":
        raise ValueError(
            "a task head takes ids shaped (examples, sequences, time) and integer clf_positions shaped "
            f"(examples, sequences), got {ids.shape} and {clf_positions.dtype} {clf_positions.shape}"
        )
    on_host = not backend.on_gpu(clf_positions)
    if on_host and clf_positions.size and not 0 <= clf_positions.min() <= clf_positions.max() < ids.shape[2]:
        raise ValueError(f"clf_positions must lie in [0, {ids.shape[2]}), the length of a sequence")
    return ids, clf_positions


class GPTForClassification(TaskHead):
    """softmax(h_l^m W_y) over n_classes, from the one sequence of each example."""

    def __init__(self, transformer, n_classes, clf_pdrop=0.1):
        super().__init__(transformer, n_classes, clf_pdrop)

    def logits(self, states):
        return self.head(self.dropout(states[:, 0]))


GPTForEntailment = GPTForClassification  # the same head: only the input transformation differs


class GPTForSimilarity(TaskHead):
    """Both orderings of the pair go through the model; their h_l^m are added, then W_y.
    n_classes=None makes it a regression (one output, squared-error loss: STS-B's score)."""

    def __init__(self, transformer, n_classes=None, clf_pdrop=0.1):
        super().__init__(transformer, n_classes or 1, clf_pdrop)
        self.regression = n_classes is None

    def logits(self, states):
        return self.head(self.dropout(states[:, 0] + states[:, 1]))

    def task_loss(self, logits, labels):
        if not self.regression:
            return super().task_loss(logits, labels)
        error = logits.reshape(-1) - ag.tensor(labels, dtype=logits.dtype, device=logits.device)
        return (error * error).mean()

    def predict(self, logits):
        return logits.numpy()[:, 0] if self.regression else super().predict(logits)


class GPTForMultipleChoice(TaskHead):
    """One score h_l^m W_y per answer; a softmax over the answers picks one."""

    def __init__(self, transformer, clf_pdrop=0.1):
        super().__init__(transformer, 1, clf_pdrop)

    def logits(self, states):
        n, k, _ = states.shape
        return self.head(self.dropout(states)).reshape(n, k)


def make_head(kind, transformer, n_classes=None, clf_pdrop=0.1):
    """The head for a task kind of tinygpt.transformations (n_classes: None for a similarity score; unused
    for multiple choice)."""
    if kind in ("classification", "entailment"):
        if n_classes is None:
            raise ValueError(f"a {kind} head needs n_classes")
        return GPTForClassification(transformer, n_classes, clf_pdrop)
    if kind == "similarity":
        return GPTForSimilarity(transformer, n_classes, clf_pdrop)
    if kind == "multiple_choice":
        return GPTForMultipleChoice(transformer, clf_pdrop)
    raise ValueError(f"unknown task kind {kind!r}")
