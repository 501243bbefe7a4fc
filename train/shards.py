"""What the workers of train.prepare do: count the words of a task's documents, learn a BPE from
all the counts, or encode a task's documents into token ids.

A task is a run of chunks (of one source, or of many small ones) with their bytes, read by the main
process. Its ids go to the dataset's work/ folder in two files named by the task's key: `<key>.bin`,
the ids as raw uint16 or uint32, and `<key>.json`, their count and SHA-256 and, for each document
part, where its ids end, whether it begins its document, and the digest that splits it (null for a
part that goes on with a document begun in an earlier task). The .json is written last: a task
whose .json is there and whose ids match it is done.
"""

import functools
import hashlib
import json
import os
import threading
from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import regex
from tqdm import tqdm

from tinygpt.tokenizer import BPETokenizer, load_tokenizer
from tinygpt.tokenizer.bpe import GPT2_PATTERN, make_normalizer
from tinygpt.tokenizer.text import mend_surrogates

from . import corpus, sources
from .progress import Progress

SEPARATOR = "_start_"  # begins every document: the token that begins every fine-tuning input too


@dataclass(frozen=True)
class Reading:
    """How a task's bytes become documents: prepare's flags, and where the tokenizer cuts text."""

    encoding: str = "utf-8"
    errors: str = "strict"
    paragraphs: bool = False
    json_key: str = "text"
    cuts: str = "words"


class Item(NamedTuple):
    """One chunk of a task: its source (path, format, SHA-256), where in it, and what it holds
    (bytes of text or JSON lines; a Parquet row group's texts; None for bytes the worker reads
    itself, from a file that is not compressed)."""

    path: str
    format: str
    digest: str
    chunk: corpus.Chunk
    data: object


def read_sources(task):
    """Hash and cut a batch of sources into chunks: [(its number, its record's new fields: sha256,
    chunks [start, end, begins, angle, line, bytes], blank; where it does not decode, or None)].
    task: [(number, record, [encoding, errors, documents, json_key, cuts, chunk_bytes])]."""
    return [(number, *read_source(record, *reading)) for number, record, reading in task]


def read_source(record, encoding, errors, documents, json_key, cuts, chunk_bytes):
    """(the new fields of a source's record, where it does not decode or None): see read_sources."""
    source = sources.Source(record["path"], record["format"], record["compression"])
    raw = sources.Hashed(source.path)
    if source.format == "parquet":
        groups = sources.parquet_groups(source.path, json_key)
        chunks = [[number, number + 1, True, False, 1, size] for number, size in groups]
        with raw.file:
            return {"sha256": raw.rest(), "chunks": chunks, "blank": not groups}, None
    kind = "records" if source.format == "jsonl" else "paragraphs" if documents == "paragraphs" else cuts
    planner = corpus.Planner(kind, cuts, encoding, errors, chunk_bytes)
    if source.compression is None and record["stat"][0] <= corpus.PIECE:  # a small file: at once
        with raw.file:
            planner.feed(raw.read())
            digest = raw.rest()
    else:
        with sources.open_stream(source, raw) as stream:
            while block := stream.read(corpus.PIECE):
                planner.feed(block)
            digest = raw.rest()
    chunks = [[c.start, c.end, c.begins, c.angle, c.line, c.end - c.start] for c in planner.finish()]
    problem = planner.problem and planner.problem.replace("ENCODING", encoding.upper())
    return {
        "sha256": digest,
        "chunks": chunks,
        "blank": planner.blank,
    }, problem and f"{source.path}: {problem}"


def parts(item, reading):
    """(text, begins_a_document) of each part of an item's documents, in order."""
    text_of, where, data = (reading.encoding, reading.errors), (item.path, item.chunk.line), item.data
    if data is None:
        data = corpus.read_range(item.path, item.chunk.start, item.chunk.end)
    if item.format == "parquet":
        for text in data:
            yield from corpus.text_parts(text or "", reading.cuts)
    elif item.format == "jsonl":
        yield from corpus.records(data, reading.json_key, reading.cuts, *text_of, where)
    else:
        pieces = corpus.read_pieces(data, item.chunk.start, reading.cuts, *text_of, where)
        yield from corpus.document_parts(pieces, reading.paragraphs, item.chunk.begins)


def anchored(split, text, begins, angle, cuts):
    """split(text), for a part that goes on with its document (not `begins`): split(anchor + text)
    less split(anchor)'s, the anchor standing for the text before the cut ("<" where GPT-1's fix
    has met one, which stops it decoding HTML entities; else "a")."""
    if begins:
        return split(text)
    anchor = "<" if angle and cuts == "lines" else "a"
    return split(anchor + text)[len(split(anchor)) :]


