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

from .dataset import is_dataset

COMPRESSIONS = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zst": "zstd", ".zstd": "zstd"}
FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}
EXTENSIONS = (".txt", ".jsonl", ".ndjson", ".parquet")  # read below a folder by default
TOKENIZER_FILES = (("vocab.json", "merges.txt"), ("encoder_bpe_40000.json", "vocab_40000.bpe"))
EXTRAS = {"zstd": ("zstandard", "zstd"), "parquet": ("pyarrow.parquet", "parquet")}  # the module, pip's extra
BLOCK = 1 << 20  # bytes read at a time


@dataclass(frozen=True)
class Source:
    """One file of a corpus: its path, what it holds (text, jsonl, parquet) and how it is compressed."""

    path: str
    format: str
    compression: str | None = None


def source_of(path):
    """The Source a path names, by the endings of its name."""
    name = Path(path).name.lower()
    compression = next((kind for suffix, kind in COMPRESSIONS.items() if name.endswith(suffix)), None)
    if compression:
        name = name[: name.rindex(".")]
    kind = next((kind for suffix, kind in FORMATS.items() if name.endswith(suffix)), "text")
    if kind == "parquet" and compression:
        raise ValueError(f"{path}: a compressed Parquet file; Parquet compresses its own columns")
    return Source(str(path), kind, compression)


def find_sources(paths, extensions=EXTENSIONS):
    """(the Sources of files, folders and globs in the order given, each folder's and glob's
    sorted; [(path, why it is not read)]). A path that names nothing, or names what is not a file
    or a corpus's folder, is an error naming it."""
    found, skipped, seen = {}, [], set()
    for path in map(str, paths):
        if not path:
            raise ValueError("an empty path (an unset shell variable?)")
        if any(char in path for char in "*?["):
            matches = sorted(glob.glob(path, recursive=True))
            if not matches:
                raise ValueError(f"{path}: the pattern matches no file")
            below = [(match, "a link") if os.path.islink(match) else (match, None) for match in matches]
            skipped += [entry for entry in below if entry[1]]
            walk = [match for match, why in below if not why]
        else:
            check_named(path)
            walk = [path]
        for start in walk:
            entries = [(start, True)] if os.path.isfile(start) else walk_folder(start, extensions, skipped)
            for file, named in entries:
                identity = (os.stat(file).st_dev, os.stat(file).st_ino)
                if identity not in seen:
                    seen.add(identity)
                    found[file] = named
    sources = [source_of(path) for path in found]
    empty = [source for source in sources if is_empty(source)]
    skipped += [(source.path, "empty") for source in empty]
    return [source for source in sources if source not in empty], sorted(set(skipped))


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
    """[(path, False)] of the files below `folder` that a corpus reads, in sorted order; what is
    not read goes to `skipped`."""
    files = []
    for root, folders, names in os.walk(folder):
        for name in sorted(folders):
            below = os.path.join(root, name)
            why = (
                "hidden"
                if name.startswith(".")
                else "a link"
                if os.path.islink(below)
                else not_a_corpus(below)
            )
            if why:
                skipped.append((below, why))
                folders.remove(name)
        folders.sort()
        for name in sorted(names):
            below = os.path.join(root, name)
            mode = os.lstat(below).st_mode
            if name.startswith("."):
                skipped.append((below, "hidden"))
            elif not stat.S_ISREG(mode):
                skipped.append((below, "a link" if stat.S_ISLNK(mode) else what_is(mode)))
            elif not reads(name, extensions):
                skipped.append((below, f"not {' or '.join('*' + e for e in extensions)}"))
            else:
                files.append((below, False))
    return files


def reads(name, extensions):
    """Whether a file below a folder is read: its name, less a compression suffix, has an extension."""
    name = name.lower()
    for suffix in COMPRESSIONS:
        name = name.removesuffix(suffix)
    return name.endswith(tuple(extension.lower() for extension in extensions))


def not_a_corpus(folder):
    """Why a folder is no corpus (a prepared dataset, a run, a tokenizer), or None."""
    from .run_folder import is_run  # not at the top: it imports the model, which prepare's workers need not

    if is_dataset(folder):
        return "a dataset train.prepare wrote"
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


def is_empty(source):
    """Whether a source holds no text: nothing but ASCII white space, or no row."""
    if source.format == "parquet":
        return parquet_file(source.path).metadata.num_rows == 0
    with open_stream(source) as stream:
        while block := stream.read(BLOCK):
            if not block.isspace():
                return False
    return True


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
            yield needed(*EXTRAS["zstd"]).ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    except Exception as error:  # a decompressor's, among others, which go on as they are
        damaged = (
            isinstance(error, (EOFError, lzma.LZMAError, zlib.error)) or type(error).__name__ == "ZstdError"
        )
        if not (damaged or isinstance(error, OSError) and error.errno is None and source.compression):
            raise
        raise ValueError(f"{source.path}: not a whole {source.compression} stream ({error})") from None
    finally:
        (raw.file if isinstance(raw, Hashed) else raw).close()


def parquet_file(path):
    """A pyarrow ParquetFile (its metadata read, its rows not); one that is not is a ValueError."""
    parquet = needed(*EXTRAS["parquet"])
    try:
        return parquet.ParquetFile(path)
    except (ValueError, OSError) as error:
        if isinstance(error, OSError) and error.errno is not None:
            raise
        raise ValueError(f"{path}: not a Parquet file ({error})") from None
