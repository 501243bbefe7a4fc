"""What the training modules' tests share: a tiny run folder, as the training modules write it, for
the tests of the modules that read one; a small pretraining run's flags; processes of this tree."""

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
from tinygpt.tokenizer import BPETokenizer
from train import pretrain
from train.checkpoint import save_checkpoint
from train.run_folder import read_metrics, save_tokenizer, write_config

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


def pretrain_argv(corpus, out, *extra, size=SMALL):
    """The flags of a pretraining run of `size` (SMALL) on `corpus` into `out`, then `extra`."""
    return ["--data", str(corpus), "--out", str(out), *size, *extra]


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
