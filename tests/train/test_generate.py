"""python -m train.generate on a tiny run folder built here: what it prints, and its usage errors."""

import pytest

from tinygpt.generation import generate
from tinygpt.tokenizer import GPT1Tokenizer
from train.generate import continuation, main

from .runs import finished, tiny_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("run")
    model, tokenizer = tiny_run(folder)
    return folder, model, tokenizer


def generated(capsys, argv):
    main(argv)
    return capsys.readouterr().out


def test_prints_the_prompt_and_its_continuation(run, capsys):
    folder, model, tokenizer = run
    out = generated(
        capsys,
        [
            "--run",
            str(folder),
            "--prompt",
            "the cat",
            "--max-new-tokens",
            "12",
            "--temperature",
            "0.8",
            "--top-k",
            "20",
            "--top-p",
            "0.95",
            "--seed",
            "3",
        ],
    )
    prompt_ids = tokenizer.encode("the cat")
    new_ids = generate(model, prompt_ids, 12, temperature=0.8, top_k=20, top_p=0.95, seed=3)
    assert out == tokenizer.decode(prompt_ids + new_ids) + "\n"
    assert out.startswith("the cat") and len(new_ids) == 12


def test_a_checkpoint_folder_the_cache_and_the_seed(run, capsys):
    folder, _, _ = run
    argv = ["--prompt", "a dog", "--max-new-tokens", "20", "--seed", "7"]  # 20 > n_ctx: the window slides
    from_run = generated(capsys, ["--run", str(folder), *argv])
    assert generated(capsys, ["--run", str(folder / "checkpoints" / "2"), *argv]) == from_run
    assert generated(capsys, ["--run", str(folder), "--no-cache", *argv]) == from_run
    assert generated(capsys, ["--run", str(folder / "checkpoints" / "1"), *argv]) != from_run
    assert generated(capsys, ["--run", str(folder), *argv[:-1], "8"]) != from_run


def test_top_k_of_one_and_temperature_zero_are_both_greedy(run, capsys):
    folder, _, _ = run
    argv = ["--run", str(folder), "--prompt", "the", "--max-new-tokens", "10", "--device", "cpu"]
    greedy = generated(capsys, [*argv, "--temperature", "0"])
    assert generated(capsys, [*argv, "--top-k", "1", "--seed", "1"]) == greedy
    assert generated(capsys, [*argv, "--top-k", "1", "--seed", "2"]) == greedy


def test_continuation_keeps_the_space_gpt1_decoding_drops():
    tokenizer = GPT1Tokenizer({"hello</w>": 0, "world</w>": 1, "wor": 2, "ld</w>": 3}, [])
    assert tokenizer.decode([1]) == "world"
    assert continuation(tokenizer, [0], [1]) == " world"
    assert continuation(tokenizer, [0], [2, 3, 0]) == " world hello"


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--run", "{missing}", "--prompt", "hi"], "--run"),
        (["--prompt", "hi"], "--run"),
        (["--run", "{run}", "--prompt", ""], "--prompt"),
        (["--run", "{run}", "--prompt", "hi", "--top-p", "0"], "--top-p"),
        (["--run", "{run}", "--prompt", "hi", "--top-p", "1.5"], "--top-p"),
        (["--run", "{run}", "--prompt", "hi", "--top-p", "nan"], "--top-p"),
        (["--run", "{run}", "--prompt", "hi", "--top-k", "0"], "--top-k"),
        (["--run", "{run}", "--prompt", "hi", "--top-k", "two"], "--top-k"),
        (["--run", "{run}", "--prompt", "hi", "--temperature", "-1"], "--temperature"),
        (["--run", "{run}", "--prompt", "hi", "--temperature", "inf"], "--temperature"),
        (["--run", "{run}", "--prompt", "hi", "--max-new-tokens", "-5"], "--max-new-tokens"),
        (["--run", "{run}", "--prompt", "hi", "--device", "tpu"], "--device"),
    ],
)
def test_bad_arguments_are_usage_errors_naming_the_argument(run, tmp_path, capsys, argv, named):
    folder, _, _ = run
    argv = [arg.format(run=folder, missing=tmp_path / "nowhere") for arg in argv]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert named in error and "Traceback" not in error


def test_a_folder_without_checkpoints_names_the_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--run", str(tmp_path), "--prompt", "hi"])
    assert exit_info.value.code == 2
    assert f"--run: {tmp_path}: holds no checkpoint" in capsys.readouterr().err


def test_runs_as_a_module(run):
    folder, _, _ = run
    result = finished(
        "-m",
        "train.generate",
        "--run",
        str(folder),
        "--prompt",
        "the mat",
        "--max-new-tokens",
        "5",
        "--seed",
        "0",
        "--device",
        "cpu",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("the mat")