@functools.lru_cache(maxsize=1)
def tokenizer_in(folder, fingerprint):
    """The tokenizer of `folder`, loaded once per process for each `fingerprint` (that of the
    tokenizer saved there; a process that runs prepare twice may find another there), in the first
    task: an error there reaches the command, where a pool's initializer would fail again and again
    unseen."""
    return load_tokenizer(folder)


def count_task(task):
    """{word: count} of a task's documents, as BPE training counts them, written to `out` as JSON;
    returns the bytes read. task: (items, reading, normalizer, out)."""
    items, reading, normalizer, out = task
    pattern, normalize = regex.compile(GPT2_PATTERN), make_normalizer(normalizer)

    def split(text):  # as BPETokenizer.train splits it (tinygpt.tokenizer.bpe.count_words)
        text = mend_surrogates(text)
        return pattern.findall(normalize(text) if normalize else text)

    counts = Counter()
    for item in items:
        angle = item.chunk.angle
        for text, begins in parts(item, reading):
            counts.update(anchored(split, text, begins, angle, reading.cuts))
            angle = (angle and not begins) or "<" in text
    write_file(out, json.dumps(counts, ensure_ascii=False).encode())
    return task_bytes(items)


def summed_counts(paths):
    """The sum of the {word: count} files count_task wrote, each removed once read."""
    counts = Counter()
    for path in paths:
        with open(path, encoding="utf-8") as file:
            counts.update(json.load(file))
        os.remove(path)
    return counts


def learn_bpe(task):
    """Sum the tasks' word counts, train the BPE on them and save it. It runs in a worker, where
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


def encode_task(task):
    """Encode a task's documents into work/<key>.bin and .json (see the module's docstring);
    returns (key, the bytes read). task: (items, reading, (tokenizer folder, its fingerprint), dtype,
    folder, key).

    A document is `_start_` and then encode_ordinary of its text, part by part (see anchored). Its
    digest, which decides its split, is its source's SHA-256 where a file is a document; else that
    of its text (of the part of it in this task, for one cut across tasks)."""
    items, reading, tokenizer_at, dtype, folder, key = task
    tokenizer = tokenizer_in(*tokenizer_at)
    separator = [tokenizer.special_tokens[SEPARATOR]] if SEPARATOR in tokenizer.special_tokens else []
    ids, records, text_hash = [], [], None
    whole_files = not reading.paragraphs
    for item in items:
        angle = item.chunk.angle
        for text, begins in parts(item, reading):
            ids += separator if begins else ()
            ids += anchored(tokenizer.encode_ordinary, text, begins, angle, reading.cuts)
            angle = (angle and not begins) or "<" in text
            if begins or not records:
                close_part(records, text_hash)
                records.append([0, begins, item.digest if whole_files and item.format == "text" else None])
                text_hash = hashlib.sha256() if begins and records[-1][2] is None else None
            if text_hash:
                text_hash.update(text.encode("utf-8", "surrogatepass"))
            records[-1][0] = len(ids)
    close_part(records, text_hash)
    data = np.array(ids, dtype).tobytes()
    write_file(os.path.join(folder, f"{key}.bin"), data)
    record = {"tokens": len(ids), "sha256": hashlib.sha256(data).hexdigest(), "parts": records}
    write_file(os.path.join(folder, f"{key}.json"), json.dumps(record).encode())
    return key, task_bytes(items)


def close_part(records, text_hash):
    """Give the last part its digest: its text's, where it began with a hash of its own."""
    if records and text_hash:
        records[-1][2] = text_hash.hexdigest()


def task_bytes(items):
    """The bytes a task reads: of its chunks, or its Parquet rows' text."""
    return sum(
        sum(len(text or "") for text in item.data)
        if item.format == "parquet"
        else item.chunk.end - item.chunk.start
        for item in items
    )


def write_file(path, data):
    """Write `data` to `path` whole: a temporary file renamed over it. Unlike a dataset's files it
    is not flushed to the disk first; what a crash loses is found (by its SHA-256) and done again."""
    temporary = f"{path}.partial-{os.getpid()}"
    try:
        with open(temporary, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    except OSError as error:
        raise OSError(error.errno, error.strerror, path) from None


def task_problem(folder, key):
    """None where the task `key`'s output is whole (its ids match its record); else what is wrong."""
    try:
        with open(os.path.join(folder, f"{key}.json"), encoding="utf-8") as file:
            record = json.load(file)
        with open(os.path.join(folder, f"{key}.bin"), "rb") as file:
            digest = hashlib.file_digest(file, "sha256").hexdigest()
    except FileNotFoundError:
        return "missing"
    except (OSError, ValueError) as error:
        return f"unreadable ({error})"
    if (
        not isinstance(record, dict)
        or record.get("sha256") != digest
        or not isinstance(record.get("parts"), list)
    ):
        return "its ids do not match their record"
    return None
