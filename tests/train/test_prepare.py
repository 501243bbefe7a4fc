"""train.prepare: the ids of a prepared dataset are each document's encoding, whatever the chunks,
pieces and workers; a killed prepare goes on to the same bytes; a new file moves no other
document; bad input is one line."""

import errno
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
from train import corpus, dataset, prepare, pretrain, workers

from .runs import SMALLER, pretrain_argv

GPT1_FILES = Path(__file__).parents[2].parent / "shared" / "data" / "gpt1-bpe"
TEXT = ["The cat sat on the mat.\nIt was warm; the dog & cat slept.\n\nA new day <b> &amp; more.\n"]
BPE = BPETokenizer.train(TEXT * 3, 300)
NORMALIZED = BPETokenizer.train(TEXT * 3, 300, normalizer="gpt1")
TOKENIZERS = [BPE, NORMALIZED] + ([GPT1Tokenizer.from_folder(GPT1_FILES)] if GPT1_FILES.is_dir() else [])
PIECES = [
    "a",
    "Z",
    ".",
    ",",
    "'",
    "!",
    "<",
    ">",
    "&amp;",
    " ",
    "  ",
    "\t",
    "\n",
    "\n\n",
    "\r\n",
    "\r",
    "é",
    "’",
]
PIECES += ["It's", "don't", "\u00a0", "…", "日本", "😀", "Mr.", "_start_", "--", "..."]
documents = st.lists(st.sampled_from(PIECES), min_size=1, max_size=40).map("".join)


def prepared_ids(folder):
    """{path: [the ids of each document]} of a prepared dataset, read through its manifest."""
    data = dataset.Dataset(str(folder))
    return {
        source["path"]: [
            np.concatenate([data.shard(key)[start:end] for key, start, end in document["ranges"]]).tolist()
            for document in source["documents"]
        ]
        for source in data.manifest["sources"]
    }


def whole_documents(path, paragraphs):
    """The documents of a file, read whole: as prepare defines them."""
    text = Path(path).read_bytes().decode("utf-8").removeprefix("\ufeff")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return [part for part in corpus.PARAGRAPH_BREAK.split(text) if part] if paragraphs else [text]


def run_prepare(*argv):
    with mock.patch.dict(os.environ, {"TQDM_DISABLE": "1"}):
        prepare.main([*map(str, argv)])


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    files=st.lists(st.lists(documents, min_size=1, max_size=4), min_size=1, max_size=3),
    tokenizer=st.sampled_from(TOKENIZERS),
    paragraphs=st.booleans(),
    chunk_bytes=st.integers(1, 64),
    piece_bytes=st.integers(1, 16),
    bom=st.booleans(),
)
def test_the_ids_of_each_document_are_its_encoding_however_it_is_cut(
    tmp_path_factory, files, tokenizer, paragraphs, chunk_bytes, piece_bytes, bom
):
    folder = tmp_path_factory.mktemp("prepare")
    tokenizer_dir = folder / "tokenizer"
    tokenizer.save(tokenizer_dir)
    flag = "--gpt1-tokenizer" if isinstance(tokenizer, GPT1Tokenizer) else "--tokenizer"
    for number, texts in enumerate(files):
        text = ("\n\n" if paragraphs else "").join(texts)
        (folder / f"{number}.txt").write_bytes(("\ufeff" if bom else "").encode() + text.encode())
    read = [str(path) for path in sorted(folder.glob("*.txt")) if path.read_bytes().strip()]
    assume(read)  # files of nothing but ASCII whitespace are named and not read
    with (
        mock.patch.object(corpus, "CHUNK_BYTES", chunk_bytes),
        mock.patch.object(corpus, "PIECE_BYTES", piece_bytes),
    ):
        run_prepare(
            "--data",
            *sorted(folder.glob("*.txt")),
            "--out",
            folder / "data",
            flag,
            tokenizer_dir,
            "--workers",
            1,
            "--documents",
            "paragraphs" if paragraphs else "files",
        )
    start = [tokenizer.special_tokens["_start_"]]
    assert sorted(prepared_ids(folder / "data")) == read
    for path, ids in prepared_ids(folder / "data").items():
        expected = [start + tokenizer.encode(text) for text in whole_documents(path, paragraphs)]
        assert ids == expected, path


