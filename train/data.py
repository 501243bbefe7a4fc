"""Pretraining data: token ids (a prepared dataset's, see train.prepare) -> batches of contiguous
windows; the default corpus; the unigram baseline. As in the paper, the model trains on
contiguous windows of n_ctx + 1 tokens (inputs and next-token targets). The order of the windows
is a function of (seed, epoch) alone, so the batch of any step can be rebuilt, which is what makes
resuming exact.
"""

import hashlib
import os
import shutil
import tempfile

import numpy as np

from autograd.functional import IGNORE_INDEX
from tinygpt.files import UndecodableFiles, read_text

from .sources import find_sources


def default_corpus():
    """Text that ships with Python itself, for a run that needs no download: pydoc's help topics."""
    from pydoc_data.topics import topics

    return [topics[name] for name in sorted(topics)]


def default_corpus_folder():
    """A folder of the default corpus, a file a topic (a document each), written once into the
    cache; a temporary folder where the cache cannot be written."""
    texts = default_corpus()
    digest = hashlib.sha256("\0".join(texts).encode()).hexdigest()[:16]
    folder = os.path.join(cache_dir(), "pydoc-topics", digest)
    partial = f"{folder}.partial-{os.getpid()}"
    try:
        if not os.path.isdir(folder):
            write_texts(partial, texts)
            os.replace(partial, folder)
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
        if not os.path.isdir(folder):  # not another process's, written meanwhile: the cache is not writable
            folder = tempfile.mkdtemp(prefix="tinygpt-topics-")
            write_texts(folder, texts)
    return folder


def write_texts(folder, texts):
    os.makedirs(folder, exist_ok=True)
    for number, text in enumerate(texts):
        with open(os.path.join(folder, f"{number:03}.txt"), "w", encoding="utf-8") as file:
            file.write(text)


def read_texts(paths, encoding="utf-8", errors="strict"):
    """The texts of text files, folders (every *.txt below, as train.prepare finds them: hidden files,
    datasets, runs and tokenizers left out) and globs, line ends made "\\n"; every file is read
    before those that do not decode are all named in one UndecodableFiles."""
    texts, problems = [], []
    for source in find_sources(paths, (".txt",))[0]:
        if source.format != "text" or source.compression:
            raise ValueError(
                f"{source.path}: not a plain text file (evaluate reads text; prepare reads the others)"
            )
        try:
            texts.append(read_text(source.path, encoding, errors).replace("\r\n", "\n").replace("\r", "\n"))
        except ValueError as error:
            problems.append(str(error))
    if problems:
        raise UndecodableFiles(problems)
    return texts


def vocabulary_built(asked, tokenizer):
    """The size of a BPE trained to `asked` tokens: where it came out smaller (every word of the
    corpus one token before then), one line says so."""
    if tokenizer.vocab_size < asked:
        print(
            f"asked for {asked:,} tokens, built {tokenizer.vocab_size:,}: every word of the corpus is one "
            "token by then, no pair is left to merge"
        )
    return tokenizer.vocab_size


def tokenizer_fingerprint(tokenizer):
    """A hash of what decides how text is cut: the normalizer, every token and its id."""
    digest = hashlib.sha256(f"normalizer\t{getattr(tokenizer, 'normalizer', None)}\n".encode())
    for token_id in range(tokenizer.vocab_size):
        digest.update(f"{token_id}\t{tokenizer.id_to_token(token_id)!r}\n".encode())
    return digest.hexdigest()


def cache_dir():
    """$TINYGPT_CACHE, where it is set and not empty; else ~/.cache/tinygpt."""
    return os.environ.get("TINYGPT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tinygpt")


