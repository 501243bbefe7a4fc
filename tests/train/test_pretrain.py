"""python -m train.pretrain end to end, on a small model and corpus: the run folder, exact resume,
Ctrl-C, NaN losses and bad input."""

import json
import os
import re

import numpy as np
import pytest

from autograd.optim import warmup_cosine
from autograd.serialization import load_file
from tinygpt.tokenizer import load_tokenizer
from train import pretrain
from train.checkpoint import checkpoint_steps
from train.run_folder import read_metrics

from .runs import ctrl_c, losses, pretrain_argv, pretrain_into


def test_a_run_writes_its_folder_and_learns(corpus, tmp_path, capsys):
    """The folder holds config, tokenizer, checkpoints and metrics; validation perplexity ends
    below the unigram baseline the run prints."""
    out = tmp_path / "run"
    pretrain_into(
        corpus,
        out,
        "--steps",
        "60",
        "--eval-every",
        "30",
        "--save-every",
        "20",
        "--keep-checkpoints",
        "2",
        "--lr",
        "1e-2",
    )
    assert {"config.json", "tokenizer", "checkpoints", "metrics.jsonl"} <= set(os.listdir(out))
    assert checkpoint_steps(out) == [40, 60]
    metrics = read_metrics(out)
    assert [m["step"] for m in metrics if "loss" in m][-1] == 60
    assert all({"lr", "tokens_per_s", "elapsed"} <= set(m) for m in metrics if "loss" in m)
    printed = capsys.readouterr().out
    perplexity = float(printed.split("validation perplexity ")[1].split()[0])
    baseline = float(printed.split("unigram baseline ")[1].rstrip(")\n").split(")")[0])
    assert perplexity < baseline / 2


def test_every_step_has_a_rate_the_schedule_at_its_middle(corpus, tmp_path):
    """warmup_cosine at (step + 0.5) / total: the first step of the warmup moves the weights too."""
    out = tmp_path / "run"
    steps = (
        "--steps",
        "10",
        "--warmup-steps",
        "1",
        "--lr",
        "1e-3",
        "--log-every",
        "1",
        "--eval-every",
        "1000",
    )
    pretrain_into(corpus, out, *steps, "--save-every", "1", "--keep-checkpoints", "10")
    rates = [m["lr"] for m in read_metrics(out) if "loss" in m]
    assert rates == pytest.approx([1e-3 * warmup_cosine((s + 0.5) / 10, 0.1) for s in range(10)])
    first = load_file(str(out / "checkpoints" / "1" / "model.safetensors"))
    pretrain_into(
        corpus, tmp_path / "slow", *steps, "--save-every", "1", "--keep-checkpoints", "10", "--lr", "1e-6"
    )
    slow = load_file(str(tmp_path / "slow" / "checkpoints" / "1" / "model.safetensors"))
    assert any(not np.array_equal(first[name], slow[name]) for name in first)  # at a rate of 0, equal


def test_normalize_trains_a_tokenizer_on_gpt1_prepared_text(corpus, tmp_path):
    """--normalize gpt1: the run's tokenizer lower-cases and splits words, and says so on disk."""
    out = tmp_path / "run"
    pretrain_into(corpus, out, "--steps", "2", "--eval-every", "1000", "--normalize", "gpt1")
    assert json.loads((out / "tokenizer" / "tokenizer_config.json").read_text()) == {"normalizer": "gpt1"}
    tokenizer = load_tokenizer(out / "tokenizer")
    assert tokenizer.decode(tokenizer.encode("The CAT's hill.")) == "the cat 's hill ."


def test_resume_continues_with_the_same_losses(corpus, tmp_path):
    """Resuming from the checkpoint at step 10 gives losses 11..20 identical to the run that went on."""
    out = tmp_path / "run"
    pretrain_into(
        corpus, out, "--steps", "20", "--eval-every", "100", "--save-every", "10", "--log-every", "1"
    )
    uninterrupted = losses(out)
    pretrain.main(["--resume", str(out / "checkpoints" / "10"), "--device", "cpu"])
    assert losses(out) == uninterrupted
    assert len(uninterrupted) == 20


