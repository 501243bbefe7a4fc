"""train.prepare: the ids of a prepared dataset are each document's encoding, whatever the format,
the chunks, pieces, tasks, packs and workers; a killed prepare goes on to the same bytes; a new file
changes only its pack; prepare touches only what it wrote, reads only corpus, trusts only what it
can check; bad input is one line."""

import bz2
import errno
import gzip
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tinygpt.tokenizer import BPETokenizer, GPT1Tokenizer
from train import corpus, dataset, evaluate, packs, plan, prepare, pretrain, shards, workers

from .runs import SMALLER, for_dataset, pretrain_argv

ON_DATASET = for_dataset(SMALLER)
GPT1_FILES = Path(__file__).parents[2].parent / "shared" / "data" / "gpt1-bpe"
TEXT = ["The cat sat on the mat.\nIt was warm; the dog & cat slept.\n\nA new day <b> &amp; more.\n"]
BPE = BPETokenizer.train(TEXT * 3, 300)
NORMALIZED = BPETokenizer.train(TEXT * 3, 300, normalizer="gpt1")
TOKENIZERS = [BPE, NORMALIZED] + ([GPT1Tokenizer.from_folder(GPT1_FILES)] if GPT1_FILES.is_dir() else [])
PIECES = ["a", "Z", ".", ",", "'", "!", "<", ">", "&amp;", " ", "  ", "\t", "\n", "\n\n", "\r\n", "\r", "é"]
PIECES += ["’", "It's", "don't", "\u00a0", "…", "日本", "😀", "Mr.", "--", "...", "_start_", "_classify_"]
PIECES += ["\x85", "\x1c", "\ufeff"]  # white space to the regex module, not to GPT-1's unicode fix
ASCII = [piece for piece in PIECES if piece.isascii() and piece not in ("\x1c",)] + ["word", "Words"]
# a document of any pieces, or of ASCII alone (whose long lines GPT-1's tokenizer lets cut at a space)
documents = (
    st.sampled_from([PIECES, ASCII])
    .flatmap(lambda pieces: st.lists(st.sampled_from(pieces), min_size=1, max_size=40))
    .map("".join)
)
SMALL_SIZES = {"CHUNK_BYTES": 4000, "PIECE": 1000}  # several chunks a file, and pieces a chunk
# a prepare with small chunks, tasks and packs, run as a command (for the tests that stop it)
SMALL_PREPARE = """import sys
from unittest import mock
from train import corpus, packs, prepare
with mock.patch.multiple(corpus, CHUNK_BYTES=4000, PIECE=1000), mock.patch.multiple(
    packs, TASK_BYTES=8000, PACK_BYTES=40000, MAX_PACK=160000
):
    prepare.main(sys.argv[1:])
"""


def documents_of(folder, with_digests=False):
    """[the ids of each document] of a prepared dataset, in order, read through its packs' indexes;
    `with_digests`: [(ids, the digest of each of its parts)]."""
    manifest, found = dataset.read_manifest(folder), []
    for pack in manifest["packs"]:
        ids = np.fromfile(Path(folder, "shards", f"{pack['key']}.bin"), dtype=manifest["dtype"]).tolist()
        ends, begins, digests = dataset.read_index(Path(folder, "shards", f"{pack['key']}.idx"))
        for start, end, begin, digest in zip([0, *ends[:-1]], ends, begins, digests.tolist()):
            if begin or not found:
                found.append(([], []))
            found[-1][0].extend(ids[start:end])
            found[-1][1].append(digest)
    return found if with_digests else [document for document, _ in found]


def paragraphs_of(text):
    """A text's documents with --documents paragraphs, worked out line by line: a run of blank
    lines (of nothing but white space), each after a line end and before one, ends a document."""
    lines, found, current = text.split("\n"), [], [text.split("\n")[0]]
    for number, line in enumerate(lines[1:], start=1):
        if number < len(lines) - 1 and all(
            char.isspace() and char not in "\x1c\x1d\x1e\x1f" for char in line
        ):
            found.append("\n".join(current or []))
            current = None
        else:
            current = [line] if current is None else [*current, line]
    return [part for part in [*found, "\n".join(current or [])] if part]


