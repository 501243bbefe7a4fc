"""The files of a corpus: which are read below the paths given, what each holds, and its bytes.

A text file holds one document (or, with --documents paragraphs, one a paragraph); a JSON lines
file (.jsonl, .ndjson) one a line, the string under --json-key; a Parquet file one a row, in the
column --json-key names. Text and JSON lines may be compressed (.gz, .bz2, .xz from the standard
library, .zst with the zstandard package), and are then read as a stream, never whole.

Below a folder a file is read where its name, a compression suffix aside, ends in one of the
extensions; hidden files and folders, links, things that are not files, and folders that hold a
prepared dataset, a run or a tokenizer are not, and are named. A file named directly is read
whatever its name. A file reached by two spellings is read once.
"""

import bz2
import contextlib
import functools
import glob
import gzip
import hashlib
import importlib
import lzma
import os
import stat
import zlib
from dataclasses import dataclass
from pathlib import Path

COMPRESSIONS = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zst": "zstd", ".zstd": "zstd"}
FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}
EXTENSIONS = (".txt", ".jsonl", ".ndjson", ".parquet")  # read below a folder by default
TOKENIZER_FILES = (("vocab.json", "merges.txt"), ("encoder_bpe_40000.json", "vocab_40000.bpe"))
EXTRAS = {"zstd": ("zstandard", "zstd"), "parquet": ("pyarrow.parquet", "parquet")}  # the module, pip's extra
BLOCK = 1 << 20  # bytes read at a time


@dataclass(frozen=True)
class Source:
    """One file of a corpus: its path, what it holds (text, jsonl, parquet), how it is compressed,
    and what says it is as it was when found: its size, modification and change times, inode."""

    path: str
    format: str
    compression: str | None = None
    identity: tuple = ()


def identity_of(status):
    """What says a file is as it was, of its os.stat: its size, modification and change times, inode."""
    return [status.st_size, status.st_mtime_ns, status.st_ctime_ns, status.st_ino]


def source_of(path, status=None):
    """The Source a path names, by the endings of its name (and its os.stat, where given)."""
    name = os.path.basename(path).lower()
    stem, dot, suffix = name.rpartition(".")
    compression = COMPRESSIONS.get(dot + suffix)
    if compression:
        stem, dot, suffix = stem.rpartition(".")
    kind = FORMATS.get(dot + suffix, "text")
    if kind == "parquet" and compression:
        raise ValueError(f"{path}: a compressed Parquet file; Parquet compresses its own columns")
    return Source(str(path), kind, compression, identity_of(status) if status else ())


def find_sources(paths, extensions=EXTENSIONS):
    """(the Sources of files, folders and globs in the order given, each folder's and glob's
    sorted; [(path, why it is not read)]). A path that names nothing, or names what is not a file
    or a corpus's folder, is an error naming it; a glob's matches are taken as a folder's entries."""
    found, skipped, seen = [], [], set()
    for path in map(str, paths):
        if not path:
            raise ValueError("an empty path (an unset shell variable?)")
        if any(char in path for char in "*?["):
            matches = sorted(glob.glob(path, recursive=True))
            if not matches:
                raise ValueError(f"{path}: the pattern matches no file")
            walk = [match for match in matches if read_below(match, skipped)]
        else:
            check_named(path)
            walk = [path]
        for start in walk:
            for file in [start] if os.path.isfile(start) else walk_folder(start, extensions, skipped):
                status = os.stat(file)
                if (status.st_dev, status.st_ino) in seen:
                    continue
                seen.add((status.st_dev, status.st_ino))
                try:
                    found.append(source_of(file, status))
                except ValueError as error:  # a compressed Parquet file
                    if file == path:
                        raise
                    skipped.append((file, str(error).split(": ", 1)[1]))
    return found, sorted(set(skipped))


def read_below(match, skipped):
    """Whether a glob's match is read (a file) or walked (a folder), as a folder's entry would be;
    one that is not goes to `skipped`, and so does one inside a dataset, a run or a tokenizer."""
    why = "a link" if os.path.islink(match) else None
    for folder in [] if why else Path(os.path.abspath(match)).parents:
        if reason := not_a_corpus(str(folder)):
            why = f"in {folder}, {reason}"
            break
    if not why:
        mode = os.stat(match).st_mode
        why = not_a_corpus(match) if stat.S_ISDIR(mode) else None if stat.S_ISREG(mode) else what_is(mode)
    if why:
        skipped.append((match, why))
    return not why


def check_named(path):
    """An error where a path given is not a file or a folder of a corpus: missing, a link that
    leads nowhere, a device or a FIFO, a prepared dataset, a run, a tokenizer."""
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        raise OSError(error.errno, error.strerror, path) from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise ValueError(f"{path}: {what_is(mode)}, not a file or a folder")
    if stat.S_ISDIR(mode) and (why := not_a_corpus(path)):
        raise ValueError(f"{path}: {why}, not a corpus")


def walk_folder(folder, extensions, skipped):
    """The files below `folder` that a corpus reads, in sorted order; what is not read goes to
    `skipped`."""
    files, entries = [], sorted(os.scandir(folder), key=lambda entry: entry.name)
    for entry in entries:
        why = "hidden" if entry.name.startswith(".") else "a link" if entry.is_symlink() else None
        if not why and entry.is_dir():
            why = not_a_corpus(entry.path)
            files += [] if why else walk_folder(entry.path, extensions, skipped)
        elif not why and not entry.is_file():
            why = what_is(entry.stat().st_mode)
        elif not why and not reads(entry.name, extensions):
            why = f"not {' or '.join('*' + e for e in extensions)}"
        elif not why:
            files.append(entry.path)
        if why:
            skipped.append((entry.path, why))
    return files


