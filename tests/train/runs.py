"""What the training modules' tests share: a tiny run folder, as the training modules write it, for
the tests of the modules that read one; a small pretraining run's flags; processes of this tree; a
small pre-trained run, jsonl data and a fine-tune's flags; a model and its optimizer after one step;
a snapshot of a folder's files; a job of ranks under mpiexec."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import autograd as ag
from autograd.optim import Adam
from tinygpt import GPT, GPTConfig
from tinygpt.heads import make_head
from tinygpt.tokenizer import BPETokenizer
from train import finetune, pretrain
from train.checkpoint import save_checkpoint
from train.run_folder import read_config, read_metrics, save_tokenizer, write_config

SENTENCES = [
    "the cat sat on the mat.",
    "the dog sat on the log.",
    "a cat and a dog met on a mat.",
    "café au lait, s'il vous plaît.",
    "the end of the story is near.",
]
ROOT = Path(__file__).parents[2]
# a pretraining run small enough for a test on the CPU
SMALL = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--n-ctx", "16", "--vocab-size", "300"]
SMALL += ["--batch-size", "4", "--eval-windows", "8", "--sample-tokens", "4", "--device", "cpu"]
# smaller still (16 wide, 2 windows a step, no sample), for the tests of user errors and run folders
SMALLER = ["--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--n-ctx", "16", "--batch-size", "2"]
SMALLER += ["--vocab-size", "300", "--device", "cpu", "--eval-windows", "1", "--sample-tokens", "0"]

TIMEOUT = 240  # seconds; an mpiexec job still running then has hung
TEXT = "The cat sat on the mat and the dog sat on the log. " * 40  # the corpus of the base fixture's run
CONFIG = GPTConfig(vocab_size=11, n_ctx=6, n_embd=8, n_layer=1, n_head=2)  # trained_pair's GPT
# the class of a text is the set its words come from
WORD_SETS = ("cat mat sat hat".split(), "dog log fog end".split())
LABELS = ("pos", "neg")
FAST = ["--lr", "1e-2", "--batch-size", "16", "--device", "cpu"]


def pretrain_argv(corpus, out, *extra, size=SMALL):
    """The flags of a pretraining run of `size` (SMALL) on `corpus` into `out`, then `extra` (with a
    tokenizer given there, no --vocab-size: pretrain refuses it beside one)."""
    given = {"--tokenizer", "--gpt1-tokenizer"} & set(map(str, extra))
    return ["--data", str(corpus), "--out", str(out), *(for_dataset(size) if given else size), *extra]


def for_dataset(size):
    """A run's flags on a prepared dataset, which holds its tokenizer: `size` without --vocab-size."""
    at = size.index("--vocab-size")
    return size[:at] + size[at + 2 :]


def one_step_argv(corpus, out, *extra):
    """The flags of a one-step SMALLER pretraining run on `corpus` into `out`, then `extra`."""
    return pretrain_argv(corpus, out, "--steps", "1", *extra, size=SMALLER)


def pretrain_into(corpus, out, *extra):
    """python -m train.pretrain, in this process: a SMALL run on `corpus` into `out`."""
    pretrain.main(pretrain_argv(corpus, out, *extra))


def copy_of_run(base, tmp_path, monkeypatch):
    """A copy of the run of `base` (run folder, corpus, token cache) in tmp_path, on its token cache."""
    monkeypatch.setenv("TINYGPT_CACHE", str(base[2]))
    shutil.copytree(base[0], tmp_path / "run")
    return tmp_path / "run"


def losses(run_dir):
    """(step, training loss) of each step logged in a run folder."""
    return [(m["step"], m["loss"]) for m in read_metrics(run_dir) if "loss" in m]


def ctrl_c_as_in_a_terminal():
    """SIGINT's default action, for a child process: pytest run as a shell's background job ignores
    SIGINT, and its children would inherit that and carry on through a test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def python(*args, **options):
    """A Python process of this tree (python ARGS), its output piped, Ctrl-C stopping it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    options = {"stdout": subprocess.PIPE, "preexec_fn": ctrl_c_as_in_a_terminal, **options}
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, **options)


def wait_until_logged(out):
    """Wait until the run into `out` has logged 3 lines to metrics.jsonl (3 steps, with --log-every
    1), or for 60 s."""
    deadline = time.time() + 60
    while len(read_metrics(out)) < 3 and time.time() < deadline:
        time.sleep(0.1)


def ctrl_c(out, *args):
    """The output of python ARGS, a training run into `out`, sent SIGINT (Ctrl-C) once it has logged
    3 lines; it must end with status 130."""
    process = python(*args, stderr=subprocess.STDOUT, text=True)
    wait_until_logged(out)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 130, output
    return output