def texts_of(path, paragraphs):
    """(the documents of a file, read whole, as prepare defines them; the digest of the file)."""
    data = Path(path).read_bytes()
    digest = int(hashlib.sha256(data).hexdigest()[:16], 16)
    data = gzip.decompress(data) if path.suffix == ".gz" else data
    if data.isspace():
        return [], None  # named and not read
    text = data.decode("utf-8").removeprefix("\ufeff")
    if ".jsonl" in path.name:
        records = [
            record["text"].replace("\r\n", "\n").replace("\r", "\n")
            for record in map(json.loads, text.split("\n")[:-1])
        ]
        return [record for record in records if record], digest
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return (paragraphs_of(text) if paragraphs else [text] if text else []), digest


def run_prepare(*argv):
    with mock.patch.dict(os.environ, {"TQDM_DISABLE": "1"}):
        prepare.main([*map(str, argv)])


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    files=st.lists(
        st.tuples(
            st.lists(documents, min_size=1, max_size=4), st.sampled_from(["txt", "jsonl"]), st.booleans()
        ),
        min_size=1,
        max_size=3,
    ),
    tokenizer=st.sampled_from(TOKENIZERS),
    paragraphs=st.booleans(),
    sizes=st.fixed_dictionaries({"CHUNK_BYTES": st.integers(1, 64), "PIECE": st.integers(1, 16)}),
    pack_sizes=st.fixed_dictionaries(
        {
            "TASK_BYTES": st.integers(1, 100),
            "PACK_BYTES": st.integers(1, 200),
            "MAX_PACK": st.integers(1, 400),
        }
    ),
    bom=st.booleans(),
)
def test_the_ids_of_each_document_are_its_encoding_however_it_is_cut(
    tmp_path_factory, files, tokenizer, paragraphs, sizes, pack_sizes, bom
):
    """Text files (LF, CRLF, CR; one line or many; a BOM) and JSON lines, compressed or not, with
    text that spells the special tokens: each document is _start_ and encode_ordinary(its text)."""
    folder = tmp_path_factory.mktemp("prepare")
    tokenizer.save(folder / "tokenizer")
    flag = "--gpt1-tokenizer" if isinstance(tokenizer, GPT1Tokenizer) else "--tokenizer"
    for number, (texts, kind, compressed) in enumerate(files):
        text = (
            "".join(json.dumps({"text": t}) + "\n" for t in texts)
            if kind == "jsonl"
            else ("\n\n" if paragraphs else "").join(texts)
        )
        data = ("\ufeff" if bom else "").encode() + text.encode()
        (folder / f"{number}.{kind}{'.gz' * compressed}").write_bytes(
            gzip.compress(data) if compressed else data
        )
    paths = sorted(path for path in folder.iterdir() if path.is_file())
    expected = []  # (a document's text, the digest that splits it: its file's, its own, or (paragraphs) any)
    for path in paths:
        texts, file_digest = texts_of(path, paragraphs)
        own = ".jsonl" in path.name
        expected += [
            (text, text_digest(text) if own else None if paragraphs else file_digest) for text in texts
        ]
    assume(expected)
    with mock.patch.multiple(corpus, **sizes), mock.patch.multiple(packs, **pack_sizes):
        documents = "paragraphs" if paragraphs else "files"
        run_prepare(
            "--data",
            *paths,
            "--out",
            folder / "data",
            flag,
            folder / "tokenizer",
            "--workers",
            1,
            "--documents",
            documents,
            "--val-fraction",
            0.5,
        )
    found, start = documents_of(folder / "data", with_digests=True), [tokenizer.special_tokens["_start_"]]
    assert [ids for ids, _ in found] == [start + tokenizer.encode_ordinary(text) for text, _ in expected]
    for (_, digests), (_, digest) in zip(found, expected):
        assert len(set(digests)) == 1 and digest in (None, digests[0])  # one split for all its parts
    held_out = sum(len(ids) for ids, digests in found if digests[0] < 2**63)  # a digest below half of 2**64
    assert len(dataset.Dataset(str(folder / "data")).val) == held_out


def text_digest(text):
    """The first 64 bits of a text's SHA-256, which split a document of its own."""
    return int(hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16], 16)


def corpus_of(folder, files=12, lines=300, seed=0):
    """Small text files of made-up sentences."""
    rng = random.Random(seed)
    words = "the cat dog sat on mat warm day night bird sang tree river ran".split()
    folder.mkdir(exist_ok=True)
    for number in range(files):
        sentences = [" ".join(rng.choices(words, k=8)).capitalize() + "." for _ in range(lines)]
        (folder / f"{number:02}.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    return folder


def folder_bytes(folder):
    """{relative path: bytes} of every file of a dataset but its lock."""
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(Path(folder).rglob("*"))
        if path.is_file() and path.name != ".lock"
    }


