"""Nothing lost, nothing silent: an existing run folder is refused (or replaced with --overwrite,
after every check), --resume refuses flags and data that would change the run, extending a
finished run keeps its schedule, and a diverging run stops cleanly, with no overflow."""

import json
import math

import pytest

from train import evaluate, finetune, lifecycle, pretrain
from train.checkpoint import checkpoint_steps
from train.run_folder import read_metrics

from .runs import finetune_run, losses, pretrain_argv, pretrain_into, stopped, tiny_run

TEN_STEPS = ("--steps", "10", "--eval-every", "5", "--save-every", "5", "--log-every", "1")


def weights_of(out, step):
    return (out / "checkpoints" / str(step) / "model.safetensors").read_bytes()


def usage_error(capsys, main, argv):
    """The one-line message of a usage error (exit status 2)."""
    code, err = stopped(capsys, main, argv)
    assert code == 2
    return err.strip().splitlines()[-1]


def test_an_existing_run_folder_is_refused_and_overwrite_replaces_it(corpus, tmp_path, capsys):
    """The same command with another --seed into a finished run's folder: refused, every file as it
    was; with --overwrite: the run files are the new run's alone, other files left alone."""
    out = tmp_path / "run"
    pretrain_into(corpus, out, *TEN_STEPS)
    (out / "notes.txt").write_text("mine")
    before = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}
    argv = pretrain_argv(corpus, out, *TEN_STEPS, "--seed", "1")
    error = usage_error(capsys, pretrain.main, argv)
    assert f"--out: {out} is not empty" in error and "--overwrite" in error and "--resume" in error
    assert {path: path.read_bytes() for path in out.rglob("*") if path.is_file()} == before

    pretrain.main([*argv, "--overwrite"])
    assert weights_of(out, 10) != before[out / "checkpoints" / "10" / "model.safetensors"]
    assert [step for step, _ in losses(out)] == list(range(1, 11))  # one run's lines, not two
    assert json.loads((out / "config.json").read_text())["settings"]["seed"] == 1
    assert (out / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize(
    "bad_input, expected",
    [
        (["--batch-size", "4000"], "fewer than --batch-size 4000"),
        (["--init-from", "nowhere"], "--init-from"),
        (["--data", "missing.txt"], "missing.txt"),
    ],
)
def test_overwrite_writes_nothing_before_every_input_is_checked(
    corpus, tmp_path, capsys, bad_input, expected
):
    out = tmp_path / "run"
    pretrain_into(corpus, out, *TEN_STEPS)
    before = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}
    argv = pretrain_argv(corpus, out, *TEN_STEPS, "--overwrite", *bad_input)
    assert expected in usage_error(capsys, pretrain.main, argv)
    assert {path: path.read_bytes() for path in out.rglob("*") if path.is_file()} == before


def test_resume_refuses_flags_that_would_change_the_run(corpus, tmp_path, capsys):
    """--lr, --batch-size and --data given anew are named, with the run's values; nothing is written.
    The flags of one invocation (--device, --log-every, ...) and the run's own values pass."""
    out = tmp_path / "run"
    pretrain_into(corpus, out, "--steps", "10", "--eval-every", "5", "--save-every", "5")
    metrics = (out / "metrics.jsonl").read_bytes()
    argv = [
        "--resume",
        str(out / "checkpoints" / "5"),
        "--lr",
        "5",
        "--batch-size",
        "2",
        "--data",
        "missing.txt",
    ]
    error = usage_error(capsys, pretrain.main, argv)
    assert error.endswith(
        "--resume: --batch-size 2 (the run's: 4), --data missing.txt (the run's: "
        f"{corpus}), --lr 5.0 (the run's: 0.0005) would change the run in {out}; leave them out, "
        "or start a new run"
    )
    assert (out / "metrics.jsonl").read_bytes() == metrics and checkpoint_steps(out) == [5, 10]
    assert "--overwrite starts a new run" in usage_error(
        capsys, pretrain.main, ["--resume", str(out), "--overwrite"]
    )
    same = ["--lr", "5e-4", "--batch-size", "4", "--data", str(corpus), "--device", "cpu", "--log-every", "1"]
    pretrain.main(["--resume", str(out / "checkpoints" / "5"), *same])
    assert [step for step, _ in losses(out)] == list(range(1, 11))


