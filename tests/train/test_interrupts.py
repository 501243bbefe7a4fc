"""Interrupts and files: SIGTERM stops a run as Ctrl-C does; a run killed at random moments (SIGKILL,
SIGTERM, SIGINT) resumes to the very bytes of one never stopped; best/ is never deleted before
its replacement is in; a full disk or a read-only folder while fine-tuning is one line."""

import json
import os
import random
import signal
import subprocess
import time

import numpy as np
import pytest

from autograd.optim import Adam
from tinygpt import GPT
from train import checkpoint, finetune, pretrain
from train.checkpoint import checkpoint_steps, load_checkpoint, read_weights
from train.run_folder import read_config, read_metrics

from .runs import finetune_head, finetune_run, pretrain_argv, pretrain_into, python, wait_until_logged

KILL_STEPS = 300  # steps of the run killed again and again, each of them saved


def start(corpus, out, *extra):
    """A pretraining process on the test's corpus into `out`, its output to a file beside it."""
    command = ["-m", "train.pretrain", *extra]
    if not extra or extra[0] != "--resume":
        command += pretrain_argv(corpus, out)
    log = open(out.parent / f"{out.name}.log", "a")
    return python(*command, stdout=log, stderr=subprocess.STDOUT)


def signalled_in_training(corpus, out, number):
    """A long pretraining process into `out`, sent the signal `number` once it has logged 3 steps."""
    process = start(corpus, out, "--steps", "100000", "--log-every", "1", "--save-every", "100000")
    wait_until_logged(out)
    process.send_signal(number)
    return process


def test_sigterm_saves_a_checkpoint_and_exits_143(corpus, tmp_path):
    out = tmp_path / "run"
    process = signalled_in_training(corpus, out, signal.SIGTERM)
    assert process.wait(timeout=30) == 143
    [step] = checkpoint_steps(out)
    assert f"interrupted after step {step} (SIGTERM)" in (tmp_path / "run.log").read_text()


def newest_loads(out):
    """Load the newest checkpoint of `out` into a model and Adam of the run's shape; its step."""
    config, _ = read_config(out)
    model = GPT(config)
    return load_checkpoint(out, model, Adam(model.parameters()))["step"]


# python -m MODULE ARGS (as train/__init__ sees it: argv[0] is "-m" while the package imports), with
# NumPy's C extension held back a second as it imports, and a Ctrl-C there turned into an ImportError,
# as the extension's own initialisation may turn it
PAUSED_IMPORT = """
import importlib.abc, runpy, sys, time
class Pause(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "numpy._core._multiarray_umath":
            print("importing", file=sys.stderr, flush=True)
            try:
                time.sleep(1)
            except KeyboardInterrupt:
                raise ImportError("the C extension did not import") from None
sys.meta_path.insert(0, Pause())
module, sys.argv = sys.argv[1], ["-m", *sys.argv[2:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("module", ["train.pretrain", "train.finetune", "train.evaluate", "train.prepare"])
def test_a_ctrl_c_while_the_modules_import_is_one_line_and_status_130(module):
    """Interrupted before its main begins, while NumPy's C extension imports (where a KeyboardInterrupt
    comes out as a traceback, or as NumPy's message that its install is broken): one line, status 130."""
    process = python("-c", PAUSED_IMPORT, module, "--help", stderr=subprocess.PIPE, text=True)
    assert process.stderr.readline() == "importing\n"
    process.send_signal(signal.SIGINT)
    output, rest = process.communicate(timeout=60)
    assert (rest, output, process.returncode) == ("interrupted\n", "", 130)


def test_a_run_killed_at_random_moments_resumes_to_the_same_bytes(corpus, tmp_path):
    """8 times a process is started (a new run while there is no checkpoint yet, else --resume) and
    sent SIGKILL, SIGTERM or SIGINT after a random time, at startup, in a step or in a save
    (--save-every 1); each time the newest checkpoint loads. Finished, the run's weights, Adam's
    moments, losses and rates are those of a run that was never stopped, bit for bit."""
    steps = ["--steps", str(KILL_STEPS), "--save-every", "1", "--log-every", "1", "--eval-every", "50"]
    pretrain_into(corpus, tmp_path / "reference", *steps)
    out, rng, kills = tmp_path / "killed", random.Random(16), 0
    while kills < 8 and not (checkpoint_steps(out) and checkpoint_steps(out)[-1] == KILL_STEPS):
        resuming = bool(checkpoint_steps(out))
        process = start(corpus, out, *(["--resume", str(out)] if resuming else [*steps, "--overwrite"]))
        if kills % 2:  # at any time from the start, mostly while it starts up
            time.sleep(rng.uniform(0, 0.6))
        else:  # in a step or a save, a little after the first step of this process
            lines = len(read_metrics(out)) if resuming else 0
            while process.poll() is None and len(read_metrics(out)) <= lines:
                time.sleep(0.01)
            time.sleep(rng.uniform(0, 0.1))
        if process.poll() is None:
            process.send_signal((signal.SIGKILL, signal.SIGTERM, signal.SIGINT)[kills % 3])
            kills += 1
        process.wait(timeout=60)
        if checkpoint_steps(out):
            assert newest_loads(out) == checkpoint_steps(out)[-1]
    assert kills >= 6, (out.parent / "killed.log").read_text()[-3000:]
    pretrain.main(["--resume", str(out), "--device", "cpu"])

    assert not [path for path in out.rglob("*") if "partial" in path.name]
    for name in ("model.safetensors", "optimizer.safetensors"):
        last = f"checkpoints/{KILL_STEPS}/{name}"
        assert_same_bytes(out / last, tmp_path / "reference" / last)
    fields = ("step", "loss", "lr", "val_loss")
    assert [{k: m[k] for k in fields if k in m} for m in read_metrics(out)] == [
        {k: m[k] for k in fields if k in m} for m in read_metrics(tmp_path / "reference")
    ]