def prepare_argv(data, out, *extra):
    return [
        sys.executable,
        "-c",
        SMALL_PREPARE,
        "--data",
        str(data),
        "--out",
        str(out),
        "--vocab-size",
        "300",
        *extra,
    ]


def test_one_worker_and_two_write_the_same_bytes_and_pretrain_trains_on_them(tmp_path, capsys):
    data = corpus_of(tmp_path / "text")
    # Small chunks and pieces, enough for workers to start, who make way for fresh ones after a
    # third of the corpus; several packs.
    small = mock.patch.multiple(packs, TASK_BYTES=8000, PACK_BYTES=30000, MAX_PACK=120000)
    with (
        mock.patch.multiple(corpus, **SMALL_SIZES),
        small,
        mock.patch.object(workers, "WORKER_BYTES", 60_000),
    ):
        run_prepare("--data", data, "--out", tmp_path / "one", "--vocab-size", 300, "--workers", 1)
        run_prepare("--data", data, "--out", tmp_path / "two", "--vocab-size", 300, "--workers", 2)
    one = folder_bytes(tmp_path / "one")
    assert one == folder_bytes(tmp_path / "two")
    texts = [path.read_text(encoding="utf-8") for path in sorted(data.glob("*.txt"))]
    BPETokenizer.train(texts, 300).save(tmp_path / "whole")  # words counted at once, not by chunks
    assert one["tokenizer/merges.txt"] == (tmp_path / "whole" / "merges.txt").read_bytes()
    assert 2 < sum(name.endswith(".bin") for name in one) < 12  # packs of several files, not one a file
    out = capsys.readouterr().out
    assert "counting words" in out and "encoding" in out and "val:" in out
    pretrain.main(pretrain_argv(tmp_path / "one", tmp_path / "run", "--steps", "2", size=ON_DATASET))
    assert "prepared in" in capsys.readouterr().out
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("val_loss" in m for m in metrics)
    run_prepare("--data", data, "--out", tmp_path / "other", "--vocab-size", 280, "--workers", 1)
    with pytest.raises(SystemExit):
        pretrain.main(
            ["--resume", str(tmp_path / "run"), "--data", str(tmp_path / "other"), "--allow-data-change"]
        )
    error = "--data: {} was prepared with another tokenizer than --resume's ({})"
    assert error.format(tmp_path / "other", tmp_path / "run" / "tokenizer") in capsys.readouterr().err