def test_resume_refuses_data_that_changed_unless_allowed(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    pretrain_into(corpus, out, "--steps", "10", "--eval-every", "5", "--save-every", "5")
    corpus.write_text(corpus.read_text() + " A new sentence at the end.", encoding="utf-8")
    error = usage_error(
        capsys, pretrain.main, ["--resume", str(out / "checkpoints" / "5"), "--device", "cpu"]
    )
    assert "--resume: the data is not what the run began on" in error and "--allow-data-change" in error
    assert checkpoint_steps(out) == [5, 10]
    pretrain.main(["--resume", str(out / "checkpoints" / "5"), "--device", "cpu", "--allow-data-change"])
    assert checkpoint_steps(out)[-1] == 10


def test_a_fine_tune_refuses_changed_flags_and_data(setup, tmp_path, capsys):
    out = finetune_run(setup, tmp_path / "run", "--epochs", 1, "--limit-train", 32)
    resume = ["--resume", str(out), "--device", "cpu"]
    assert "--lr 1.0 (the run's: 0.01)" in usage_error(capsys, finetune.main, [*resume, "--lr", "1"])
    assert "--epochs 5 (the run's: 1)" in usage_error(capsys, finetune.main, [*resume, "--epochs", "5"])
    train = setup[3]
    original = train.read_text()
    try:
        train.write_text(original.replace("cat", "dog"), encoding="utf-8")
        assert "--allow-data-change" in usage_error(capsys, finetune.main, resume)
    finally:
        train.write_text(original, encoding="utf-8")


def test_steps_past_a_finished_run_go_on_at_its_last_rate(corpus, tmp_path, capsys):
    """--steps 14 on a finished 10-step run: steps 11-14 at the rate of step 10 (the schedule keeps
    its total), not a jump back up; --steps below the run's step is a usage error."""
    out = tmp_path / "run"
    pretrain_into(corpus, out, *TEN_STEPS)
    pretrain.main(["--resume", str(out), "--device", "cpu", "--steps", "14", "--log-every", "1"])
    rates = [m["lr"] for m in read_metrics(out) if "loss" in m]
    assert len(rates) == 14 and rates[10:] == [rates[9]] * 4 and rates[9] < rates[1] / 10
    assert "steps 11 to 14 go at the last rate of the run's schedule of 10 steps" in capsys.readouterr().out
    error = usage_error(capsys, pretrain.main, ["--resume", str(out), "--steps", "12"])
    assert error.endswith(f"--steps 12: the run in {out} is at step 14 already")


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("eval_every", ["1000", "2"])
def test_a_finite_divergence_stops_the_run_without_saving_it(corpus, tmp_path, eval_every):
    """--lr 1e3 drives the loss to about 1e6, finite but past any perplexity: the run stops at that
    step, naming it, with no checkpoint of it or after it, and no OverflowError."""
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as stop:
        pretrain_into(
            corpus, out, "--steps", "40", "--lr", "1e3", "--save-every", "1", "--eval-every", eval_every
        )
    message = str(stop.value.code)
    assert " became " in message and " at step " in message, message
    step = int(message.split(" at step ")[1].split(":")[0])
    assert checkpoint_steps(out) and checkpoint_steps(out)[-1] < step
    assert all(
        all(abs(value) <= lifecycle.MAX_LOSS for key, value in m.items() if "loss" in key)
        for m in read_metrics(out)
    )


def test_the_perplexity_of_a_huge_loss_is_inf(tmp_path, monkeypatch, capsys):
    tiny_run(tmp_path / "run")
    (tmp_path / "text.txt").write_text("the cat sat on the mat. " * 4)
    monkeypatch.setattr(evaluate, "negative_log_likelihood", lambda *args, **kwargs: 1.4e7)
    results = evaluate.main(
        ["perplexity", "--run", str(tmp_path / "run"), "--data", str(tmp_path / "text.txt")]
    )
    assert results["perplexity"] == math.inf and "perplexity     inf" in capsys.readouterr().out
    assert lifecycle.perplexity(1.4e7) == math.inf and lifecycle.perplexity(2.0) == math.exp(2.0)
    assert math.isnan(lifecycle.perplexity(math.nan))
