"""Fixtures of the training modules' tests."""

import os
import shutil
import sys
from pathlib import Path

import pytest

from train import pretrain

from .runs import ROOT, SMALLER, TEXT, TIMEOUT, examples, pretrain_argv, pretrained_run, write_jsonl


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    """A small text file to pretrain on, and a token cache of the test's own."""
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "cache"))
    sentences = [
        f"The {animal} number {i} walked over the {place} and sat down quietly. "
        for i in range(120)
        for animal, place in [("cat", "hill"), ("dog", "bridge")]
    ]
    path = tmp_path / "corpus.txt"
    path.write_text("".join(sentences), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The pre-trained run, and train (128 examples) and dev (64) files."""
    folder = tmp_path_factory.mktemp("data")
    model, tokenizer = pretrained_run(folder / "pretrained")
    train = write_jsonl(folder / "train.jsonl", examples(128, seed=1))
    dev = write_jsonl(folder / "dev.jsonl", examples(64, seed=2))
    return folder, model, tokenizer, train, dev


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """(a pretraining run with checkpoints 1 to 4, its corpus, its token cache)."""
    root = tmp_path_factory.mktemp("integrity")
    (root / "corpus.txt").write_text(TEXT, encoding="utf-8")
    steps = ["--steps", "4", "--save-every", "1", "--keep-checkpoints", "0", "--log-every", "1"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TINYGPT_CACHE", str(root / "cache"))
        pretrain.main(pretrain_argv(root / "corpus.txt", root / "run", *steps, size=SMALLER))
    return root / "run", root / "corpus.txt", root / "cache"


@pytest.fixture
def mpiexec(tmp_path):
    """The command that starts n ranks: the mpiexec installed beside this Python (pip install
    'tinygpt[mpi]'), else the first on PATH. Each rank uses one thread."""
    pytest.importorskip("mpi4py", reason="needs mpi4py: pip install 'tinygpt[mpi]'")
    beside = Path(sys.executable).parent / "mpiexec"
    found = str(beside) if beside.exists() else shutil.which("mpiexec")
    if found is None:
        pytest.skip("no mpiexec: pip install 'tinygpt[mpi]'")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "TINYGPT_CACHE": str(tmp_path / "cache"),
        "MPIEXEC_TIMEOUT": str(TIMEOUT),
    }  # MPICH's launcher ends a job that runs longer

    def command(n, *ranks):
        """[mpiexec -n n python args...], or one such part per argument list in `ranks` (ranks
        started with different arguments), n // len(ranks) ranks each."""
        parts = []
        for args in ranks:
            parts += [":"] * bool(parts) + ["-n", str(n // len(ranks)), sys.executable, *args]
        return [found, *parts]

    command.env = env
    return command
