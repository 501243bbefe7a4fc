"""The shards of a dataset, packs of many documents: how prepare groups a corpus's chunks into
packs and tasks, and how it writes a pack once its tasks are done.

A pack is `shards/<key>.bin`, the ids of its documents one after another, and `shards/<key>.idx`
(safetensors), for each document part in it: where its ids end, whether it begins its document,
and the first 64 bits of the digest that decides its split. The count of packs follows the corpus's
bytes, about one per PACK_BYTES of text, never its count of files or records.

Where a pack ends is decided by its chunks' content, as rsync's and restic's chunkers cut a
stream: after a chunk whose key, read as a fraction, falls below its share of PACK_BYTES (at
MAX_PACK at the latest). A file added, removed or edited changes the keys of its own chunks alone,
so it changes the pack it falls in (and may join it to a neighbour), never the packs further on.
A pack is encoded as tasks of about TASK_BYTES, each a worker's unit (and the most a Ctrl-C loses),
written to work/ and joined into the pack when the pack's last task is done.
"""

import hashlib
import json
import os
from dataclasses import dataclass, field

import numpy as np

from autograd.serialization import load_file_with_metadata, save_file

from .dataset import file_digest, read_index
from .shards import task_problem

PACK_BYTES = 64 << 20
MAX_PACK = 4 * PACK_BYTES
TASK_BYTES = 4 << 20


@dataclass(frozen=True)
class Unit:
    """A chunk of the corpus, in order: its source (an index into the sources), the chunk, its
    size in bytes of text and its key (a hash of everything its ids depend on)."""

    source: int
    chunk: object
    size: int
    key: str


@dataclass
class Task:
    """A worker's unit: chunks read and encoded together, their output named by the key."""

    key: str = ""
    units: list = field(default_factory=list)
    size: int = 0  # the bytes of text its units hold


@dataclass
class Pack:
    key: str
    tasks: list


def digest_of(*parts):
    """A 32-hex-digit key: the SHA-256 of the JSON of `parts`."""
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


def plan_packs(units, encoding):
    """[Pack] of the units in order; `encoding`: what else the ids depend on (the tokenizer's
    fingerprint and the ids' dtype), part of every key."""
    packs, current, size = [], [], 0
    for unit in units:
        current.append(unit)
        size += unit.size
        if int(unit.key[:16], 16) < 2**64 * unit.size / PACK_BYTES or size >= MAX_PACK:
            packs.append(make_pack(current, encoding))
            current, size = [], 0
    return packs + ([make_pack(current, encoding)] if current else [])


def make_pack(units, encoding):
    """A Pack of units: its tasks take units in turn until they hold TASK_BYTES."""
    tasks = [Task()]
    for unit in units:
        if tasks[-1].size >= TASK_BYTES:
            tasks.append(Task())
        tasks[-1].units.append(unit)
        tasks[-1].size += unit.size
    for task in tasks:
        task.key = digest_of(encoding, [unit.key for unit in task.units])
    return Pack(digest_of(encoding, [unit.key for unit in units]), tasks)


def write_pack(pack, work, folder, carried):
    """Join the outputs of a pack's tasks (in `work`) into folder/<key>.bin and .idx, each written
    whole and flushed to the disk. `carried`: the digest of the document the pack begins inside of
    (its first part goes on with it), if any. Returns the pack's record (tokens, documents, the
    SHA-256 of both files) and the digest the next pack carries."""
    ends, begins, digests, offset = [], [], [], 0
    bin_path, digest = os.path.join(folder, f"{pack.key}.bin"), hashlib.sha256()
    temporary = f"{bin_path}.partial-{os.getpid()}"
    with open(temporary, "wb") as out:
        for task in pack.tasks:
            with open(os.path.join(work, f"{task.key}.json"), encoding="utf-8") as file:
                record = json.load(file)
            with open(os.path.join(work, f"{task.key}.bin"), "rb") as file:
                while block := file.read(1 << 22):
                    out.write(block)
                    digest.update(block)
            for end, starts, part_digest in record["parts"]:
                carried = part_digest or (None if starts else carried)
                ends.append(offset + end)
                begins.append(starts)
                digests.append(int(carried[:16], 16) if carried else 0)
            offset += record["tokens"]
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, bin_path)
    index = {"ends": np.array(ends, np.int64), "begins": np.array(begins, np.uint8)}
    index["digests"] = np.array(digests, np.uint64)
    recorded = {"sha256": digest.hexdigest(), "tokens": offset, "index": index_digest(index)}
    save_file(index, os.path.join(folder, f"{pack.key}.idx"), recorded)
    return pack_record(folder, pack.key), carried


def index_digest(index):
    """The SHA-256 of an index's arrays, which its own metadata records: a damaged index is found."""
    return hashlib.sha256(
        b"".join(index[name].astype(index[name].dtype.newbyteorder("<")).tobytes() for name in sorted(index))
    ).hexdigest()


def pack_record(folder, key):
    """What the manifest records of a pack: its key, tokens, documents and both files' SHA-256."""
    index, metadata = load_file_with_metadata(os.path.join(folder, f"{key}.idx"))
    record = {"key": key, "tokens": int(metadata["tokens"]), "documents": int(index["begins"].sum())}
    return record | {
        "sha256": metadata["sha256"],
        "index_sha256": file_digest(os.path.join(folder, f"{key}.idx")),
    }


def pack_problem(folder, key, itemsize):
    """None where a pack is whole: its index readable and of the SHA-256 it records, its ids of the
    size and SHA-256 it records; else what is wrong."""
    stem = os.path.join(folder, key)
    try:
        index, metadata = load_file_with_metadata(stem + ".idx")
        tokens, recorded = int(metadata["tokens"]), metadata["sha256"]
        size = os.path.getsize(stem + ".bin")
    except FileNotFoundError:
        return "missing"
    except (OSError, ValueError, KeyError) as error:
        return f"unreadable ({error})"
    if index_digest(index) != metadata.get("index"):
        return "its index does not match its SHA-256"
    if size != tokens * itemsize:
        return f"{size:,} bytes where its index records {tokens * itemsize:,}"
    return None if file_digest(stem + ".bin") == recorded else "its ids do not match their SHA-256"


def last_digest(folder, key):
    """The digest of the document a kept pack ends inside of (what the next pack carries)."""
    _, _, digests = read_index(os.path.join(folder, f"{key}.idx"))
    return f"{int(digests[-1]):016x}" if len(digests) and digests[-1] else None


def tasks_to_do(pack, work):
    """The tasks of a pack whose outputs in `work` are not whole."""
    return [task for task in pack.tasks if task_problem(work, task.key) is not None]