def test_plan_cuts_a_file_only_between_two_visible_characters(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"ab\ncd\n ef\n\nhi\xc3\xa9\njk\nlm")  # cuts before the 1st and last "\n"
    with mock.patch.object(corpus, "CHUNK_BYTES", 1):
        _, chunks, _ = corpus.plan_chunks(path, "utf-8")
    assert [(start, end) for start, end, _ in chunks] == [(0, 2), (2, 18), (18, 21)]
    with mock.patch.object(corpus, "CHUNK_BYTES", 1):
        _, chunks, _ = corpus.plan_chunks(
            path, "utf-16", errors="ignore"
        )  # "\n" may sit inside a character: never cut
    assert [(start, end) for start, end, _ in chunks] == [(0, 21)]


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
        "-m",
        "train.prepare",
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
    # Small chunks, pieces small enough that two workers are started (they read 1 MB pieces), and
    # workers that make way for fresh ones after a third of the corpus.
    small = {"CHUNK_BYTES": 4000, "PIECE_BYTES": 1000}
    with mock.patch.multiple(corpus, **small), mock.patch.object(workers, "WORKER_BYTES", 60_000):
        run_prepare("--data", data, "--out", tmp_path / "one", "--vocab-size", 300, "--workers", 1)
        run_prepare("--data", data, "--out", tmp_path / "two", "--vocab-size", 300, "--workers", 2)
    one = folder_bytes(tmp_path / "one")
    assert one == folder_bytes(tmp_path / "two")
    texts = [path.read_text(encoding="utf-8") for path in sorted(data.glob("*.txt"))]
    BPETokenizer.train(texts, 300).save(tmp_path / "whole")  # words counted at once, not by chunks
    assert one["tokenizer/merges.txt"] == (tmp_path / "whole" / "merges.txt").read_bytes()
    assert sum(name.endswith(".bin") for name in one) > 12  # files cut into several chunks
    out = capsys.readouterr().out
    assert "counting words" in out and "encoding" in out and "val:" in out
    pretrain.main(pretrain_argv(tmp_path / "one", tmp_path / "run", "--steps", "2", size=SMALLER))
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


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL])
def test_a_killed_prepare_goes_on_to_the_same_bytes(tmp_path, how):
    data = corpus_of(tmp_path / "text", files=100)
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


def test_a_new_file_moves_no_other_document_and_only_it_is_encoded(tmp_path, capsys):
    data = corpus_of(tmp_path / "text", files=30)
    run_prepare("--data", data, "--out", tmp_path / "set", "--vocab-size", 300, "--workers", 1)
    before = dataset.read_manifest(tmp_path / "set")
    shards_before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "set" / "shards").iterdir()}
    (data / "new.txt").write_text("A new file, with its own words.\n", encoding="utf-8")
    capsys.readouterr()
    run_prepare("--data", data, "--out", tmp_path / "set", "--vocab-size", 300, "--workers", 1)
    assert "encoding: 0.0 of 0.0 MB" in capsys.readouterr().out  # 33 bytes
    after = dataset.read_manifest(tmp_path / "set")
    splits = {s["path"]: [d["split"] for d in s["documents"]] for s in after["sources"]}
    assert {
        s["path"]: [d["split"] for d in s["documents"]] for s in before["sources"]
    }.items() <= splits.items()
    kept = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "set" / "shards").iterdir()}
    assert shards_before.items() <= kept.items() and len(kept) == len(shards_before) + 2
    assert {
        s["val"] for s in [{"val": d["split"] == "val"} for s in after["sources"] for d in s["documents"]]
    } == {True, False}


def test_bad_input_is_one_line_naming_what_to_do(tmp_path, capsys):
    data = corpus_of(tmp_path / "text", files=3)
    (data / "bad.txt").write_bytes(b"fine\nline two \xff here\n")
    (data / "empty.txt").write_bytes(b"")
    (data / "notes.md").write_text("skipped")
    out = tmp_path / "set"
    with pytest.raises(SystemExit) as stop:
        run_prepare("--data", data, "--out", out, "--vocab-size", 300, "--workers", 1)
    assert stop.value.code == 2
    said = capsys.readouterr()
    assert "bad.txt: line 2: not valid UTF-8 at byte 14" in said.err and "--errors replace" in said.err
    assert "empty.txt (empty)" in said.out and "notes.md (not *.txt)" in said.out
    os.remove(data / "bad.txt")
    run_prepare("--data", data, "--out", out, "--vocab-size", 300, "--workers", 1)
    with pytest.raises(SystemExit):
        run_prepare("--data", data, "--out", out, "--vocab-size", 400, "--workers", 1)
    assert "another tokenizer" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_prepare("--data", data, "--out", out, "--workers", 0)
    with pytest.raises(SystemExit):
        run_prepare("--data", data, "--out", data / "empty.txt")
    assert "--out: " + str(data / "empty.txt") + " is a file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_prepare("--data", data, "--out", tmp_path / "y", "--tokenizer", tmp_path)
    assert f"--tokenizer: {tmp_path}: no tokenizer here" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_prepare("--data", tmp_path / "nothing", "--out", tmp_path / "x")
    assert "no such file or folder" in capsys.readouterr().err
    shard = next((out / "shards").glob("*.bin"))
    shard.write_bytes(shard.read_bytes()[:-2] + b"\x00\x00")  # damaged, same size
    data_set = dataset.Dataset(str(out))
    with pytest.raises(OSError, match="damaged.*train.prepare again"):
        for key in data_set.manifest["shards"]:
            data_set.shard(key)
    with pytest.raises(SystemExit) as stop:  # a run that reads it: one line
        pretrain.main(
            pretrain_argv(out, tmp_path / "run", "--steps", "1", "--eval-windows", "50", size=SMALLER)
        )
    assert f"{shard}: damaged (its ids do not match the manifest's SHA-256)" in str(stop.value.code)
    capsys.readouterr()
    run_prepare("--data", data, "--out", out, "--vocab-size", 300, "--workers", 1)
    assert f"{shard.name}: damaged" in capsys.readouterr().out
    assert all(dataset.Dataset(str(out)).shard(key) is not None for key in data_set.manifest["shards"])


