"""Pretraining data: text -> one cached array of token ids -> batches of contiguous windows.

The corpus is tokenized once and kept as a binary file of ids (memory-mapped when read back),
named by a hash of the text and of the tokenizer, so the next run with the same pair skips the
work. The file opens with a header (a magic string, the number of ids, a SHA-256 of their bytes),
so that one cut short by a crash or a full disk, or damaged since, is noticed, named in a warning,
and written again. As in the paper, the model trains on contiguous windows of n_ctx + 1 tokens (inputs and
next-token targets). The order of the windows is a function of (seed, epoch) alone, so the
batch of any step can be rebuilt, which is what makes resuming exact.
"""

import contextlib
import glob
import hashlib
import os
import struct
import time
import warnings

import numpy as np

from autograd.functional import IGNORE_INDEX
from tinygpt.files import read_text_files

CACHE_MAGIC = b"tinygpt-tokens-1"
CACHE_HEADER = struct.Struct("<16sQ32s")  # the magic string, the number of ids, the SHA-256 of their bytes


def default_corpus():
    """Text that ships with Python itself (the pydoc topics), for a run that needs no download."""
    from pydoc_data.topics import topics

    return ["\n\n".join(topics[name] for name in sorted(topics))]


def read_corpus(paths, encoding="utf-8", errors="strict"):
    """The texts of files, folders (every *.txt below) and globs, as tinygpt.files.read_text_files
    reads them: line ends made "\\n", the files that do not decode all named in one error."""
    texts = read_texts(paths, encoding, errors)
    if not texts:
        raise ValueError(f"no text files found in {', '.join(map(str, paths))}")
    if not any(text.strip() for text in texts):
        raise ValueError(f"the corpus in {', '.join(map(str, paths))} is empty")
    return texts


def read_texts(paths, encoding="utf-8", errors="strict"):
    """tinygpt.files.read_text_files(paths), where a folder named like a text file (x.txt, which a
    folder's *.txt takes in) is a ValueError naming it."""
    try:
        return read_text_files(paths, encoding, errors)
    except IsADirectoryError as error:
        raise ValueError(
            f"{error.filename}: a folder, not a text file (rename it: every *.txt is read)"
        ) from None


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
    return os.environ.get("TINYGPT_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "tinygpt"))


def tokenize_corpus(texts, tokenizer, cache=None):
    """All texts encoded and joined into one 1-D array of ids (uint16 or uint32), cached on disk.

    Returns (ids, path of the cache file, whether it was reused).
    """
    digest = hashlib.sha256(tokenizer_fingerprint(tokenizer).encode())
    for text in texts:
        digest.update(hashlib.sha256(text.encode("utf-8")).digest())
    dtype = np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32
    folder = cache or os.path.join(cache_dir(), "tokens")
    path = os.path.join(folder, f"{digest.hexdigest()[:32]}.{np.dtype(dtype).name}")
    if os.path.isfile(path):
        ids, problem = read_token_cache(path, dtype)
        if problem is None:
            return ids, path, True
        warnings.warn(
            f"{path}: not a whole token cache ({problem}); tokenizing the corpus again", stacklevel=2
        )
    ids = np.fromiter((i for text in texts for i in tokenizer.encode(text)), dtype=dtype)
    write_token_cache(path, ids)
    return ids, path, False


def write_token_cache(path, ids):
    """Write the cache file whole (through a .partial-<pid> file) or not at all: a folder that cannot
    take it (a full disk, a file in its way, no permission) is a warning, and the run goes on without."""
    temporary = f"{path}.partial-{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        remove_orphans(os.path.dirname(path))
        with open(temporary, "wb") as f:
            f.write(CACHE_HEADER.pack(CACHE_MAGIC, len(ids), hashlib.sha256(ids).digest()))
            f.write(memoryview(ids))
        os.replace(temporary, path)
    except OSError as error:
        reason = error.strerror or error
        warnings.warn(f"{path}: cannot write the token cache ({reason}); going on without it", stacklevel=3)
        with contextlib.suppress(OSError):
            os.remove(temporary)


def read_token_cache(path, dtype):
    """(the ids of a cache file, memory-mapped, None), or (None, what is wrong with the file)."""
    with open(path, "rb") as f:
        header = f.read(CACHE_HEADER.size)
    if len(header) < CACHE_HEADER.size or not header.startswith(CACHE_MAGIC):
        return None, "no header: damaged, or written by an older tinygpt"
    _, count, checksum = CACHE_HEADER.unpack(header)
    size, expected = os.path.getsize(path), CACHE_HEADER.size + count * np.dtype(dtype).itemsize
    if size != expected:
        return None, f"{size:,} bytes where its header promises {expected:,}"
    ids = np.memmap(path, dtype=dtype, mode="r", offset=CACHE_HEADER.size, shape=(count,))
    if hashlib.sha256(ids).digest() != checksum:
        return None, "its ids do not match their checksum"
    return ids, None


def remove_orphans(folder, minutes=10):
    """Remove the .partial-<pid> files whose writer is gone (no such process, or the file untouched
    for `minutes`): a process killed while writing leaves one, and nothing else would remove it."""
    for partial in glob.glob(os.path.join(glob.escape(folder), "*.partial-*")):
        try:
            if time.time() - os.path.getmtime(partial) < minutes * 60:
                os.kill(int(partial.rpartition("-")[2]), 0)  # signal 0: only asks whether the process exists
                continue
        except ProcessLookupError:
            pass  # its writer is gone
        except (OSError, ValueError, OverflowError):
            continue  # another user's live process, a file removed meanwhile, or a name not ours
        with contextlib.suppress(OSError):
            os.remove(partial)


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
            raise ValueError(
                f"{name}: {len(ids)} tokens are fewer than one window of n_ctx + 1 = {n_ctx + 1}"
            )

    def window(self, index):
        start = index * self.n_ctx
        return self.ids[start : start + self.n_ctx + 1]

    def batch(self, indices):
        return np.stack([self.window(i) for i in indices]).astype(np.int64)

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
