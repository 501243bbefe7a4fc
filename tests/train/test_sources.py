"""train.sources: which files of a corpus are read (never a dataset's, a run's, a tokenizer's, a hidden
one, nor one twice), what each holds, and a missing extra or a file that is no file named in one line."""

import bz2
import gzip
import hashlib
import json
import lzma
import os
from pathlib import Path
from unittest import mock

import pytest

from tinygpt.tokenizer import BPETokenizer
from train import sources


def names(found):
    return [Path(source.path).name for source in found]


def test_a_folder_reads_its_corpus_and_names_what_it_skips(tmp_path):
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    for name in ("a.txt", "b.jsonl", "notes.md", ".hidden.txt"):
        (root / name).write_bytes(b"x")
    (root / "c.txt.gz").write_bytes(gzip.compress(b"x"))
    (root / "d.ndjson.zst").write_bytes(b"\x28\xb5\x2f\xfd\x20\x01\x09\x00\x00x")  # a zstd frame of "x"
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"text": ["x"]}), root / "sub" / "e.parquet")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD.txt").write_text("x")
    BPETokenizer.train(["a b"], 260).save(root / "tok")  # its merges.txt is no corpus
    (root / "ds").mkdir()
    (root / "ds" / "manifest.json").write_text("{}")
    (root / "ds" / "x.txt").write_text("x")
    (root / "run" / "tokenizer").mkdir(parents=True)
    (root / "run" / "config.json").write_text("{}")
    (root / "link.txt").symlink_to(root / "a.txt")
    os.mkfifo(root / "pipe.txt")
    found, skipped = sources.find_sources([root])
    assert names(found) == ["a.txt", "b.jsonl", "c.txt.gz", "d.ndjson.zst", "e.parquet"]
    assert [(s.format, s.compression) for s in found][2:4] == [("text", "gzip"), ("jsonl", "zstd")]
    why = {Path(path).name: reason for path, reason in skipped}
    assert why == {
        ".git": "hidden",
        ".hidden.txt": "hidden",
        "ds": "a dataset train.prepare wrote",
        "run": "a run's folder",
        "tok": "a tokenizer's folder",
        "link.txt": "a link",
        "pipe.txt": "a FIFO",
        "notes.md": "not *.txt or *.jsonl or *.ndjson or *.parquet",
    }


def test_a_file_reached_twice_is_read_once_in_the_order_given(tmp_path):
    (tmp_path / "a.txt").write_text("words")
    (tmp_path / "b.txt").write_text("words")
    paths = [tmp_path / "b.txt", tmp_path / "a.txt", f"{tmp_path}/./a.txt", tmp_path, f"{tmp_path}/*.txt"]
    found, skipped = sources.find_sources(paths)
    assert names(found) == ["b.txt", "a.txt"] and skipped == []


def test_what_is_not_a_corpus_is_an_error_naming_it(tmp_path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "tokenizer.json").write_text("{}")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    cases = {
        "": "an empty path",
        "/dev/zero": "/dev/zero: a character device, not a file or a folder",
        str(tmp_path / "ds"): "ds: a dataset train.prepare wrote, not a corpus",
        str(tmp_path / "*.nothing"): "the pattern matches no file",
    }
    for path, message in cases.items():
        with pytest.raises(ValueError, match=message):
            sources.find_sources([path])
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        sources.find_sources([tmp_path / "loop"])
    with pytest.raises(FileNotFoundError):
        sources.find_sources([tmp_path / "nothing"])


@pytest.mark.parametrize(
    "suffix, compress", [(".gz", gzip.compress), (".bz2", bz2.compress), (".xz", lzma.compress)]
)
def test_a_compressed_source_is_read_as_its_stream_and_hashed_as_stored(tmp_path, suffix, compress):
    text = (f"line {n}\n" for n in range(50_000))
    data = "".join(text).encode()
    path = tmp_path / f"a.jsonl{suffix}"
    path.write_bytes(compress(data))
    source = sources.source_of(path)
    raw = sources.Hashed(source.path)
    with sources.open_stream(source, raw) as stream:
        assert stream.read() == data
        assert raw.rest() == hashlib.sha256(path.read_bytes()).hexdigest()
    path.write_bytes(compress(data)[:-20])
    with pytest.raises(ValueError, match=f"{path}: not a whole"), sources.open_stream(source) as stream:
        stream.read()


def test_a_missing_extra_is_one_line_naming_the_install(tmp_path):
    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(b"(\xb5/\xfd")
    with mock.patch.dict("sys.modules", {"zstandard": None}), pytest.raises(ValueError) as error:
        with sources.open_stream(sources.source_of(path)):
            pass
    assert str(error.value) == "reading these files needs zstandard: pip install 'tinygpt[zstd]'"
    with (
        mock.patch.dict("sys.modules", {"pyarrow.parquet": None}),
        pytest.raises(ValueError, match=r"tinygpt\[parquet\]"),
    ):
        sources.parquet_file(tmp_path / "a.parquet")


def test_a_zstd_stream_and_a_parquet_file_are_read(tmp_path):
    zstandard = pytest.importorskip("zstandard")
    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "a"}\n') * 2)  # two frames
    with sources.open_stream(sources.source_of(path)) as stream:
        assert stream.read() == b'{"text": "a"}\n' * 2
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"text": ["one", "two"]}), tmp_path / "b.parquet")
    assert sources.parquet_file(tmp_path / "b.parquet").read().column("text").to_pylist() == ["one", "two"]
    assert json.loads(b'{"text": "a"}')["text"] == "a"