def test_text_given_to_pretrain_is_prepared_once_and_reused(corpus, tmp_path, capsys, monkeypatch):
    """pretrain --data <text> prepares it into the cache (trained tokenizer and ids), a second run
    reuses both; a corpus of one file holds out the end of its tokens; an unwritable cache is a
    warning."""
    argv = ["--data", str(corpus), "--steps", "1", *SMALLER]
    monkeypatch.setenv("TQDM_DISABLE", "1")
    pretrain.main([*argv, "--out", str(tmp_path / "a")])
    first = capsys.readouterr().out
    assert "merging" in first and "less than a window" in first
    pretrain.main([*argv, "--out", str(tmp_path / "b")])
    second = capsys.readouterr().out
    assert "merging" not in second and "encoding" not in second
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
    assert (tmp_path / "c" / "metrics.jsonl").exists()


def test_a_full_disk_or_a_file_that_changes_is_named_and_the_same_command_goes_on(
    tmp_path, capsys, monkeypatch
):
    data = corpus_of(tmp_path / "text", files=4)
    out = tmp_path / "set"
    real_open = open

    def full_disk(path, mode="r", *args, **kwargs):
        if ".partial-" in str(path) and str(path).endswith(f"{os.getpid()}") and ".bin." in str(path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_open(path, mode, *args, **kwargs)

    with mock.patch("builtins.open", full_disk), pytest.raises(SystemExit):
        run_prepare("--data", data, "--out", out, "--vocab-size", 300, "--workers", 1)
    assert re.search(r"shards/[0-9a-f]{32}\.bin: No space left on device", capsys.readouterr().err)
    assert not list((out / "shards").glob("*.json")) and not (out / dataset.MANIFEST).exists()

    encode = prepare.encode

    def edited_meanwhile(args, records, tokenizer):
        result = encode(args, records, tokenizer)
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
    assert (
        prepared_ids(out)[str(data / "01.txt")][0][-5:]
        == BPETokenizer.load(out / "tokenizer").encode((data / "01.txt").read_text())[-5:]
    )


def test_an_edit_that_keeps_the_size_a_swapped_tokenizer_and_a_sample(tmp_path, capsys):
    """A file edited to the same size is read again (its time changed); a dataset whose tokenizer/
    is not the one its ids came from is refused; --tokenizer-sample takes about that many bytes."""
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
    assert prepared_ids(out)[str(path)] == [[tokenizer.special_tokens["_start_"], *tokenizer.encode(text)]]

    run_prepare("--data", data, "--out", tmp_path / "other", "--vocab-size", 280, "--workers", 1)
    shutil.rmtree(out / "tokenizer")
    shutil.copytree(tmp_path / "other" / "tokenizer", out / "tokenizer")
    with pytest.raises(SystemExit):
        pretrain.main(pretrain_argv(out, tmp_path / "run", "--steps", "1", size=SMALLER))
    assert "is not the tokenizer that encoded the ids" in capsys.readouterr().err

    total = sum(p.stat().st_size for p in data.glob("*.txt"))
    run_prepare(
        "--data", data, "--out", tmp_path / "s", "--vocab-size", 300, "--tokenizer-sample", total // 4
    )
    sampled = int(re.search(r"on a sample: ([\d,]+) of", capsys.readouterr().out)[1].replace(",", ""))
    assert total // 4 <= sampled < total // 4 + total // 20  # one file more at the most


def test_links_are_named_and_not_read_below_a_folder_or_from_a_glob(tmp_path):
    corpus_of(tmp_path / "text", files=2)
    (tmp_path / "text" / "link.txt").symlink_to(tmp_path / "text" / "00.txt")
    for paths in ([tmp_path / "text"], [str(tmp_path / "text" / "*.txt")]):
        files, skipped = corpus.find_sources(paths)
        assert [Path(f).name for f in files] == ["00.txt", "01.txt"]
        assert skipped == [(str(tmp_path / "text" / "link.txt"), "a link")]
