"""What prepare reads and what it knows of it: a record of each source (its size, times and inode,
its SHA-256 and chunks), the units of work the records make, and a task's bytes, read for a worker.

The records are kept in the dataset's sources.jsonl, one line a file and a last line that holds the
SHA-256 of the lines before it and the settings that cut the files. A record is trusted while its
file's size, modification time, change time (which no program can set back) and inode are those
recorded; a file is read again, hashed and cut anew, where any differs, where those settings
changed, where sources.jsonl is not whole, and with --verify.
"""

import contextlib
import hashlib
import json
import os

from tinygpt.files import UndecodableFiles, write_whole

from . import corpus, packs, sources
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


def identity(path):
    """What says a file is as it was: its size, modification and change times, inode."""
    status = os.stat(path)
    return [status.st_size, status.st_mtime_ns, status.st_ctime_ns, status.st_ino]


def plan(args, found, previous, cuts):
    """The record of each source `found` (prepare's flags in `args`): the previous one where it can
    be trusted (see the module's docstring), else the file read, hashed and cut into chunks."""
    settings = {"encoding": args.encoding, "documents": args.documents, "cuts": cuts}
    known = previous[1] if previous[0] == settings and not args.verify else {}
    records, todo = [], []
    for source in found:
        record = {"path": source.path, "format": source.format, "compression": source.compression}
        old = known.get(source.path, {})
        if all(old.get(key) == value for key, value in record.items()) and old.get("stat") == identity(
            source.path
        ):
            records.append(old)
        else:
            records.append(record | {"stat": identity(source.path)})
            todo.append(records[-1])
    progress, problems = Progress("reading", sum(record["stat"][0] for record in todo), "B"), []
    for record in todo:
        problem = read_source(record, args, cuts, progress.update)
        problems += [problem] if problem else []
    progress.close()
    if problems:
        raise UndecodableFiles(problems)
    return records, settings


def read_source(record, args, cuts, on_bytes):
    """Hash and cut one source into chunks (its record gains sha256, chunks: [start, end, begins,
    angle, line, size]); returns where it does not decode, or None."""
    source = sources.Source(record["path"], record["format"], record["compression"])
    raw = sources.Hashed(source.path)
    if source.format == "parquet":
        groups = parquet_groups(source.path, args.json_key)
        record.update(sha256=raw.rest(), chunks=[[i, i + 1, True, False, 1, size] for i, size in groups])
        on_bytes(record["stat"][0])
        return None
    kind = (
        "records" if source.format == "jsonl" else args.documents if args.documents == "paragraphs" else cuts
    )
    planner = corpus.Planner(kind, cuts, args.encoding, args.errors)
    with sources.open_stream(source, raw) as stream:
        while block := stream.read(corpus.PIECE):
            planner.feed(block)
            on_bytes(len(block) if source.compression is None else 0)
        record["sha256"] = raw.rest()
    if source.compression:
        on_bytes(record["stat"][0])
    record["chunks"] = [
        [c.start, c.end, c.begins, c.angle, c.line, c.end - c.start] for c in planner.finish()
    ]
    problem = planner.problem and planner.problem.replace("ENCODING", args.encoding.upper())
    return problem and f"{source.path}: {problem}"


def parquet_groups(path, key):
    """[(row group, bytes)] of a Parquet file's row groups that hold rows; an error where it has no
    text column `key`."""
    file = sources.parquet_file(path)
    names = file.schema_arrow.names
    if key not in names:
        raise ValueError(
            f"{path}: no column {key!r} (its columns: {', '.join(names)}); --json-key names the text's"
        )
    kind = file.schema_arrow.field(key).type
    if str(kind) not in ("string", "large_string", "string_view"):
        raise ValueError(f"{path}: its column {key!r} holds {kind}, not text")
    groups = [file.metadata.row_group(i) for i in range(file.metadata.num_row_groups)]
    return [(i, group.total_byte_size) for i, group in enumerate(groups) if group.num_rows]


def units_of(records, reading):
    """[packs.Unit] of every chunk of every record, in order, each keyed by what its ids depend on."""
    settings = [reading.encoding, reading.errors, reading.paragraphs, reading.json_key, reading.cuts]
    return [
        packs.Unit(
            number, chunk, chunk[5], packs.digest_of(settings, record["format"], record["sha256"], chunk[:2])
        )
        for number, record in enumerate(records)
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
        record, (start, end, begins, angle, line, _) = self.records[unit.source], unit.chunk
        chunk = corpus.Chunk(start, end, begins, angle, line)
        return Item(record["path"], record["format"], record["sha256"], chunk, self.read(record, start, end))

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
