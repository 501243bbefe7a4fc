"""What every command line shares: a bad argument is a usage error of one line that names it, before
any file is written; --help gives every option's default; Ctrl-C outside a training loop ends a
command with one line and status 130; evaluation draws a progress bar on a terminal."""

import argparse
import json
import os
import signal
import subprocess
import sys

import pytest

import autograd as ag
from autograd import backend
from tinygpt import GPT, GPTConfig
from train import cli, dataset_tokenizer, evaluate, finetune, generate, pretrain, zeroshot
from train.cli import device_name
from train.run_folder import read_metrics

from .runs import ROOT, ctrl_c_as_in_a_terminal, finished, pretrain_argv, pretrain_into, stopped, tiny_run

PRETRAIN_ERRORS = [
    (["--n-embd", "30", "--n-head", "4"], "--n-embd 30"),
    (["--n-embd", "30"], "--n-head 4"),  # the preset's heads
    (["--n-ctx", "0"], "--n-ctx"),
    (["--n-layer", "0"], "--n-layer"),
    (["--dropout", "1.5"], "--dropout"),
    (["--vocab-size", "10"], "--vocab-size: must be an integer >= 259"),
    (["--lr", "-1"], "--lr"),
    (["--lr", "nan"], "--lr"),
    (["--steps", "0"], "--steps"),
    (["--eval-windows", "0"], "--eval-windows"),
    (["--epochs", "-1"], "--epochs"),
    (["--val-fraction", "-0.5"], "--val-fraction"),
    (["--val-fraction", "1"], "--val-fraction"),
    (["--warmup-steps", "0.5"], "--warmup-steps"),
    (["--l2", "-1"], "--l2"),
    (["--grad-clip", "inf"], "--grad-clip"),
    (["--keep-checkpoints", "-1"], "--keep-checkpoints"),
    (["--sample-tokens", "-1"], "--sample-tokens"),
    (["--device", "tpu"], "--device"),
    (["--device", "cuda"], "--device: device 'cuda' needs CuPy"),
    # checked before the corpus is read and a tokenizer trained (each was a traceback, or a refusal after)
    (["--seed", str(2**70)], "--seed: must be an integer in [0, 2^64)"),
    (["--n-layer", "2000"], "--preset tiny --n-layer 2000: n_layer=2000 is more than the 1024 allowed"),
    (["--preset", "gpt1", "--n-embd", "100000", "--n-head", "10"], "--n-embd 100000 --n-head 10: 1,"),
    (["--out", "/proc/tinygpt-run"], "--out: /proc/tinygpt-run cannot be written (in /proc: "),
    (["--init-from", "{tmp}/missing"], "--init-from: "),
]
FINETUNE_ERRORS = [
    (["--lr", "0"], "--lr: must be a finite number > 0"),
    (["--seed", str(2**64)], "--seed"),
    (["--lr", "-1"], "--lr"),
    (["--lr", "inf"], "--lr"),
    (["--epochs", "0"], "--epochs"),
    (["--batch-size", "0"], "--batch-size"),
    (["--clf-dropout", "1"], "--clf-dropout"),
    (["--warmup-ratio", "1"], "--warmup-ratio"),
    (["--warmup-ratio", "-0.1"], "--warmup-ratio"),
    (["--lm-coef", "-1"], "--lm-coef"),
    (["--device", "cuda:0"], "--device: device 'cuda' needs CuPy"),
]
EVALUATE = ["perplexity", "--run", "{tmp}/run", "--data", "{tmp}/text.txt"]
ZEROSHOT = ["zeroshot", "--run", "{tmp}/run", "--task", "sst2", "--data", "{tmp}/dev.tsv"]
ATTENTION = ["attention", "--run", "{tmp}/run", "--text", "hi", "--layer", "0", "--out", "{tmp}/a.png"]
ERRORS = [
    *[(pretrain.main, ["--out", "{tmp}/run", *argv], flag) for argv, flag in PRETRAIN_ERRORS],
    *[(finetune.main, ["--out", "{tmp}/run", *argv], flag) for argv, flag in FINETUNE_ERRORS],
    (evaluate.main, [*EVALUATE, "--device", "cuda"], "--device: device 'cuda' needs CuPy"),
    (evaluate.main, [*EVALUATE, "--batch-size", "0"], "--batch-size"),
    (evaluate.main, [*ZEROSHOT, "--device", "tpu"], "--device"),
    (evaluate.main, [*ZEROSHOT, "--task", "cola", "--threshold", "nan"], "--threshold"),
    (evaluate.main, [*ATTENTION, "--device", "cuda"], "--device: device 'cuda' needs CuPy"),
    (generate.main, ["--run", "{tmp}/run", "--prompt", "hi", "--device", "cuda"], "--device"),
    (generate.main, ["--run", "{tmp}/run", "--prompt", "hi", "--seed", "-1"], "--seed"),
]


def usage_error(capsys, main, argv):
    """The status and stderr lines of main(argv), which must stop it."""
    code, err = stopped(capsys, main, argv)
    return code, err.splitlines()


