"""Text that is not UTF-8, and CRLF line ends, through the command lines: every file that does not
decode is named with the flags that read it (--encoding, --errors), which a run keeps as its own
settings; line ends are read as "\\n"."""

import json
import re

import numpy as np
import pytest

from tinygpt.tokenizer import load_tokenizer
from train import dataset, evaluate, finetune, pretrain

from .runs import pretrain_argv, stopped, tiny_run


def usage_error(capsys, main, argv):
    """The message of a usage error (exit status 2), all its lines."""
    code, err = stopped(capsys, main, argv)
    assert code == 2
    return err


@pytest.fixture
def books(corpus, tmp_path):
    """A folder of three books cut from the corpus: two in Latin-1 (an "é" in each), one in UTF-8
    with CRLF line ends. Returns (folder, the Latin-1 files)."""
    folder = tmp_path / "books"
    folder.mkdir()
    sentences = corpus.read_text(encoding="utf-8").split(". ")
    third = len(sentences) // 3
    for name, part in [("a.txt", 0), ("b.txt", 1), ("c.txt", 2)]:
        text = ".\n".join(sentences[part * third : (part + 1) * third])
        encoded = (
            text.replace("\n", "\r\n").encode() if name == "b.txt" else f"Café. {text}".encode("latin-1")
        )
        (folder / name).write_bytes(encoded)
    return folder, [folder / "a.txt", folder / "c.txt"]


def corpus_read(capsys, run_dir):
    """The text a run read, as the dataset it printed it prepared decodes it."""
    prepared = dataset.Dataset(re.search(r"tokens \(prepared in (.+)\)", capsys.readouterr().out)[1])
    ids = [*np.asarray(prepared.train).tolist(), *np.asarray(prepared.val).tolist()]
    return load_tokenizer(run_dir / "tokenizer").decode(ids)


def test_pretrain_names_every_file_that_does_not_decode_and_reads_it_as_told(books, tmp_path, capsys):
    folder, latin1 = books
    out = tmp_path / "run"
    argv = pretrain_argv(folder, out, "--steps", "2", "--eval-every", "2")
    error = usage_error(capsys, pretrain.main, argv)
    for path in latin1:
        assert f"{path}: line 1: not valid UTF-8 at byte 3" in error
    assert "convert them, or pass --errors replace (bad bytes become U+FFFD) or --encoding latin-1" in error
    assert not out.exists()

    pretrain.main([*argv, "--encoding", "latin-1"])
    text = corpus_read(capsys, out)
    assert "Café" in text and "\r" not in text and "\ufffd" not in text
    settings = json.loads((out / "config.json").read_text())["settings"]
    assert (settings["encoding"], settings["errors"]) == ("iso8859-1", "strict")

    # a resume reads the data as the run did; another encoding would change the run
    pretrain.main(["--resume", str(out), "--steps", "3", "--device", "cpu"])
    assert "tokens (prepared in" in capsys.readouterr().out
    error = usage_error(capsys, pretrain.main, ["--resume", str(out), "--steps", "4", "--encoding", "utf8"])
    assert "--encoding utf-8 (the run's: iso8859-1) would change the run" in error

    pretrain.main([*argv, "--errors", "replace", "--out", str(tmp_path / "replaced")])
    assert "Caf\ufffd" in corpus_read(capsys, tmp_path / "replaced")


def test_evaluate_perplexity_and_zeroshot_read_latin1_with_encoding(books, tmp_path, capsys):
    folder, latin1 = books
    run_dir = tmp_path / "tiny"
    tiny_run(run_dir)
    perplexity = ["perplexity", "--run", str(run_dir), "--data", str(folder), "--device", "cpu"]
    error = usage_error(capsys, evaluate.main, perplexity)
    assert all(str(path) in error for path in latin1) and "--errors replace" in error
    assert evaluate.main([*perplexity, "--encoding", "latin-1", "--max-tokens", "40"])["tokens"] == 39

    choices = tmp_path / "choices.jsonl"
    rows = [{"context": "Un café", "choices": ["noir.", "au lait."], "label": 1}] * 2
    choices.write_bytes("\r\n".join(json.dumps(row, ensure_ascii=False) for row in rows).encode("latin-1"))
    zeroshot = [
        "zeroshot",
        "--run",
        str(run_dir),
        "--task",
        "jsonl",
        "--data",
        str(choices),
        "--device",
        "cpu",
    ]
    error = usage_error(capsys, evaluate.main, zeroshot)
    assert f"--data: {choices}: line 1: not valid UTF-8 at byte 19" in error and "--encoding latin-1" in error
    assert evaluate.main([*zeroshot, "--errors", "replace"])["examples"] == 2


def test_finetune_names_the_flags_for_a_task_file_that_does_not_decode(tmp_path, capsys):
    tiny_run(tmp_path / "pretrained")
    train = tmp_path / "train.jsonl"
    train.write_bytes('{"text": "café", "label": "a"}\n'.encode("latin-1"))
    argv = ["--init-from", str(tmp_path / "pretrained"), "--task", "jsonl", "--train", str(train)]
    error = usage_error(capsys, finetune.main, [*argv, "--dev", str(train), "--out", str(tmp_path / "run")])
    assert f"--train: {train}: line 1: not valid UTF-8 at byte 13" in error and "--errors replace" in error


@pytest.mark.parametrize("name", ["klingon", "base64"])
def test_an_encoding_that_is_not_a_text_encoding_is_a_usage_error(capsys, name):
    error = usage_error(capsys, pretrain.main, ["--encoding", name])
    assert f"argument --encoding: must be a Python text encoding, got '{name}'" in error