def test_a_bpe_normalized_as_gpt1s_counts_the_words_of_the_whole_texts(tmp_path):
    data = corpus_of(tmp_path / "text", files=3, lines=60)
    (data / "03.txt").write_text("It's  <b>\n  don't\r\n&amp; café’s\n" * 30)
    with mock.patch.multiple(corpus, CHUNK_BYTES=200, PIECE=50):
        run_prepare(
            "--data",
            data,
            "--out",
            tmp_path / "set",
            "--vocab-size",
            400,
            "--normalize",
            "gpt1",
            "--workers",
            1,
        )
    texts = [path.read_text(encoding="utf-8") for path in sorted(data.glob("*.txt"))]
    BPETokenizer.train(texts, 400, normalizer="gpt1").save(tmp_path / "whole")
    assert (tmp_path / "set/tokenizer/merges.txt").read_bytes() == (
        tmp_path / "whole/merges.txt"
    ).read_bytes()


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL])
def test_a_killed_prepare_goes_on_to_the_same_bytes(tmp_path, how):
    data = corpus_of(tmp_path / "text", files=100, lines=2000)
    subprocess.run(prepare_argv(data, tmp_path / "whole"), capture_output=True, check=True)
    process = subprocess.Popen(
        prepare_argv(data, tmp_path / "cut", "--workers", "2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    while not process.stdout.readline().startswith("training a byte-level BPE"):
        pass
    time.sleep(random.Random(how).uniform(0.3, 1.2))  # counting words, merging or encoding
    process.send_signal(how)
    assert process.wait(timeout=60) != 0  # stopped before its end
    if how == signal.SIGINT:  # one line, from this process alone: no worker's, nothing left behind
        assert process.stderr.read() == "interrupted\n"
    subprocess.run(prepare_argv(data, tmp_path / "cut"), capture_output=True, check=True)
    assert folder_bytes(tmp_path / "cut") == folder_bytes(tmp_path / "whole")


def test_a_sigterm_while_pretrain_prepares_its_text_ends_it_with_one_line(tmp_path):
    data = corpus_of(tmp_path / "text", files=8, lines=6000)
    argv = [sys.executable, "-m", "train.pretrain", *pretrain_argv(data, tmp_path / "run", size=SMALLER)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TINYGPT_CACHE": str(tmp_path / "cache")}
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    while not process.stdout.readline().startswith("training a byte-level BPE"):
        assert process.poll() is None
    time.sleep(0.3)  # counting words, in the workers
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 128 + signal.SIGINT  # a KeyboardInterrupt, as in prepare
    assert process.stderr.read() == "interrupted\n"


def test_a_new_file_moves_no_other_document_and_only_its_pack_is_encoded(tmp_path, capsys):
    data = corpus_of(tmp_path / "text", files=40, lines=60)
    small = mock.patch.multiple(packs, TASK_BYTES=2000, PACK_BYTES=8000, MAX_PACK=32000)
    encoded, encode_task = [], shards.encode_task

    def counted(task):
        encoded.append(shards.task_bytes(task[0]))
        return encode_task(task)

    with small:
        run_prepare("--data", data, "--out", tmp_path / "set", "--vocab-size", 300, "--workers", 1)
        before, documents = dataset.read_manifest(tmp_path / "set"), documents_of(tmp_path / "set")
        (data / "17b.txt").write_text("A new file, with its own words.\n", encoding="utf-8")
        with mock.patch.object(shards, "encode_task", counted):
            run_prepare("--data", data, "--out", tmp_path / "set", "--vocab-size", 300, "--workers", 1)
    after = dataset.read_manifest(tmp_path / "set")
    kept = {pack["key"] for pack in before["packs"]} & {pack["key"] for pack in after["packs"]}
    assert len(before["packs"]) > 5 and len(kept) >= len(before["packs"]) - 2
    assert 0 < sum(encoded) <= 32000 + 100  # a pack's worth at most, of 110 KB
    new = documents_of(tmp_path / "set")
    assert new[:18] + new[19:] == documents and len({d[0] for d in dataset_splits(tmp_path / "set")}) == 2
    os.remove(data / "17b.txt")
    with small:
        run_prepare("--data", data, "--out", tmp_path / "set", "--vocab-size", 300, "--workers", 1)
    assert dataset.read_manifest(tmp_path / "set")["packs"] == before["packs"]
    assert sorted(p.name for p in (tmp_path / "set" / "shards").iterdir()) == sorted(
        f"{p['key']}{s}" for p in before["packs"] for s in (".bin", ".idx")
    )


def dataset_splits(folder):
    """[(split, tokens)] of each document part, by the dataset's own reading."""
    prepared = dataset.Dataset(str(folder))
    return [("train", n) for n in np.diff(prepared.train.ends, prepend=0)] + [
        ("val", n) for n in np.diff(prepared.val.ends, prepend=0)
    ]


def test_json_lines_and_parquet_compressed_or_not_are_read_as_documents(tmp_path, capsys):
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    zstandard = pytest.importorskip("zstandard")
    texts = [
        f"Document {n}: the cat sat on the mat, _start_ and all.\r\nIts second line." for n in range(300)
    ]
    lines = [json.dumps({"body": t, "id": n}).encode() + b"\n" for n, t in enumerate(texts)]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl.bz2").write_bytes(bz2.compress(b"".join(lines[:150])))
    (tmp_path / "in" / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(b"".join(lines[150:])))
    pq.write_table(pa.table({"body": texts}), tmp_path / "in" / "c.parquet", row_group_size=70)
    with (
        mock.patch.multiple(corpus, CHUNK_BYTES=3000, PIECE=500),
        mock.patch.object(packs, "TASK_BYTES", 5000),
    ):
        run_prepare(
            "--data",
            tmp_path / "in",
            "--out",
            tmp_path / "set",
            "--vocab-size",
            300,
            "--json-key",
            "body",
            "--workers",
            2,
        )
    tokenizer = BPETokenizer.load(tmp_path / "set" / "tokenizer")
    start = tokenizer.special_tokens["_start_"]
    expected = [[start, *tokenizer.encode_ordinary(t.replace("\r\n", "\n"))] for t in texts * 2]
    assert documents_of(tmp_path / "set") == expected
    (tmp_path / "in" / "d.jsonl").write_text('{"body": "fine"}\n{"text": "no body"}\n')
    with pytest.raises(SystemExit):
        run_prepare(
            "--data", tmp_path / "in", "--out", tmp_path / "set", "--vocab-size", 300, "--json-key", "body"
        )
    assert (
        "--data: " + str(tmp_path / "in" / "d.jsonl") + ": line 2: no 'body' in it" in capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        run_prepare("--data", tmp_path / "in" / "d.jsonl", "--out", tmp_path / "x", "--json-key", "nothing")
    with pytest.raises(SystemExit):
        run_prepare("--data", TEXT_FILE(tmp_path), "--out", tmp_path / "y", "--json-key", "body")
    assert "--json-key is for JSON lines and Parquet files" in capsys.readouterr().err


def TEXT_FILE(tmp_path):  # noqa: N802
    (tmp_path / "plain.txt").write_text(TEXT[0])
    return tmp_path / "plain.txt"


def test_bad_input_is_one_line_naming_what_to_do(tmp_path, capsys):
    data = corpus_of(tmp_path / "text", files=3)
    (data / "bad.txt").write_bytes(b"fine\nline two \xff here\n")
    (data / "empty.txt").write_bytes(b"")
    (data / "notes.md").write_text("skipped")
    (data / "broken.txt.gz").write_bytes(gzip.compress(b"the cat " * 100)[:-12])
    out = tmp_path / "set"
    with pytest.raises(SystemExit) as stop:
        run_prepare("--data", data, "--out", out, "--vocab-size", 300, "--workers", 1)
    assert stop.value.code == 2
    assert f"--data: {data / 'broken.txt.gz'}: not a whole gzip stream" in capsys.readouterr().err
    os.remove(data / "broken.txt.gz")
    with pytest.raises(SystemExit):
        run_prepare("--data", data, "--out", out, "--vocab-size", 300, "--workers", 1)
    said = capsys.readouterr()
    assert "bad.txt: line 2: not valid UTF-8 at byte 14" in said.err and "--errors replace" in said.err
    assert "empty.txt (empty)" in said.out and "notes.md (not *.txt or" in said.out
    os.remove(data / "bad.txt")
    run_prepare("--data", data, "--out", out, "--vocab-size", 300, "--workers", 1)
    with pytest.raises(SystemExit):
        run_prepare("--data", data, "--out", out, "--vocab-size", 400, "--workers", 1)
    assert "another tokenizer" in capsys.readouterr().err
    for argv, message in [
        (["--out", out, "--workers", 0], "--workers: must be an integer >= 1"),
        (["--out", data / "empty.txt"], f"--out: {data / 'empty.txt'} is a file"),
        (["--out", tmp_path / "y", "--tokenizer", tmp_path], f"--tokenizer: {tmp_path}: no tokenizer here"),
        (
            ["--out", tmp_path / "y", "--tokenizer", out / "tokenizer", "--vocab-size", 500],
            "--vocab-size is for a tokenizer trained here",
        ),
        (
            ["--out", tmp_path / "y", "--gpt1-tokenizer", tmp_path, "--tokenizer-sample", 9],
            "--tokenizer-sample is for a tokenizer",
        ),
        (["--out", ""], "--out: must be a path, not empty"),
    ]:
        with pytest.raises(SystemExit):
            run_prepare("--data", data, *argv)
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_prepare("--data", tmp_path / "nothing", "--out", tmp_path / "x")
    assert "no such file or folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_prepare("--data", "", "--out", tmp_path / "x")
    assert "--data: must be a path, not empty (an unset shell variable?)" in capsys.readouterr().err
    shard = next((out / "shards").glob("*.bin"))
    shard.write_bytes(shard.read_bytes()[:-2] + b"\x00\x00")  # damaged, same size
    with pytest.raises(SystemExit) as stop:  # a run that reads it: one line, before its first step
        pretrain.main(
            pretrain_argv(out, tmp_path / "run", "--steps", "1", "--eval-windows", "50", size=ON_DATASET)
        )
    assert f"{shard}: damaged (its ids do not match the manifest's SHA-256)" in str(stop.value.code)
    assert not (tmp_path / "run" / "checkpoints").exists()
    capsys.readouterr()
    run_prepare("--data", data, "--out", out, "--vocab-size", 300, "--workers", 1)
    assert f"{shard.stem}.bin: damaged" in capsys.readouterr().out
    os.remove(shard)
    with pytest.raises(ValueError, match=f"{shard}: missing; run python -m train.prepare again"):
        dataset.Dataset(str(out))


def test_text_given_to_pretrain_is_prepared_once_and_reused(corpus, tmp_path, capsys, monkeypatch):
    """pretrain --data <text> prepares it into the cache (trained tokenizer and ids), a second run
    reuses both; a corpus of one file holds out the end of its tokens; an unwritable or full cache
    is a warning, and an empty TINYGPT_CACHE is no cache named."""
    argv = ["--data", str(corpus), "--steps", "1", *SMALLER]
    monkeypatch.setenv("TQDM_DISABLE", "1")
    pretrain.main([*argv, "--out", str(tmp_path / "a")])
    first = capsys.readouterr().out
    assert "merging" in first and "less than a window" in first
    pretrain.main([*argv, "--out", str(tmp_path / "b")])
    second = capsys.readouterr().out
    assert "merging" not in second and "up to date" in second
    assert re.search(r"prepared in (.+)\)", first)[1] == re.search(r"prepared in (.+)\)", second)[1]
    assert (tmp_path / "a" / "tokenizer" / "vocab.json").read_bytes() == (
        tmp_path / "b" / "tokenizer" / "vocab.json"
    ).read_bytes()
    (tmp_path / "a file").write_text("not a folder")
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "a file"))
    pretrain.main([*argv, "--out", str(tmp_path / "c")])
    assert (
        "cannot prepare the text there (Not a directory); using a temporary folder" in capsys.readouterr().err
    )
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "full"))
    real_write = plan.write_records

    def full_disk(folder, *args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(folder, plan.RECORDS))

    with mock.patch.object(plan, "write_records", side_effect=full_disk):
        with pytest.raises(SystemExit):  # the temporary folder is as full: one line, status 1
            pretrain.main([*argv, "--out", str(tmp_path / "d")])
    assert (
        "cannot prepare the text there (No space left on device); using a temporary folder"
        in capsys.readouterr().err
    )
    monkeypatch.setattr(plan, "write_records", real_write)
    monkeypatch.setenv("TINYGPT_CACHE", "")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    pretrain.main([*argv, "--out", str(tmp_path / "e")])
    assert (tmp_path / "home" / ".cache" / "tinygpt" / "datasets").is_dir() and not (
        tmp_path / "datasets"
    ).exists()