@pytest.mark.parametrize("main, argv, flag", ERRORS)
def test_a_bad_argument_is_a_one_line_usage_error_before_anything_is_written(
    tmp_path, capsys, monkeypatch, main, argv, flag
):
    monkeypatch.setattr(backend, "cupy", None)  # --device cuda as on a machine without CuPy
    monkeypatch.chdir(tmp_path)
    status, lines = usage_error(capsys, main, [arg.format(tmp=tmp_path) for arg in argv])
    [error] = lines
    assert status == 2 and ": error: " in error and flag in error
    assert os.listdir(tmp_path) == []


def test_a_model_too_large_for_the_memory_is_refused_before_the_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(os, "sysconf", lambda name: 2**16 if name == "SC_PHYS_PAGES" else 4096)  # 256 MiB
    monkeypatch.chdir(tmp_path)
    status, [error] = usage_error(capsys, pretrain.main, ["--n-embd", "1024", "--n-head", "8"])
    assert status == 2 and "--n-embd 1024 --n-head 8: training 63," in error and "GiB, more than" in error
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "module, expected",
    [
        ("train.predict", "usage: python -m train.evaluate predict"),
        ("train.zeroshot", "usage: python -m train.evaluate zeroshot"),
        (
            "train.inspection",
            "python -m train.inspection: error: run python -m train.evaluate attention | summary",
        ),
    ],
)
def test_a_module_of_subcommands_runs_its_command_or_names_them(module, expected):
    """python -m train.predict --help is python -m train.evaluate predict --help; a module of two
    commands names them in one line, status 2."""
    done = finished("-m", module, "--help")
    if module == "train.inspection":
        assert (done.returncode, done.stdout, done.stderr) == (2, "", expected + "\n")
    else:
        assert done.returncode == 0 and done.stdout.startswith(expected)


def test_a_subcommand_gets_a_parser_that_starts_with_run_and_its_body_bound_to_it(capsys):
    def arguments(parser):
        parser.add_argument("--words", type=int, default=3, help="how many")

    @cli.subcommand("count", arguments, help="count words")
    def count(parser, args):
        return parser.prog, args.run, args.words

    parser = cli.Parser(prog="evaluate")
    count.add_to(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["count", "--run", "r", "--words", "5"])
    assert args._subcommand(args) == ("evaluate count", "r", 5)
    with pytest.raises(SystemExit) as stopped_by:
        parser.parse_args(["count", "--words", "5"])
    assert stopped_by.value.code == 2 and "--run" in capsys.readouterr().err


def parsers():
    """Every command's parser: pretrain, finetune, each evaluate command, generate."""
    commands = evaluate.build_parser()._subparsers._group_actions[0].choices
    return {
        "pretrain": pretrain.parse_args([])[0],
        "finetune": finetune.parse_args(["--resume", "run"])[0],
        **{f"evaluate {name}": parser for name, parser in commands.items()},
        "generate": generate.build_parser(),
    }


@pytest.mark.parametrize("name, parser", parsers().items())
def test_help_gives_every_options_default_or_what_leaving_it_out_does(name, parser):
    formatter = parser._get_formatter()
    for action in parser._actions:
        if action.nargs == 0 or action.required:  # flags, and options with no default to give
            continue
        assert action.help, f"{name} {action.option_strings[0]} has no help"
        shown = formatter._expand_help(action)
        if action.default is None:
            assert "default" in shown or "required" in shown, f"{name} {action.option_strings[0]}: {shown}"
        else:
            assert f"(default: {action.default})" in shown, f"{name} {action.option_strings[0]}: {shown}"


def test_warmup_is_steps_in_pretrain_and_a_ratio_in_finetune():
    assert pretrain.parse_args(["--warmup-steps", "5"])[1].warmup_steps == 5
    assert finetune.parse_args(["--resume", "run", "--warmup-ratio", "0.1"])[1].warmup_ratio == 0.1


def test_resume_reads_the_warmup_of_an_older_run_folder(corpus, tmp_path):
    """config.json of a run from before --warmup-steps holds "warmup": a resume keeps its value."""
    out = tmp_path / "run"
    ten_steps = ["--steps", "10", "--save-every", "1", "--keep-checkpoints", "0", "--log-every", "1"]
    pretrain_into(corpus, out, *ten_steps, "--warmup-steps", "0")
    rates = learning_rates(out)
    config = json.loads((out / "config.json").read_text())
    config["settings"]["warmup"] = config["settings"].pop("warmup_steps")
    (out / "config.json").write_text(json.dumps(config))
    for digests in out.rglob("digests.json"):  # an older run recorded none
        digests.unlink()
    pretrain.main(["--resume", str(out / "checkpoints" / "1"), "--device", "cpu"])
    assert learning_rates(out) == rates  # not those of the new default's warmup, a tenth of the run


def learning_rates(out):
    return [m["lr"] for m in read_metrics(out) if "lr" in m]


def interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def interrupted(capsys, main, argv):
    """(status, stderr) of main(argv) when Ctrl-C comes; a KeyboardInterrupt that escapes fails."""
    try:
        main(argv)
    except SystemExit as stop:
        return stop.code, capsys.readouterr().err
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C ended the command with a traceback")
    pytest.fail("the command went on after Ctrl-C")


@pytest.fixture
def run(tmp_path):
    """A tiny run folder, a text to measure and an SST-2 dev file."""
    tiny_run(tmp_path / "run")
    (tmp_path / "text.txt").write_text("the cat sat on the mat. " * 20, encoding="utf-8")
    sst2 = "sentence\tlabel\na fine film .\t1\na dull film .\t0\n"
    (tmp_path / "dev.tsv").write_text(sst2, encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize(
    "module, function, argv",
    [
        (evaluate, "negative_log_likelihood", EVALUATE),
        (zeroshot, "continuation_log_probs", ZEROSHOT),
        (generate, "generate", ["--run", "{tmp}/run", "--prompt", "hi"]),
    ],
)
def test_ctrl_c_while_evaluating_or_generating_is_one_line_and_status_130(
    run, capsys, monkeypatch, module, function, argv
):
    monkeypatch.setattr(module, function, interrupt)
    main = generate.main if module is generate else evaluate.main
    argv = [arg.format(tmp=run) for arg in argv] + ["--device", "cpu"]
    assert interrupted(capsys, main, argv) == (130, "interrupted\n")


def test_ctrl_c_while_the_tokenizer_trains_writes_no_run_folder(corpus, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(dataset_tokenizer, "trained", interrupt)
    argv = pretrain_argv(corpus, tmp_path / "run")
    assert interrupted(capsys, pretrain.main, argv) == (130, "interrupted\n")
    assert not (tmp_path / "run").exists()


def test_sigint_during_tokenizer_training_in_a_process(tmp_path):
    """The real signal, on a corpus whose tokenizer takes seconds to train."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" ".join(f"word{i} token{i * 7 % 1000}" for i in range(200_000)), encoding="utf-8")
    command = [sys.executable, "-m", "train.pretrain", "--data", str(corpus), "--vocab-size", "20000"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TINYGPT_CACHE": str(tmp_path / "cache")}
    process = subprocess.Popen(
        [*command, "--out", str(tmp_path / "run"), "--device", "cpu"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_as_in_a_terminal,
    )
    while not process.stdout.readline().startswith("training a byte-level BPE tokenizer"):
        pass
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=30)
    assert (process.returncode, err) == (130, "interrupted\n")


@pytest.mark.parametrize("argv, unit", [(EVALUATE, "window"), (ZEROSHOT, "sequence")])
def test_evaluation_draws_a_progress_bar_on_a_terminal(run, capsys, monkeypatch, argv, unit):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    evaluate.main([arg.format(tmp=run) for arg in argv] + ["--device", "cpu"])
    err = capsys.readouterr().err
    assert "100%|" in err and f"{unit}/s" in err


def test_a_device_is_checked_and_kept_as_given():
    """--device auto stays 'auto' for each rank to resolve; a bad name is an argparse type error."""
    assert device_name("auto") == "auto" and device_name("cpu") == "cpu"
    with pytest.raises(argparse.ArgumentTypeError, match="'cuda:N', 'auto' or 'cuda-emulated'"):
        device_name("gpu")


COMMANDS_OF_A_RUN = {
    "evaluate perplexity": (evaluate.main, ["perplexity", "--run", "{run}", "--data", "{data}"]),
    "evaluate summary": (evaluate.main, ["summary", "--run", "{run}"]),
    "evaluate zeroshot": (
        evaluate.main,
        ["zeroshot", "--run", "{run}", "--task", "sst2", "--data", "{data}"],
    ),
    "generate": (generate.main, ["--run", "{run}", "--prompt", "the cat", "--max-new-tokens", "3"]),
}


@pytest.mark.parametrize("command", COMMANDS_OF_A_RUN)
def test_a_checkpoint_that_is_not_of_the_runs_tokenizer_is_refused(tmp_path, capsys, command):
    """A run whose newest checkpoint holds a model of 9,030 tokens and whose tokenizer has 300: the
    model's ids would be read as other tokens, so every command that loads the run refuses it, in
    one line naming both sizes, instead of a perplexity or a traceback."""
    run = tmp_path / "run"
    tiny_run(run)
    ag.manual_seed(0)
    GPT(GPTConfig(vocab_size=9030, n_ctx=16, n_embd=16, n_layer=1, n_head=2)).save_pretrained(
        run / "checkpoints" / "2"
    )
    data = tmp_path / "held_out.tsv"  # text for perplexity, an SST-2 file for zeroshot
    data.write_text("sentence\tlabel\nthe cat sat on the mat.\t1\n", encoding="utf-8")
    main, argv = COMMANDS_OF_A_RUN[command]
    status, lines = usage_error(capsys, main, [a.format(run=run, data=data) for a in argv])
    assert status == 2 and len(lines) == 1
    assert "the model has 9,030 tokens and the run's tokenizer 300" in lines[0]
