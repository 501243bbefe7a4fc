"""What the training modules' tests share: a tiny run folder, as the training modules write it, for
the tests of the modules that read one; a small pretraining run's flags; processes of this tree."""

import os
import subprocess
import sys
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


def pretrain_into(corpus, out, *extra):
    """python -m train.pretrain, in this process: a SMALL run on `corpus` into `out`."""
    pretrain.main(["--data", str(corpus), "--out", str(out), *SMALL, *extra])


def losses(run_dir):
    """(step, training loss) of each step logged in a run folder."""
    return [(m["step"], m["loss"]) for m in read_metrics(run_dir) if "loss" in m]


def python(*args, **options):
    """A Python process of this tree (python ARGS), its output piped."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, *args], cwd=ROOT, env=env, **{"stdout": subprocess.PIPE, **options}
    )


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
    write_config(folder, config, {"preset": "test"})
    save_tokenizer(tokenizer, folder)
    return model.eval(), tokenizer


def stopped(capsys, main, argv):
    """(exit status, stderr) of main(argv), which must stop it with SystemExit."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    return stop.value.code, capsys.readouterr().err
