"""What the workers of train.prepare do: count the words of one chunk of a file, learn a BPE
from all the chunks' counts, or encode one chunk into a shard of token ids.

A shard is two files named by the key of its chunk (the file's content, the byte range, the
tokenizer and the settings): `<key>.bin`, the ids as raw uint16 or uint32, and `<key>.json`, their
count and SHA-256 and, for each document part the chunk holds, its token range, the SHA-256 of
its document's text up to its end, and whether it begins the document. Each is written
whole through a temporary file, the .json last: a shard whose .json is there is finished.
"""

import functools
import hashlib
import json
import os
import threading
from collections import Counter

import numpy as np
from tqdm import tqdm

from tinygpt.files import write_whole
from tinygpt.tokenizer import SPECIAL_TOKENS, BPETokenizer, load_tokenizer
from tinygpt.tokenizer.bpe import GPT2_PATTERN, count_words, make_normalizer

from . import corpus
from .corpus import document_parts
from .progress import Progress

SEPARATOR = "_start_"  # begins every document: the token that begins every fine-tuning input too


def chunk_key(settings, source_digest, chunk):
    """The name of a chunk's shard: a hash of everything its ids depend on."""
    return hashlib.sha256(json.dumps([settings, source_digest, list(chunk)]).encode()).hexdigest()[:32]


@functools.lru_cache(maxsize=1)
def tokenizer_in(folder):
    """The tokenizer of `folder`, loaded once per worker process (in its first task: an error there
    reaches the command, where a pool's initializer would fail again and again unseen)."""
    return load_tokenizer(folder)


def count_chunk_words(task):
    """{word: count} of one chunk (path, start, end, encoding, errors, normalizer), as BPE training
    counts them (tinygpt.tokenizer.bpe.count_words), written to `out` as JSON; returns the bytes read."""
    (path, start, end), (encoding, errors, normalizer), out = task
    pieces = corpus.read_pieces(path, start, end, encoding, errors)
    counts = count_words(pieces, GPT2_PATTERN, SPECIAL_TOKENS, make_normalizer(normalizer))
    write_whole(out, json.dumps(counts, ensure_ascii=False).encode())
    return end - start


def summed_counts(paths):
    """The sum of the {word: count} files count_chunk_words wrote, each removed once read."""
    counts = Counter()
    for path in paths:
        with open(path, encoding="utf-8") as file:
            counts.update(json.load(file))
        os.remove(path)
    return counts


def learn_bpe(task):
    """Sum the chunks' word counts, train the BPE on them and save it. It runs in a worker, where
    there are workers: the memory the merges take (it grows with the distinct words) is the
    system's again when the worker ends, not kept by the main process for the encoding."""
    counts_paths, vocab_size, merges, normalizer, folder = task
    # tqdm's lock is by default a named semaphore between processes, which a worker stopped by Ctrl-C
    # would leave behind; only this process shows progress while it merges.
    tqdm.set_lock(threading.RLock())
    merging = Progress("merging", merges, "merges")
    pairs = drained(summed_counts(counts_paths))  # the only hold on the summed counts
    bpe = BPETokenizer.train_from_counts(pairs, vocab_size, normalizer=normalizer, on_merge=merging.update)
    merging.close()
    bpe.save(folder)


def drained(counts):
    """The (word, count) pairs of `counts`, each taken out of it as it is handed on, so that the
    merges' copy of the words is not held beside the counts'."""
    while counts:
        yield counts.popitem()


def encode_chunk(task):
    """Encode one chunk into its shard (folder/key.bin and .json); returns the number of bytes read.

    A part that begins a document is `_start_` and encode(text); a part that goes on with the
    document of the part before it (it begins at a cut, "\\n" after a visible character) gets the
    ids the rest of the document's encoding gives it: those after an anchor's in encode(anchor +
    text), the anchor "<" where one came before in the document (GPT-1's unicode fix decodes HTML
    entities only until a line holds one), else "a".
    """
    (path, start, end, after_angle), (encoding, errors, paragraphs, dtype, tokenizer_dir), folder, key = task
    tokenizer = tokenizer_in(tokenizer_dir)
    separator = tokenizer.special_tokens.get(SEPARATOR)
    separator_ids = np.array([] if separator is None else [separator], dtype)
    ids, parts, angle, text_hash = [], [], after_angle, hashlib.sha256()
    pieces = corpus.read_pieces(path, start, end, encoding, errors)
    for text, begins in document_parts(pieces, paragraphs, start == 0):
        first = len(ids)
        if begins:
            ids += [separator_ids, np.array(tokenizer.encode(text), dtype)]
            angle, text_hash = "<" in text, hashlib.sha256()
        else:
            anchor = "<" if angle else "a"
            ids.append(np.array(tokenizer.encode(anchor + text)[len(tokenizer.encode(anchor)) :], dtype))
            angle = angle or "<" in text
        text_hash.update(text.encode())
        offset = parts[-1][1] if parts else 0
        part = [offset, offset + sum(map(len, ids[first:])), text_hash.hexdigest(), begins]
        if parts and not begins:  # the document of the part before goes on: one part, however read
            parts[-1][1:3] = part[1:3]
        else:
            parts.append(part)
    tokens = np.concatenate(ids) if ids else np.zeros(0, dtype)
    data = tokens.tobytes()
    write_whole(os.path.join(folder, f"{key}.bin"), data)
    record = {"tokens": len(tokens), "sha256": hashlib.sha256(data).hexdigest(), "parts": parts}
    write_whole(os.path.join(folder, f"{key}.json"), json.dumps(record).encode())
    return end - start


def shard_problem(folder, key, itemsize, full=False):
    """None where the shard `key` is whole; else what is wrong with it. The cheap check reads its
    .json and the size of its .bin; `full` also hashes the ids."""
    try:
        with open(os.path.join(folder, f"{key}.json"), encoding="utf-8") as file:
            record = json.load(file)
        size = os.path.getsize(os.path.join(folder, f"{key}.bin"))
    except FileNotFoundError:
        return "missing"
    except (OSError, ValueError) as error:
        return f"unreadable ({error})"
    if not isinstance(record, dict) or not isinstance(record.get("tokens"), int):
        return "its record is not one prepare wrote"
    if size != record["tokens"] * itemsize:
        return f"{size:,} bytes where its record promises {record['tokens'] * itemsize:,}"
    if full and file_digest(os.path.join(folder, f"{key}.bin")) != record.get("sha256"):
        return "its ids do not match their SHA-256"
    return None


def file_digest(path):
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()