def reads(name, extensions):
    """Whether a file below a folder is read: its name, less a compression suffix, has an extension."""
    name = name.lower()
    for suffix in COMPRESSIONS:
        name = name.removesuffix(suffix)
    return name.endswith(tuple(extension.lower() for extension in extensions))


@functools.lru_cache(maxsize=4096)
def not_a_corpus(folder):
    """Why a folder is no corpus (a prepared dataset, a run, a tokenizer), or None."""
    from .dataset import is_dataset  # here: they import the engine, which prepare's workers need not
    from .run_folder import is_run

    if is_dataset(folder):
        return "a dataset train.prepare wrote"
    with contextlib.suppress(OSError):  # a folder that cannot be read says so when it is walked
        if is_run(folder):
            return "a run's folder"
    if any(all(os.path.isfile(os.path.join(folder, name)) for name in pair) for pair in TOKENIZER_FILES):
        return "a tokenizer's folder"
    return None


def what_is(mode):
    """A file's kind in words, for one that is not a regular file."""
    kinds = {stat.S_ISFIFO: "a FIFO", stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device"}
    kinds |= {stat.S_ISSOCK: "a socket", stat.S_ISDIR: "a folder", stat.S_ISLNK: "a link"}
    return next((kind for test, kind in kinds.items() if test(mode)), "not a regular file")


def needed(module, extra):
    """The module an extra installs, imported; one line naming the install where it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError:
        package = module.split(".")[0]
        raise ValueError(f"reading these files needs {package}: pip install 'tinygpt[{extra}]'") from None


class Hashed:
    """A file read through, its SHA-256 taken of every byte read."""

    def __init__(self, path):
        self.file, self.digest = open(path, "rb"), hashlib.sha256()

    def read(self, size=-1):
        data = self.file.read(size)
        self.digest.update(data)
        return data

    def readable(self):
        return True

    def rest(self):
        """The SHA-256 of the whole file, the bytes not read yet read now."""
        while self.read(BLOCK):
            pass
        return self.digest.hexdigest()


@contextlib.contextmanager
def open_stream(source, raw=None):
    """The bytes of a text or JSON lines source, decompressed, as a binary file; `raw`: the file
    they come from, opened already (a Hashed one, to take its digest). Within, a compressed stream
    that is not whole is a ValueError naming the file."""
    raw = raw or open(source.path, "rb")
    try:
        if source.compression is None:
            yield raw
        elif source.compression == "gzip":
            yield gzip.GzipFile(fileobj=raw, mode="rb")
        elif source.compression == "bzip2":
            yield bz2.BZ2File(raw)
        elif source.compression == "xz":
            yield lzma.LZMAFile(raw)
        else:
            yield ZstdFrames(raw, needed(*EXTRAS["zstd"]).ZstdDecompressor())
    except Exception as error:  # a decompressor's, among others, which go on as they are
        damaged = (
            isinstance(error, (EOFError, lzma.LZMAError, zlib.error)) or type(error).__name__ == "ZstdError"
        )
        if not (damaged or isinstance(error, OSError) and error.errno is None and source.compression):
            raise
        raise ValueError(f"{source.path}: not a whole {source.compression} stream ({error})") from None
    finally:
        (raw.file if isinstance(raw, Hashed) else raw).close()


class ZstdFrames:
    """The frames of a .zst file, decompressed one after another, read as a binary file; a frame cut
    short is an EOFError (zstandard's stream_reader ends there without a word)."""

    def __init__(self, raw, decompressor):
        self.raw, self.decompressor, self.held = raw, decompressor, bytearray()
        self.frame, self.fed = decompressor.decompressobj(), False

    def read(self, size=-1):
        while size < 0 or len(self.held) < size:
            data = self.raw.read(BLOCK)
            if not data:
                if self.fed and not self.frame.eof:
                    raise EOFError("the last frame ends before its end")
                break
            self.fed, out = True, self.frame.decompress(data)
            while self.frame.eof and (rest := self.frame.unused_data):  # a frame ended: the next one
                self.frame = self.decompressor.decompressobj()
                out += self.frame.decompress(rest)
            if self.frame.eof:
                self.frame, self.fed = self.decompressor.decompressobj(), False
            self.held += out
        data = bytes(self.held[: len(self.held) if size < 0 else size])
        del self.held[: len(data)]
        return data


def parquet_groups(path, key):
    """[(row group, bytes)] of a Parquet file's row groups that hold rows; an error where it has no
    text column `key`."""
    file = parquet_file(path)
    names = file.schema_arrow.names
    if key not in names:
        columns = ", ".join(names)
        raise ValueError(f"{path}: no column {key!r} (its columns: {columns}); --json-key names the text's")
    kind = file.schema_arrow.field(key).type
    if str(kind) not in ("string", "large_string", "string_view"):
        raise ValueError(f"{path}: its column {key!r} holds {kind}, not text")
    groups = [file.metadata.row_group(i) for i in range(file.metadata.num_row_groups)]
    return [(i, group.total_byte_size) for i, group in enumerate(groups) if group.num_rows]


def parquet_file(path):
    """A pyarrow ParquetFile (its metadata read, its rows not); one that is not is a ValueError."""
    parquet = needed(*EXTRAS["parquet"])
    try:
        return parquet.ParquetFile(path)
    except (ValueError, OSError) as error:
        if isinstance(error, OSError) and error.errno is not None:
            raise
        raise ValueError(f"{path}: not a Parquet file ({error})") from None