def assert_same_bytes(path, reference):
    """Fail where two files differ, naming their lengths and the first byte that differs: pytest
    comparing the ~92 KB of bytes themselves would spend minutes in difflib before a report."""
    a, b = path.read_bytes(), reference.read_bytes()
    if a != b:
        at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        pytest.fail(
            f"{path}: {len(a):,} bytes, {reference}: {len(b):,} bytes; first difference at byte {at:,}"
        )


def test_best_is_moved_aside_not_deleted_before_the_new_one_is_in(setup, tmp_path, monkeypatch):
    """A process that dies between moving the old best/ aside and renaming the new one into place
    leaves the old weights, which the next start puts back."""
    out = finetune_run(setup, tmp_path / "run", "--epochs", 1, "--limit-train", 32)
    head = finetune_head(out)
    before = read_weights(out / "best", head)
    real_replace = os.replace

    def crash_on_the_new_best(source, target):
        if "best-partial" in str(source):
            raise KeyboardInterrupt("killed")
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", crash_on_the_new_best)
    for p in head.parameters():
        p.data = p.data + 1
    with pytest.raises(KeyboardInterrupt):
        finetune.save_best(str(out), head, {})
    monkeypatch.setattr(os, "replace", real_replace)
    checkpoint.remove_partials(out)
    after = read_weights(out / "best", finetune_head(out))
    assert all(np.array_equal(before[name], after[name]) for name in before)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []


@pytest.mark.parametrize(
    "error, named",
    [
        (OSError(28, "No space left on device"), "{out}: No space left on device; the run stopped"),
        (
            OSError(30, "Read-only file system", "{out}/results.json.partial"),
            "{out}/results.json.partial: Read-only",
        ),
    ],
)
def test_a_full_disk_or_read_only_folder_while_fine_tuning_is_one_line(
    setup, tmp_path, monkeypatch, error, named
):
    out = tmp_path / "run"
    if error.filename:
        error.filename = error.filename.format(out=out)

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(finetune, "write_json", fail)  # results.json
    with pytest.raises(SystemExit) as stop:
        finetune_run(setup, out, "--epochs", 1, "--limit-train", 32)
    message = str(stop.value.code)
    assert "\n" not in message and message.startswith(named.format(out=out))


def test_a_ctrl_c_during_the_last_epochs_evaluation_ends_the_run_once_its_checkpoint_is_saved(
    setup, tmp_path, monkeypatch, capsys
):
    """After the last step's check nothing is left to stop but the closing lines: the run says it is
    complete and ends with status 130, not 0 as if no Ctrl-C had come."""
    real = finetune.evaluate

    def evaluate_then_ctrl_c(*args, **kwargs):
        figures = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        return figures

    monkeypatch.setattr(finetune, "evaluate", evaluate_then_ctrl_c)
    with pytest.raises(SystemExit) as stop:
        finetune_run(setup, tmp_path / "run", "--epochs", 1, "--limit-train", 32)
    assert stop.value.code == 130 and "interrupted (SIGINT); the run is complete" in capsys.readouterr().err
    assert checkpoint_steps(tmp_path / "run") and (tmp_path / "run" / "best").is_dir()


def test_a_resume_removes_what_a_killed_save_left(corpus, tmp_path):
    out = tmp_path / "run"
    pretrain_into(corpus, out, "--steps", "4", "--save-every", "2")
    (out / "checkpoints" / ".partial-6-4242").mkdir()
    (out / "checkpoints" / ".partial-6-4242" / "config.json").write_text("{")
    config = json.loads((out / "config.json").read_text())
    pretrain.main(["--resume", str(out), "--device", "cpu", "--steps", "6"])
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["2", "4", "6"]
    assert json.loads((out / "config.json").read_text()) == config
    assert checkpoint.checkpoint_steps(out) == [2, 4, 6]


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_closing_sample_is_drawn_ends_the_run_at_once(
    corpus, tmp_path, monkeypatch, number
):
    """The steps are done and saved; a signal that comes while the closing sample is drawn ends the
    command at once with 128 + its number (it was ignored), and loss.png is there: drawn first."""

    def sample_cut_short(*args, **kwargs):
        os.kill(os.getpid(), number)
        time.sleep(30)  # what a long sample would take: the signal must not wait for it

    monkeypatch.setattr(pretrain, "generate", sample_cut_short)
    began = time.time()
    with pytest.raises(SystemExit) as stop:
        pretrain_into(corpus, tmp_path / "run", "--steps", "3")
    assert stop.value.code == 128 + number and time.time() - began < 25
    assert (tmp_path / "run" / "loss.png").exists() and checkpoint_steps(tmp_path / "run") == [3]


def test_a_run_stopped_by_a_signal_gets_its_loss_curve(corpus, tmp_path):
    out = tmp_path / "run"
    process = signalled_in_training(corpus, out, signal.SIGINT)
    assert process.wait(timeout=30) == 130 and (out / "loss.png").exists()