def finished(*args, timeout=120):
    """python ARGS of this tree run to its end: its CompletedProcess, the output as text."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def tiny_run(folder, n_ctx=16, steps=(1, 2)):
    """A run folder as the training modules write it: a BPE tokenizer trained on SENTENCES, a
    one-layer GPT with random weights, config.json, and a checkpoint for each of `steps` (the
    newest holds the model returned). Returns (model, tokenizer)."""
    os.makedirs(folder, exist_ok=True)
    tokenizer = BPETokenizer.train(SENTENCES, vocab_size=300)
    ag.manual_seed(0)
    config = GPTConfig(vocab_size=tokenizer.vocab_size, n_ctx=n_ctx, n_embd=16, n_layer=1, n_head=2)
    model = GPT(config)
    write_config(folder, config, {"preset": "test"})
    save_tokenizer(tokenizer, folder)
    rng = np.random.default_rng(0)
    for step in steps:  # a different model at each step, so picking the newest checkpoint matters
        model.load_state_dict(
            {
                name: rng.standard_normal(p.shape).astype(p.dtype)
                for name, p in model.named_parameters()
                if p.data.ndim == 2
            },
            strict=False,
        )
        save_checkpoint(folder, step, model, Adam(model.parameters()), {})
    return model.eval(), tokenizer


def stopped(capsys, main, argv):
    """(exit status, stderr) of main(argv), which must stop it with SystemExit."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    return stop.value.code, capsys.readouterr().err


def pretrained_run(folder):
    """A run folder as train.pretrain writes it, with a two-block GPT whose weights are not those
    of a fresh initialisation (non-zero biases, gains other than 1), so re-initialised ones show."""
    tokenizer = BPETokenizer.train([" ".join(words) for words in WORD_SETS] * 5, vocab_size=300)
    ag.manual_seed(123)
    config = GPTConfig(vocab_size=tokenizer.vocab_size, n_ctx=24, n_embd=32, n_layer=2, n_head=4)
    model = GPT(config)
    rng = np.random.default_rng(0)
    model.load_state_dict(
        {
            name: (
                1 + 0.1 * rng.standard_normal(p.shape)
                if ".ln_" in name and name.endswith("weight")
                else 0.01 * rng.standard_normal(p.shape)
            ).astype(np.float32)
            for name, p in model.named_parameters()
            if p.ndim == 1
        },
        strict=False,
    )
    os.makedirs(folder, exist_ok=True)
    write_config(folder, config, {"preset": "test"})
    save_tokenizer(tokenizer, folder)
    save_checkpoint(folder, 100, model, Adam(model.parameters()), {})
    return model, tokenizer


def examples(n, seed, only=None):
    """n texts of 2-6 words, all from one word set; the label names the set."""
    rng = np.random.default_rng(seed)
    rows = []
    for word_set in rng.integers(0, 2, n) if only is None else [only] * n:
        rows.append(
            {"text": " ".join(rng.choice(WORD_SETS[word_set], rng.integers(2, 7))), "label": LABELS[word_set]}
        )
    return rows


def write_jsonl(path, rows):
    lines = (row if isinstance(row, str) else json.dumps(row) for row in rows)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def finetune_argv(setup, out, *extra):
    """The flags of a FAST fine-tune of the setup's pre-trained run on its jsonl files into `out`,
    then `extra` (made text)."""
    folder, _, _, train, dev = setup
    task = ["--init-from", str(folder / "pretrained"), "--task", "jsonl"]
    return [*task, "--train", str(train), "--dev", str(dev), "--out", str(out), *FAST, *map(str, extra)]


def finetune_run(setup, out, *extra):
    finetune.main(finetune_argv(setup, out, *extra))
    return out


def finetune_head(run_dir):
    """An empty head of the run's shape, for read_weights (which needs to know it has a head)."""
    config, _ = read_config(run_dir)
    return make_head("classification", GPT(config), 2)


def trained_pair(seed=0):
    """A model and its optimizer after one step, so the moments are not zero."""
    ag.manual_seed(seed)
    model = GPT(CONFIG)
    optimizer = Adam(model.parameters(), lr=1e-2)
    ids = np.random.default_rng(seed).integers(0, 11, (2, 6))
    ag.functional.cross_entropy(model(ids[:, :-1]), ids[:, 1:]).backward()
    optimizer.step()
    return model, optimizer


def snapshot(folder):
    """{path: bytes} of every file under `folder` but the lock file."""
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != ".lock"}


def run_job(command, env):
    """(return code, output) of a job; one that outlives TIMEOUT is stopped and fails the test."""
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        output, _ = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        process.terminate()  # mpiexec passes it on to every rank
        output, _ = process.communicate()
        pytest.fail(f"the job hung:\n{output[-3000:]}")
    return process.returncode, output
