"""What prepare reads and what it knows of it: a record of each source (its size, times and inode,
its SHA-256 and chunks), the units of work the records make, and a task's bytes, read for a worker.

The records are kept in the dataset's sources.jsonl, one line a file and a last line that holds the
SHA-256 of the lines before it and the settings that read and cut the files. A record is trusted while its
file's size, modification time, change time (which no program can set back) and inode are those
recorded; a file is read again, hashed and cut anew, where any differs, where those settings
changed, where sources.jsonl is not whole, and with --verify.
"""

import contextlib
import hashlib
import json
import os

from tinygpt.files import write_whole

from . import corpus, packs, shards, sources, workers
from .progress import Progress
from .shards import Item

RECORDS = "sources.jsonl"


def read_records(folder):
    """(settings, {path: record}, their SHA-256) of a dataset's sources.jsonl; ({}, {}, None) where
    it is missing or not whole."""
    try:
        with open(os.path.join(folder, RECORDS), "rb") as file:
            lines = file.read().splitlines(keepends=True)
        trailer = json.loads(lines[-1])
        if trailer.get("sha256") != hashlib.sha256(b"".join(lines[:-1])).hexdigest():
            print(f"{os.path.join(folder, RECORDS)}: not whole; every file is read again")
            return {}, {}, None
        records = {record["path"]: record for record in map(json.loads, lines[:-1])}
        return trailer["settings"], records, trailer["sha256"]
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        return {}, {}, None


def write_records(folder, records, settings):
    """Write sources.jsonl whole; returns its last line's SHA-256 (of the records)."""
    lines = b"".join(json.dumps(record).encode() + b"\n" for record in records)
    digest = hashlib.sha256(lines).hexdigest()
    write_whole(
        os.path.join(folder, RECORDS), lines + json.dumps({"sha256": digest, "settings": settings}).encode()
    )
    return digest


def records_digest(records):
    """The SHA-256 that write_records would write of `records`."""
    return hashlib.sha256(b"".join(json.dumps(record).encode() + b"\n" for record in records)).hexdigest()


def plan(args, found, previous, cuts):
    """(the record of each source `found`, the settings that cut them, where files do not decode):
    the previous record where it can be trusted (see the module's docstring), else the file read,
    hashed and cut into chunks, by the workers, a batch of files each. `args`: prepare's flags."""
    settings = {"encoding": args.encoding, "errors": args.errors, "documents": args.documents, "cuts": cuts}
    settings["chunk_bytes"] = corpus.CHUNK_BYTES
    known = previous[1] if previous[0] == settings and not args.verify else {}
    records, todo = [], []
    for source in found:
        record = {"path": source.path, "format": source.format, "compression": source.compression}
        old, now = known.get(source.path, {}), source.identity
        if all(old.get(key) == value for key, value in record.items()) and old.get("stat") == now:
            records.append(old)
        else:
            records.append(record | {"stat": now})
            todo.append(len(records) - 1)
    batches, size = [[]], 0
    for number in todo:  # files in batches of at least a chunk's bytes, or of a thousand
        if size >= corpus.CHUNK_BYTES or len(batches[-1]) >= 1000:
            batches, size = [*batches, []], 0
        batches[-1].append(number)
        size += records[number]["stat"][0]
    problems, reading = [], [args.encoding, args.errors, args.documents, args.json_key, cuts]
    reading.append(corpus.CHUNK_BYTES)

    def read(result):
        for number, update, problem in result:
            records[number].update(update)
            problems.extend([problem] if problem else [])
            progress.update(records[number]["stat"][0])

    tasks = [[(number, records[number], reading) for number in batch] for batch in batches if batch]
    progress = Progress("reading", sum(records[number]["stat"][0] for number in todo), "B")
    workers.run_tasks(shards.read_sources, tasks, args.workers, read, progress.total)
    progress.close()
    return records, settings, problems


def units_of(records, reading):
    """[packs.Unit] of every chunk of every record but the blank ones, in order, each keyed by what
    its ids depend on."""
    settings = json.dumps(
        [reading.encoding, reading.errors, reading.paragraphs, reading.json_key, reading.cuts]
    )

    def key(record, chunk):
        return hashlib.sha256(
            f"{settings} {record['format']} {record['sha256']} {chunk[0]} {chunk[1]}".encode()
        )

    return [
        packs.Unit(number, chunk, chunk[5], key(record, chunk).hexdigest()[:32])
        for number, record in enumerate(records)
        if not record["blank"]
        for chunk in record["chunks"]
    ]


class Loader:
    """Reads a task's items in this process, for a worker: a chunk's bytes (decompressed, from the
    source's stream, which stays open for the chunks after it) or a row group's texts."""

    def __init__(self, records, json_key):
        self.records, self.json_key = records, json_key
        self.path, self.stream, self.position, self.stack = None, None, 0, contextlib.ExitStack()

    def items(self, task):
        return [self.item(unit) for unit in task.units]

    def item(self, unit):
        record, chunk = self.records[unit.source], corpus.Chunk(*unit.chunk[:5])
        plain = record["format"] == "text" and record["compression"] is None  # read by the worker
        data = None if plain else self.read(record, chunk.start, chunk.end)
        return Item(record["path"], record["format"], record["sha256"], chunk, data)

    def read(self, record, start, end):
        """The bytes start..end of a source's stream, or the texts of its row group `start`."""
        if record["path"] != self.path or (self.position > start and record["compression"]):
            self.stack.close()
            self.path, self.position = record["path"], 0
            if record["format"] == "parquet":
                self.stream = sources.parquet_file(record["path"])
            else:
                source = sources.Source(record["path"], record["format"], record["compression"])
                self.stream = self.stack.enter_context(sources.open_stream(source))
        if record["format"] == "parquet":
            return self.stream.read_row_group(start, columns=[self.json_key]).column(0).to_pylist()
        if record["compression"] is None:
            self.position = self.stream.seek(start)
        while self.position < start and (
            skipped := len(self.stream.read(min(start - self.position, sources.BLOCK)))
        ):
            self.position += skipped
        data = self.stream.read(end - start)
        self.position += len(data)
        if self.position != end:
            raise ValueError(f"{record['path']}: shorter than when it was read; run the same command again")
        return data

    def close(self):
        self.stack.close()