def test_resuming_to_the_checkpoints_own_step_reports_what_the_run_has(corpus, tmp_path, capsys):
    """--resume at step 2 with --steps 2 trains nothing: the closing lines say that no validation
    pass is logged (none ran by step 2) and still give the baseline, a sample and the folder."""
    out = tmp_path / "run"
    pretrain_into(corpus, out, "--steps", "4", "--eval-every", "100", "--save-every", "2")
    capsys.readouterr()
    pretrain.main(["--resume", str(out / "checkpoints" / "2"), "--steps", "2", "--device", "cpu"])
    printed = capsys.readouterr().out
    assert "no validation pass logged by step 2" in printed and "unigram baseline" in printed
    assert "sample: " in printed and f"run folder: {out}" in printed
    assert checkpoint_steps(out) == [2]


def test_a_cache_folder_that_cannot_be_written_costs_a_warning_not_the_run(
    corpus, tmp_path, monkeypatch, capsys
):
    """TINYGPT_CACHE naming a file: the run warns in one line and trains on its text prepared in a
    temporary folder, which it removes."""
    (tmp_path / "a file").write_text("not a folder")
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "a file"))
    pretrain_into(corpus, tmp_path / "run", "--steps", "2")
    printed = capsys.readouterr()
    assert checkpoint_steps(tmp_path / "run") == [2]
    [warning] = [line for line in printed.err.splitlines() if "cannot prepare" in line]
    assert re.fullmatch(
        r"warning: .*a file/datasets/\w+: cannot prepare the text there \(.*\); using a temporary folder",
        warning,
    )
    temporary = re.search(r"tokens \(prepared in (.+)\)", printed.out)[1]
    assert not os.path.exists(temporary)
    assert "UserWarning" not in printed.err and "warnings.warn" not in printed.err


def test_gradient_accumulation_gives_the_losses_of_one_pass(corpus, tmp_path):
    """--grad-accum 4 cuts each batch of 8 into 4 backward passes of 2 windows: the same 20 losses
    as one pass within 1e-5, dropout on (a window's masks follow its place in the batch)."""
    extra = [
        "--steps",
        "20",
        "--batch-size",
        "8",
        "--dropout",
        "0.1",
        "--log-every",
        "1",
        "--eval-every",
        "100",
    ]
    pretrain_into(corpus, tmp_path / "one", *extra, "--lr", "1e-3")
    pretrain_into(corpus, tmp_path / "four", *extra, "--lr", "1e-3", "--grad-accum", "4")
    one, four = losses(tmp_path / "one"), losses(tmp_path / "four")
    assert [step for step, _ in four] == [step for step, _ in one] == list(range(1, 21))
    for (step, a), (_, b) in zip(four, one):
        assert abs(a - b) <= 1e-5 * abs(b), f"step {step}: {a} against {b}"


def test_a_bf16_run_follows_the_fp32_loss_curve(corpus, tmp_path):
    """The tiny preset cut to two blocks, 100 steps with dropout, under --precision bf16 and fp32:
    every training loss of bf16 within 1% of fp32's (they differ by 0.03% at most here), the
    weights float32."""
    curves = {}
    for precision in ("fp32", "bf16"):
        pretrain.main(
            ["--data", str(corpus), "--out", str(tmp_path / precision), "--preset", "tiny", "--n-layer", "2"]
            + ["--n-ctx", "64", "--batch-size", "8", "--vocab-size", "300", "--steps", "100"]
            + ["--log-every", "10", "--eval-every", "100", "--sample-tokens", "4", "--device", "cpu"]
            + ["--precision", precision]
        )
        curves[precision] = losses(tmp_path / precision)
    assert [step for step, _ in curves["bf16"]] == [step for step, _ in curves["fp32"]] == list(range(1, 101))
    for (step, bf16), (_, fp32) in zip(curves["bf16"], curves["fp32"]):
        assert abs(bf16 - fp32) <= 0.01 * fp32, f"step {step}: {bf16} against {fp32}"
    assert (
        load_file(str(tmp_path / "bf16" / "checkpoints" / "100" / "model.safetensors"))[
            "h.0.mlp.c_fc.weight"
        ].dtype
        == np.float32
    )


