"""What a run does to its folder and its process beyond training: it holds the folder while it runs
(a second run on it is refused at once and writes nothing; a killed run leaves no lock), a resume
gets past a torn last line of metrics.jsonl, --overwrite removes only what runs write, progress off
a terminal is a plain line per --log-every steps, and a command called from Python puts back the
signal handlers it installed."""

import json
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from train import finetune, lifecycle, pretrain
from train.checkpoint import checkpoint_steps
from train.lifecycle import SIGNALS
from train.run_folder import check_free, hold_folder, release_folder

from .runs import finetune_argv, finetune_run, losses, pretrain_argv, pretrain_into, python, run_job, stopped

TEN_STEPS = ("--steps", "10", "--save-every", "5", "--eval-every", "5", "--log-every", "1")


def files(folder):
    return {path: path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def refused(capsys, main, argv):
    """(exit status, the lines on stderr) of a command that stops before it trains."""
    capsys.readouterr()
    code, err = stopped(capsys, main, argv)
    return code, err.strip().splitlines()


@pytest.fixture
def held(corpus, tmp_path):
    """(run folder, process): a pretraining run that holds its folder, stopped (SIGSTOP) once it
    has written a checkpoint; killed at the end."""
    out = tmp_path / "held"
    argv = pretrain_argv(corpus, out, "--steps", "3000", "--save-every", "3")
    process = python("-m", "train.pretrain", *argv, stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while not checkpoint_steps(out) and process.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGSTOP)
    assert checkpoint_steps(out), process.communicate()[0] if process.poll() is not None else "no checkpoint"
    yield out, process
    process.kill()
    process.wait()


def test_a_second_run_on_a_held_folder_is_refused_at_once_and_a_killed_run_leaves_no_lock(
    held, corpus, setup, capsys
):
    """--resume, --out with and without --overwrite, and a fine-tune's --out on a folder a running
    pretraining holds: one line naming the folder and the process, status 2, nothing written. Once
    that process is killed, --resume takes the folder."""
    out, holder = held
    before = files(out)
    second = [
        (pretrain.main, "--resume", ["--resume", str(out), "--device", "cpu"]),
        (pretrain.main, "--out", pretrain_argv(corpus, out, "--overwrite")),
        (pretrain.main, "--out", pretrain_argv(corpus, out)),
        (finetune.main, "--out", finetune_argv(setup, out, "--overwrite")),
    ]
    for main, flag, argv in second:
        status, lines = refused(capsys, main, argv)
        assert status == 2 and len(lines) == 1, lines
        assert f": error: {flag}: {out} is in use by process {holder.pid}, a run that holds it" in lines[0]
        assert files(out) == before

    holder.kill()
    holder.wait()
    step = checkpoint_steps(out)[-1]
    pretrain.main(["--resume", str(out), "--device", "cpu", "--steps", str(step + 1)])
    assert checkpoint_steps(out)[-1] == step + 1 and not (out / ".lock").exists()


def test_a_folder_that_a_run_filled_since_it_was_checked_is_left_alone(corpus, tmp_path, capsys, monkeypatch):
    """Two runs started together on an empty --out, the first done before the second has read its
    data: the second is refused, the first's folder as it left it."""
    out, checked, first = tmp_path / "run", lifecycle.new_run, {}

    def first_run_ends_meanwhile(*args):
        monkeypatch.setattr(lifecycle, "new_run", checked)
        run_dir = checked(*args)
        pretrain_into(corpus, out, "--steps", "2")
        first.update(files(out))
        return run_dir

    monkeypatch.setattr(lifecycle, "new_run", first_run_ends_meanwhile)
    status, lines = refused(capsys, pretrain.main, pretrain_argv(corpus, out, "--seed", "1"))
    assert first and files(out) == first
    assert status == 2 and lines[-1].startswith(f"python -m train.pretrain: error: {out} is not empty")


def test_the_lock_names_its_holder_and_dies_with_it(tmp_path):
    """A process holding a folder (hold_folder) keeps every other from it, by name; killed, it holds
    nothing, and release_folder leaves no lock file."""
    holding = "import sys, time; from train.run_folder import hold_folder; hold_folder(sys.argv[1]); print(1)"
    holding += "; time.sleep(60)"
    process = python("-c", holding, str(tmp_path))
    try:
        assert process.stdout.readline() == b"1\n"
        for take in (check_free, hold_folder):
            with pytest.raises(ValueError, match=f"is in use by process {process.pid}, "):
                take(tmp_path)
    finally:
        process.kill()
        process.wait()
    check_free(tmp_path)
    release_folder(tmp_path, hold_folder(tmp_path))
    assert list(tmp_path.iterdir()) == []


HOLD = """
import sys
from train import distributed, lifecycle

group = distributed.start(True)
with group.abort_on_error():
    lifecycle.Training(sys.argv[1], group, None, None, 1, "train.pretrain").hold()
"""


def test_two_ranks_are_refused_a_held_folder_without_waiting(mpiexec, held, tmp_path):  # noqa: F811
    """--resume of a held folder ends the job with the refusal; so does a folder held by the time
    rank 0 takes it (Training.hold), every rank then leaving together, without MPI_Abort."""
    out, holder = held
    before = files(out)
    resume = ["-m", "train.pretrain", "--distributed", "--resume", str(out), "--device", "cpu"]
    code, output = run_job(mpiexec(2, resume), mpiexec.env)
    assert code == 2 and f"{out} is in use by process {holder.pid}" in output, output
    (tmp_path / "hold.py").write_text(HOLD)
    code, output = run_job(mpiexec(2, [str(tmp_path / "hold.py"), str(out)]), mpiexec.env)
    error = f"python -m train.pretrain: error: {out} is in use by process {holder.pid}, a run that holds it"
    assert code == 2 and output.startswith(error) and "Abort" not in output, output
    assert files(out) == before


def test_a_torn_last_line_of_the_metrics_does_not_block_a_resume(corpus, tmp_path, capsys):
    """A run that died writing step 8's line (a full disk) after its checkpoint of step 5: the resume
    drops the torn line, saying so in one line, and logs the losses of the run never stopped."""
    out = tmp_path / "run"
    pretrain_into(corpus, out, *TEN_STEPS)
    uninterrupted = losses(out)
    shutil.rmtree(out / "checkpoints" / "10")
    lines = [
        line for line in (out / "metrics.jsonl").read_text().splitlines() if json.loads(line)["step"] <= 7
    ]
    (out / "metrics.jsonl").write_text(
        "".join(f"{line}\n" for line in lines) + '{"step": 8, "loss": 4.94, "lr": 3.07'
    )
    capsys.readouterr()
    pretrain.main(["--resume", str(out), "--device", "cpu"])
    said = [line for line in capsys.readouterr().err.splitlines() if "metrics.jsonl" in line]
    assert said == [
        f"{out / 'metrics.jsonl'}, line {len(lines) + 1}: cut short (an unfinished write), dropped"
    ]
    assert losses(out) == uninterrupted


@pytest.mark.parametrize("bad", ["{not json", '{"loss": 1.0}', '{"step": "3"}', "[1, 2]"])
def test_a_metrics_line_that_cannot_be_read_is_named_before_anything_is_written(
    corpus, tmp_path, capsys, bad
):
    out = tmp_path / "run"
    pretrain_into(corpus, out, "--steps", "2", "--log-every", "1")
    metrics = (out / "metrics.jsonl").read_text().splitlines(keepends=True)
    (out / "metrics.jsonl").write_text(metrics[0] + bad + "\n" + "".join(metrics[1:]))
    before = files(out)
    status, lines = refused(capsys, pretrain.main, ["--resume", str(out), "--device", "cpu"])
    assert status == 2 and len(lines) == 1
    assert f'--resume: {out / "metrics.jsonl"}, line 2: not a JSON object with an integer "step"' in lines[0]
    assert files(out) == before


def test_overwrite_removes_only_what_runs_write_and_says_what_it_kept(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    pretrain_into(corpus, out, "--steps", "4", "--save-every", "2")
    mine = {"my_notes.md": "mine", "tokenizer/notes.txt": "how I made it", "checkpoints/README": "read me"}
    for name, text in mine.items():
        (out / name).write_text(text)
    capsys.readouterr()
    pretrain_into(corpus, out, "--steps", "2", "--seed", "1", "--overwrite")
    assert {name: (out / name).read_text() for name in mine} == mine
    assert checkpoint_steps(out) == [2] and [step for step, _ in losses(out)] == [1, 2]
    kept = "checkpoints/README, tokenizer/notes.txt, my_notes.md"
    assert f"--overwrite kept what no run writes in {out}: {kept}\n" in capsys.readouterr().out


def test_off_a_terminal_progress_is_a_plain_line_per_log_every_steps(corpus, tmp_path, capsys, monkeypatch):
    """stderr a file (as under pytest): a line at steps 5, 10, 15 and 20, and no carriage return. On
    a terminal the bar stays; TQDM_DISABLE turns both off."""
    steps = ["--steps", "20", "--log-every", "5", "--eval-every", "20", "--save-every", "20"]
    pretrain_into(corpus, tmp_path / "lines", *steps)
    printed = capsys.readouterr()
    lines = [line for line in printed.out.splitlines() if line.startswith("pretrain step")]
    assert [line.split(":")[0] for line in lines] == [f"pretrain step {n}/20" for n in (5, 10, 15, 20)]
    assert re.fullmatch(
        r"pretrain step 5/20: loss \d+\.\d{3}, lr \d\.\d\de-\d\d, tokens/s [\d,]+, ETA \d\d:\d\d", lines[0]
    )
    assert "\r" not in printed.err

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    pretrain_into(corpus, tmp_path / "bar", *steps)
    printed = capsys.readouterr()
    assert "\r" in printed.err and "20/20" in printed.err and "pretrain step" not in printed.out

    monkeypatch.setenv("TQDM_DISABLE", "1")
    for terminal in (True, False):
        monkeypatch.setattr(sys.stderr, "isatty", lambda terminal=terminal: terminal)
        pretrain_into(corpus, tmp_path / f"quiet-{terminal}", *steps)
        printed = capsys.readouterr()
        assert "20/20" not in printed.err and "pretrain step" not in printed.out


def test_a_command_called_from_python_puts_back_the_signal_handlers(corpus, setup, tmp_path):
    """After a pretraining, a pretraining stopped by a usage error once it had begun, and a fine-tune,
    SIGINT and SIGTERM are handled as they were before."""

    def mine(signum, frame):
        pass

    before = {number: signal.signal(number, mine) for number in SIGNALS}
    try:
        pretrain_into(corpus, tmp_path / "run", "--steps", "2")
        assert [signal.getsignal(number) for number in SIGNALS] == [mine, mine]
        with pytest.raises(SystemExit):
            pretrain.main(["--resume", str(tmp_path / "run"), "--device", "cpu", "--steps", "1"])
        assert [signal.getsignal(number) for number in SIGNALS] == [mine, mine]
        finetune_run(setup, tmp_path / "tune", "--epochs", 1, "--limit-train", 32)
        assert [signal.getsignal(number) for number in SIGNALS] == [mine, mine]
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