class Windows:
    """Contiguous windows of n_ctx + 1 tokens over an array of ids, served in batches.

    Window i starts at token i * n_ctx, so consecutive windows overlap by one token and every
    token but the first is a target exactly once per epoch.
    """

    def __init__(self, ids, n_ctx, name="data"):
        self.ids, self.n_ctx = ids, n_ctx
        self.count = (len(ids) - 1) // n_ctx
        self._order = None  # ((seed, epoch), the permutation): drawn once an epoch, not every step
        if self.count < 1:
            fewer = f"{len(ids)} tokens are fewer than one window of n_ctx + 1 = {n_ctx + 1}"
            raise ValueError(f"{name}: {fewer}")

    def window(self, index):
        start = index * self.n_ctx
        return self.ids[start : start + self.n_ctx + 1]

    def batch(self, indices):
        return np.stack([np.asarray(self.window(i)) for i in indices]).astype(np.int64)

    def order(self, seed, epoch):
        """The window order of one epoch: a permutation fixed by (seed, epoch)."""
        if self._order is None or self._order[0] != (seed, epoch):
            self._order = (seed, epoch), np.random.default_rng([seed, epoch]).permutation(self.count)
        return self._order[1]

    def training_batch(self, step, batch_size, seed, rank=0, ranks=1):
        """The batch of a training step: epoch after epoch, each in its own shuffled order; of it,
        the `rank`-th of `ranks` equal contiguous shares (the whole batch by default).

        Each epoch yields count // batch_size full batches (the rest of its windows are skipped).
        """
        per_epoch = self.count // batch_size
        if per_epoch < 1:
            raise ValueError(f"batch of {batch_size} windows, but the training data holds only {self.count}")
        epoch, index = divmod(step, per_epoch)
        share = batch_size // ranks
        start = index * batch_size + rank * share
        return self.batch(self.order(seed, epoch)[start : start + share])

    def in_order(self, batch_size, limit=None):
        """Batches of windows in order (for evaluation), at most `limit` windows in all."""
        count = self.count if limit is None else min(limit, self.count)
        for start in range(0, count, batch_size):
            yield self.batch(range(start, min(start + batch_size, count)))


def split(ids, val_fraction, n_ctx):
    """(train ids, validation ids): the last val_fraction of the tokens is held out, at least
    one window of them."""
    held_out = max(int(len(ids) * val_fraction), n_ctx + 1)
    if held_out >= len(ids) - n_ctx:
        raise ValueError(
            f"the corpus has {len(ids)} tokens: too few for a training and a validation "
            f"window of n_ctx + 1 = {n_ctx + 1} tokens each"
        )
    return ids[:-held_out], ids[-held_out:]


def unigram_perplexity(train_ids, val_ids, vocab_size):
    """Perplexity of the validation tokens under the training tokens' unigram frequencies (add-one
    smoothed): the baseline a language model must beat. The ids may be arrays or a prepared
    dataset's Tokens, read block by block."""
    counts = np.ones(vocab_size)
    for block in blocks(train_ids):
        counts += np.bincount(np.asarray(block), minlength=vocab_size)
    log_probs = np.log(counts / counts.sum())
    total = sum(float(log_probs[np.asarray(block)].sum()) for block in blocks(val_ids))
    return float(np.exp(-total / len(val_ids)))


def blocks(ids):
    return ids.blocks() if hasattr(ids, "blocks") else [ids]


def next_token_batch(rows):
    """(inputs, targets) of rows of (token ids, n), padded at the end to one width: a row's inputs
    are its ids but the last and its targets the ids after them, of which only the last n count;
    the others, and the padding, are IGNORE_INDEX, which cross_entropy leaves out. A row with n = 0
    is all padding. Zero-shot scores a continuation, its last n tokens; perplexity scores every
    token of a window but the first, n = len(ids) - 1."""
    width = max(max(len(ids) for ids, _ in rows) - 1, 1)
    inputs = np.zeros((len(rows), width), dtype=np.int64)
    targets = np.full((len(rows), width), IGNORE_INDEX, dtype=np.int64)
    for row, (ids, n) in enumerate(rows):
        if n > 0:
            inputs[row, : len(ids) - 1] = ids[:-1]
            targets[row, len(ids) - 1 - n : len(ids) - 1] = ids[-n:]
    return inputs, targets