def test_ctrl_c_saves_a_checkpoint_that_resumes(corpus, tmp_path):
    """SIGINT stops the run within seconds after saving a checkpoint; --resume finishes it."""
    out = tmp_path / "run"
    steps = ["--steps", "100000", "--log-every", "1", "--save-every", "100000"]
    output = ctrl_c(out, "-m", "train.pretrain", *pretrain_argv(corpus, out, *steps))
    [step] = checkpoint_steps(out)
    assert step >= 3 and f"interrupted after step {step}" in output
    pretrain.main(["--resume", str(out), "--device", "cpu", "--steps", str(step + 2)])
    assert checkpoint_steps(out)[-1] == step + 2


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_a_nan_loss_stops_the_run_and_names_the_step(corpus, tmp_path):
    """An absurd learning rate drives the loss to NaN: the run stops, says at which step, and the
    checkpoint before it stays."""
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as stop:
        pretrain_into(
            corpus,
            out,
            "--steps",
            "200",
            "--lr",
            "1e12",
            "--warmup-steps",
            "0",
            "--grad-clip",
            "0",
            "--log-every",
            "1",
            "--save-every",
            "1",
            "--eval-every",
            "1000",
        )
    message = str(stop.value.code)
    assert "the loss became" in message and "at step" in message
    bad_step = int(message.split("at step ")[1].split(":")[0])
    assert checkpoint_steps(out)[-1] == bad_step - 1


@pytest.mark.parametrize(
    "make_input, expected",
    [
        (lambda tmp: ["--data", str(tmp / "missing.txt")], "missing.txt: no such file"),
        (lambda tmp: ["--data", str(write(tmp / "empty.txt", b"  \n"))], "is empty"),
        (lambda tmp: ["--data", str(write(tmp / "short.txt", b"Too short."))], "too few"),
        (
            lambda tmp: ["--data", str(write(tmp / "latin1.txt", "caf\xe9 au lait".encode("latin-1")))],
            "latin1.txt: line 1: not valid UTF-8 at byte 3",
        ),
        (lambda tmp: ["--batch-size", "6", "--grad-accum", "4"], "not a multiple"),
        (
            lambda tmp: ["--normalize", "gpt1", "--tokenizer", str(tmp)],
            "--normalize is for a tokenizer trained here",
        ),
    ],
)
def test_bad_input_is_a_message_naming_it(corpus, tmp_path, capsys, make_input, expected):
    with pytest.raises(SystemExit) as stop:
        pretrain_into(corpus, tmp_path / "run", *make_input(tmp_path))
    assert stop.value.code == 2
    assert expected in capsys.readouterr().err


def test_a_truncated_checkpoint_is_named_when_resuming(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    pretrain_into(corpus, out, "--steps", "4", "--save-every", "2", "--eval-every", "100")
    weights = out / "checkpoints" / "4" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(SystemExit) as stop:
        pretrain.main(["--resume", str(out), "--device", "cpu"])
    assert stop.value.code == 2 and str(weights) in capsys.readouterr().err


def test_weights_of_another_shape_are_refused_with_their_names(corpus, tmp_path, capsys):
    """--init-from a run whose model is wider names the parameters that do not fit."""
    wide = tmp_path / "wide"
    pretrain_into(corpus, wide, "--steps", "2", "--eval-every", "100", "--n-embd", "48")
    with pytest.raises(SystemExit) as stop:
        pretrain_into(corpus, tmp_path / "narrow", "--steps", "2", "--init-from", str(wide))
    error = capsys.readouterr().err
    assert stop.value.code == 2 and "--init-from" in error and "tokens_embed.weight" in error


def write(path, data):
    path.write_bytes(data)
    return path