def test_a_full_disk_names_out_and_a_file_that_changes_is_named(tmp_path, capsys, monkeypatch):
    data = corpus_of(tmp_path / "text", files=4)
    out = tmp_path / "set"
    real_open = open

    def full_disk(path, mode="r", *args, **kwargs):
        if ".partial-" in str(path) and str(path).endswith(f"{os.getpid()}") and "/shards/" in str(path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return real_open(path, mode, *args, **kwargs)

    with mock.patch("builtins.open", full_disk), pytest.raises(SystemExit) as stop:
        run_prepare("--data", data, "--out", out, "--vocab-size", 300, "--workers", 1)
    assert stop.value.code == 1
    assert re.search(
        r"error: --out: .*/shards/[0-9a-f]{32}\.bin\.partial-\d+: No space left on device",
        capsys.readouterr().err,
    )
    assert not list((out / "shards").glob("*.idx")) and not (out / dataset.MANIFEST).exists()

    encode = prepare.encode

    def edited_meanwhile(*args):
        result = encode(*args)
        with real_open(data / "01.txt", "a") as file:
            file.write("One more line.\n")
        return result

    monkeypatch.setattr(prepare, "encode", edited_meanwhile)
    with pytest.raises(SystemExit):
        run_prepare("--data", data, "--out", out, "--vocab-size", 300, "--workers", 1)
    assert (
        f"{data / '01.txt'}: changed while it was prepared; run the same command again"
        in capsys.readouterr().err
    )
    monkeypatch.setattr(prepare, "encode", encode)
    monkeypatch.setattr(workers, "run_tasks", mock.Mock(side_effect=ChildProcessError("a worker died")))
    with pytest.raises(SystemExit) as stop:
        run_prepare("--data", data, "--out", out, "--vocab-size", 300, "--workers", 1)
    assert stop.value.code == "python -m train.prepare: error: a worker died"  # status 1, not a usage error
    monkeypatch.undo()
    run_prepare("--data", data, "--out", out, "--vocab-size", 300, "--workers", 1)
    tokenizer = BPETokenizer.load(out / "tokenizer")
    assert documents_of(out)[1][-5:] == tokenizer.encode((data / "01.txt").read_text())[-5:]


def test_what_prepare_trusts_it_checks(tmp_path, capsys):
    """A file edited to the same size is read again (its times changed); a touched one keeps its
    ids; a swapped tokenizer/ is made again, not reused; a wrong digest in sources.jsonl makes every
    file be read again; --verify hashes them all; --tokenizer-sample takes about that many bytes."""
    data = corpus_of(tmp_path / "text", files=20)
    out = tmp_path / "set"
    run_prepare("--data", data, "--out", out, "--vocab-size", 300, "--workers", 1)
    digest = dataset.Dataset(str(out)).digest
    os.utime(data / "00.txt")  # touched, not changed: the same data to a run
    run_prepare("--data", data, "--out", out, "--vocab-size", 300, "--workers", 1)
    assert dataset.Dataset(str(out)).digest == digest
    path = data / "03.txt"
    text = path.read_text(encoding="utf-8").replace("cat", "dog")
    path.write_text(text, encoding="utf-8")
    run_prepare("--data", data, "--out", out, "--vocab-size", 300, "--workers", 1)
    tokenizer = BPETokenizer.load(out / "tokenizer")
    assert documents_of(out)[3] == [tokenizer.special_tokens["_start_"], *tokenizer.encode(text)]

    run_prepare("--data", data, "--out", tmp_path / "other", "--vocab-size", 280, "--workers", 1)
    shutil.rmtree(out / "tokenizer")
    shutil.copytree(tmp_path / "other" / "tokenizer", out / "tokenizer")
    capsys.readouterr()
    run_prepare("--data", data, "--out", out, "--vocab-size", 300, "--workers", 1)
    assert "not the tokenizer prepare saved there; making it again" in capsys.readouterr().out
    assert BPETokenizer.load(out / "tokenizer").vocab_size == 300

    records = (
        (out / plan.RECORDS)
        .read_text()
        .replace(json.loads((out / plan.RECORDS).read_text().splitlines()[0])["sha256"], "0" * 64)
    )
    (out / plan.RECORDS).write_text(records)
    capsys.readouterr()
    run_prepare("--data", data, "--out", out, "--vocab-size", 300, "--workers", 1)
    assert "sources.jsonl: not whole; every file is read again" in capsys.readouterr().out
    assert "0" * 64 not in (out / plan.RECORDS).read_text()
    run_prepare("--data", data, "--out", out, "--vocab-size", 300, "--workers", 1, "--verify")
    assert re.search(r"reading: 0\.\d of", capsys.readouterr().out)  # every file hashed again

    total = sum(p.stat().st_size for p in data.glob("*.txt"))
    run_prepare(
        "--data", data, "--out", tmp_path / "s", "--vocab-size", 300, "--tokenizer-sample", total // 4
    )
    sampled = int(re.search(r"on a sample: ([\d,]+) of", capsys.readouterr().out)[1].replace(",", ""))
    assert total // 4 <= sampled < total // 4 + total // 20  # one file more at the most


def test_prepare_writes_and_removes_only_its_own_files(tmp_path, capsys):
    data = corpus_of(tmp_path / "text", files=3)
    out = tmp_path / "set"
    run_prepare("--data", data, "--out", out, "--vocab-size", 300, "--workers", 1)
    for planted in ("README", "shards/notes.txt", "tokenizer/mine.json", "work/x"):
        (out / planted).parent.mkdir(exist_ok=True)
        (out / planted).write_text("the user's")
        for extra in ([], ["--overwrite"]):
            with pytest.raises(SystemExit):
                run_prepare("--data", data, "--out", out, "--vocab-size", 300, *extra)
            assert (
                f"--out: {out} holds {out / planted}, which prepare did not write" in capsys.readouterr().err
            )
            assert (out / planted).read_text() == "the user's"
        os.remove(out / planted)
    run_prepare("--data", data, "--out", out, "--vocab-size", 280, "--workers", 1, "--overwrite")
    assert BPETokenizer.load(out / "tokenizer").vocab_size == 280 and not (out / "work").exists()


def test_only_corpus_is_read_and_a_dataset_is_taken_as_one(tmp_path, capsys):
    data = corpus_of(tmp_path / "text", files=3)
    out = data / "prepared"  # a dataset below the corpus: never read as text
    run_prepare("--data", data, "--out", tmp_path / "set", "--vocab-size", 300, "--workers", 1)
    shutil.copytree(tmp_path / "set", out)
    run_prepare("--data", data, "--out", tmp_path / "again", "--vocab-size", 300, "--workers", 1)
    assert f"not read: {out} (a dataset train.prepare wrote)" in capsys.readouterr().out
    assert len(documents_of(tmp_path / "again")) == 3
    for argv, message in [
        ((tmp_path / "set",), f"--data: {tmp_path / 'set'} is a dataset train.prepare wrote: train on it"),
    ]:
        with pytest.raises(SystemExit):
            run_prepare("--data", *argv, "--out", tmp_path / "x")
        assert message in capsys.readouterr().err
    run = ["--out", str(tmp_path / "run"), "--steps", "1", *ON_DATASET]
    for data_argv, message in [
        ([tmp_path / "set", data / "00.txt"], "is a dataset: give it alone"),
        (
            [tmp_path / "set" / "manifest.json"],
            f"lies in the dataset {tmp_path / 'set'}: give the folder",
        ),
    ]:
        with pytest.raises(SystemExit):
            pretrain.main(["--data", *map(str, data_argv), *run])
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        pretrain.main(["--data", str(tmp_path / "set"), *run, "--encoding", "latin-1"])
    assert "--encoding: " in capsys.readouterr().err
    os.remove(tmp_path / "set" / dataset.MANIFEST)
    with pytest.raises(SystemExit):
        pretrain.main(["--data", str(tmp_path / "set"), *run])
    assert "train.prepare did not finish this dataset; run it again to go on" in capsys.readouterr().err


def test_a_run_reading_a_dataset_keeps_prepare_from_changing_it(tmp_path, capsys):
    data = corpus_of(tmp_path / "text", files=3)
    out = tmp_path / "set"
    run_prepare("--data", data, "--out", out, "--vocab-size", 300, "--workers", 1)
    reader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from train import dataset; d = dataset.Dataset({str(out)!r}); print('open', flush=1); input()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert reader.stdout.readline() == "open\n"
        run_prepare("--data", data, "--out", out, "--vocab-size", 300, "--workers", 1)  # nothing to change
        assert "up to date" in capsys.readouterr().out
        with pytest.raises(SystemExit):
            run_prepare("--data", data, "--out", out, "--vocab-size", 300, "--overwrite")
        err = capsys.readouterr().err
        assert (
            f"--out: {out}: a run reads this dataset (process {reader.pid}: " in err
            and "dataset.Dataset" in err
        )
    finally:
        reader.communicate("")
    run_prepare("--data", data, "--out", out, "--vocab-size", 300, "--workers", 1, "--overwrite")


def test_perplexity_reads_text_and_not_a_dataset(tmp_path, capsys, base):
    data = corpus_of(tmp_path / "text", files=2, lines=20)
    argv = ["perplexity", "--run", str(base[0]), "--device", "cpu"]
    evaluate.main(
        [*argv, "--data", str(data / "00.txt"), str(data / "01.txt"), "--json", str(tmp_path / "files.json")]
    )
    run_prepare("--data", data, "--out", tmp_path / "set", "--vocab-size", 300, "--workers", 1)
    shutil.copytree(tmp_path / "set", data / "set")
    evaluate.main([*argv, "--data", str(data), "--json", str(tmp_path / "folder.json")])
    figures = [json.loads((tmp_path / name).read_text()) for name in ("files.json", "folder.json")]
    assert figures[0]["tokens"] == figures[1]["tokens"]  # the dataset's tokenizer/*.txt not read
    with pytest.raises(SystemExit):
        evaluate.main([*argv, "--data", str(data / "set")])
    assert "a dataset train.prepare wrote, not a corpus" in capsys.readouterr().err
