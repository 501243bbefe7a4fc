"""python -m train.finetune end to end on a small pre-trained GPT and synthetic jsonl data: it
learns a separable task, resumes exactly, each ablation does what it says, bad rows stop the run
or are counted, and the label map is saved and reused."""

import json
import math

import numpy as np
import pytest

from tinygpt import GPT, GPTConfig
from tinygpt.weights import dependencies
from train import finetune
from train.checkpoint import checkpoint_steps, read_weights
from train.run_folder import read_config, read_metrics

from .runs import FAST, WORD_SETS, ctrl_c, examples, finetune_argv, finetune_head, finetune_run, write_jsonl


def weights(run_dir):
    """The state dict of a fine-tune's newest checkpoint, the GPT's keys without 'transformer.'."""
    [step] = checkpoint_steps(run_dir)[-1:]
    state = GPT.read_weights(run_dir / "checkpoints" / str(step))
    return {name: np.asarray(array) for name, array in state.items()}


def test_a_fine_tune_learns_a_separable_task_and_writes_its_folder(setup, tmp_path, capsys):
    """Three epochs from the CLI reach 95% on dev; the run folder holds what it should; test
    predictions are written with the train set's label names, even for a test file whose only
    label would be id 0 on its own."""
    folder = setup[0]
    test = write_jsonl(folder / "test_pos.jsonl", examples(20, seed=3, only=0))  # only "pos"
    out = finetune_run(setup, tmp_path / "run", "--test", test, "--epochs", 3)
    assert {
        "config.json",
        "tokenizer",
        "labels.json",
        "checkpoints",
        "best",
        "metrics.jsonl",
        "results.json",
        "predictions.tsv",
    } <= {p.name for p in out.iterdir()}
    assert json.loads((out / "labels.json").read_text()) == ["neg", "pos"]  # sorted: the map of a jsonl file
    results = json.loads((out / "results.json").read_text())
    assert [e["epoch"] for e in results["epochs"]] == [1, 2, 3]
    assert results["best"]["accuracy"] == max(e["accuracy"] for e in results["epochs"]) >= 0.95
    assert results["test"]["accuracy"] >= 0.95
    lines = (out / "predictions.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 21
    assert sum(line.split("\t")[1] == "pos" for line in lines[1:]) >= 19
    assert checkpoint_steps(out) == [16, 24]  # 8 steps an epoch; the last two epochs kept
    printed = capsys.readouterr().out
    assert "best dev (epoch" in printed and f"accuracy {results['best']['accuracy']:.4f}" in printed


def test_resume_gives_the_same_losses_and_dev_figures(setup, tmp_path):
    """Stopping mid-epoch (checkpoint at step 3 of 4 an epoch) and resuming gives the very same
    per-step losses, dev figures and best weights as the run that went on."""
    out = finetune_run(
        setup,
        tmp_path / "run",
        "--epochs",
        2,
        "--limit-train",
        64,
        "--save-every",
        3,
        "--keep-checkpoints",
        10,
    )
    losses = [(m["step"], m["loss"], m["lm_loss"]) for m in read_metrics(out) if "loss" in m]
    results = json.loads((out / "results.json").read_text())
    best = read_weights(out / "best", finetune_head(out))
    assert checkpoint_steps(out) == [3, 4, 6, 8] and len(losses) == 8
    finetune.main(["--resume", str(out / "checkpoints" / "3"), "--device", "cpu"])
    assert [(m["step"], m["loss"], m["lm_loss"]) for m in read_metrics(out) if "loss" in m] == losses
    assert json.loads((out / "results.json").read_text()) == results
    resumed_best = read_weights(out / "best", finetune_head(out))
    assert all(np.array_equal(best[name], resumed_best[name]) for name in best)


def test_limit_train_sets_the_number_of_steps(setup, tmp_path, capsys):
    out = finetune_run(setup, tmp_path / "run", "--epochs", 1, "--limit-train", 40, "--lr", 1e-50)
    assert [m["step"] for m in read_metrics(out) if "loss" in m] == [1, 2, 3]  # 40 examples, 16 a batch
    assert "40 training" in capsys.readouterr().out


@pytest.mark.parametrize("lm_coef", [0.5, 0])
def test_lm_coef_weighs_the_auxiliary_loss(setup, tmp_path, lm_coef):
    """The objective is the task loss + lambda * LM loss; with lambda 0 no LM loss is computed or logged."""
    out = finetune_run(setup, tmp_path / "run", "--epochs", 1, "--limit-train", 32, "--lm-coef", lm_coef)
    records = [m for m in read_metrics(out) if "loss" in m]
    if lm_coef:
        assert all(
            m["objective"] == pytest.approx(m["loss"] + lm_coef * m["lm_loss"], rel=1e-5) for m in records
        )
        assert all(m["lm_loss"] > 1 for m in records)
    else:
        assert all("lm_loss" not in m and m["objective"] == m["loss"] for m in records)


def test_transfer_layers_keeps_the_first_blocks_and_redraws_the_rest(setup, tmp_path):
    """With --lr 1e-50 (0 in float32) the weights stay where they started: embeddings and block 0 as
    pre-trained, block 1 freshly initialised (unit gains, zero biases, N(0, 0.02) matrices)."""
    pretrained = {name: array.copy() for name, array in setup[1].state_dict().items()}
    out = finetune_run(
        setup, tmp_path / "run", "--epochs", 1, "--limit-train", 16, "--lr", 1e-50, "--transfer-layers", 1
    )
    state = weights(out)
    for name, array in pretrained.items():
        if name.startswith("h.1."):
            assert not np.array_equal(state[name], array), name
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight"):
                assert np.all(state[name] == 1)
            elif array.ndim == 1:
                assert np.all(state[name] == 0)
            else:
                assert 0.015 < state[name].std() < 0.025
        else:
            assert np.array_equal(state[name], array), name


def test_from_scratch_redraws_every_weight_and_keeps_the_config(setup, tmp_path):
    pretrained = setup[1]
    out = finetune_run(
        setup, tmp_path / "run", "--epochs", 1, "--limit-train", 16, "--lr", 1e-50, "--from-scratch"
    )
    state = weights(out)
    assert all(not np.array_equal(state[name], array) for name, array in pretrained.state_dict().items())
    assert json.loads((out / "config.json").read_text())["model"] == pretrained.config.to_dict()


def test_an_openai_gpt_folder_gets_the_task_tokens_added(setup, tmp_path, capsys):
    """A checkpoint in the openai-gpt layout has no task tokens: three rows are added for the
    tokenizer's; without a tokenizer the run refuses to start."""
    _, model, tokenizer, train, dev = setup
    small = GPT(GPTConfig(**{**model.config.to_dict(), "vocab_size": tokenizer.vocab_size - 3}))
    small.save_pretrained(tmp_path / "openai-gpt")
    common = [
        "--task",
        "jsonl",
        "--train",
        str(train),
        "--dev",
        str(dev),
        *FAST,
        "--epochs",
        "1",
        "--limit-train",
        "16",
    ]
    with pytest.raises(SystemExit) as stop:
        finetune.main(["--init-from", str(tmp_path / "openai-gpt"), "--out", str(tmp_path / "no"), *common])
    assert stop.value.code == 2 and "--gpt1-tokenizer" in capsys.readouterr().err
    tokenizer_dir = setup[0] / "pretrained" / "tokenizer"
    finetune.main(
        [
            "--init-from",
            str(tmp_path / "openai-gpt"),
            "--tokenizer",
            str(tokenizer_dir),
            "--out",
            str(tmp_path / "run"),
            *common,
        ]
    )
    assert "added 3 task tokens" in capsys.readouterr().out
    assert weights(tmp_path / "run")["tokens_embed.weight"].shape[0] == tokenizer.vocab_size


@pytest.mark.parametrize(
    "split, bad_row, expected",
    [
        ("train", '{"sentence": "cat mat", "label": "pos"}', "fields ['label', 'sentence'] match no task"),
        ("dev", '{"text": "cat hat", "label": "maybe"}', "unknown label 'maybe'"),
    ],
)
def test_a_bad_row_stops_the_run_or_is_counted(setup, tmp_path, capsys, split, bad_row, expected):
    """A bad row stops the run with its file and line; with --skip-bad-rows it is left out and
    counted in results.json."""
    folder, _, _, train, dev = setup
    files = {"train": train, "dev": dev}
    rows = files[split].read_text().splitlines()
    files[split] = write_jsonl(tmp_path / f"{split}.jsonl", [*rows[:2], bad_row, *rows[2:]])
    argv = [
        "--init-from",
        str(folder / "pretrained"),
        "--task",
        "jsonl",
        "--train",
        str(files["train"]),
        "--dev",
        str(files["dev"]),
        *FAST,
        "--epochs",
        "1",
        "--limit-train",
        "16",
    ]
    with pytest.raises(SystemExit) as stop:
        finetune.main([*argv, "--out", str(tmp_path / "stopped")])
    error = capsys.readouterr().err
    assert (
        stop.value.code == 2 and f"{files[split]}: line 3: {expected}" in error and "--skip-bad-rows" in error
    )
    finetune.main([*argv, "--out", str(tmp_path / "run"), "--skip-bad-rows"])
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["skipped"][split] == {"bad rows": 1}
    assert f"line 3: {expected}" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, expected",
    [
        ([], "--init-from, --task, --train, --dev required"),
        (
            ["--init-from", "{tmp}/nowhere", "--task", "jsonl", "--train", "{train}", "--dev", "{dev}"],
            "nowhere",
        ),
        (["--resume", "{tmp}/nowhere"], "--resume"),
        (
            [
                "--init-from",
                "{pretrained}",
                "--task",
                "jsonl",
                "--train",
                "{train}",
                "--dev",
                "{dev}",
                "--transfer-layers",
                "3",
            ],
            "--transfer-layers 3: the model has 2 blocks",
        ),
        (
            ["--init-from", "{pretrained}", "--task", "sst2", "--train", "{train}", "--dev", "{dev}"],
            "--train",
        ),
    ],
)
def test_usage_errors_name_the_argument(setup, tmp_path, capsys, argv, expected):
    folder, _, _, train, dev = setup
    names = {"tmp": tmp_path, "train": train, "dev": dev, "pretrained": folder / "pretrained"}
    with pytest.raises(SystemExit) as stop:
        finetune.main(
            [arg.format(**names) for arg in argv] + ["--out", str(tmp_path / "run"), "--device", "cpu"]
        )
    assert stop.value.code == 2 and expected in capsys.readouterr().err


def test_the_learning_rate_warms_up_then_decays_linearly(setup, tmp_path):
    """warmup_linear at the middle of each step's share of the run, (step + 0.5) / total: a rise
    over the warmup share, then a line down toward 0 that no step reaches."""
    out = finetune_run(
        setup, tmp_path / "run", "--epochs", 1, "--limit-train", 80, "--warmup-ratio", 0.4, "--lr", 1e-3
    )
    rates = [m["lr"] for m in read_metrics(out) if "loss" in m]
    total = len(rates)
    expected = [
        1e-3 * (x / 0.4 * (1 - x) if x <= 0.4 else 1 - x) for x in ((s + 0.5) / total for s in range(total))
    ]
    assert rates == pytest.approx(expected) and min(rates) > 0 and math.isclose(max(rates), rates[1])


def test_a_single_step_moves_the_weights_and_its_rate_matters(setup, tmp_path):
    """All the rows in one batch: one step, at a rate that is not 0, so two rates give two models."""
    runs = [
        finetune_run(setup, tmp_path / f"lr{lr}", "--epochs", 1, "--limit-train", 16, "--lr", lr)
        for lr in (1e-2, 1e-5)
    ]
    assert [len([m for m in read_metrics(out) if "loss" in m]) for out in runs] == [1, 1]
    name = "h.0.attn.c_attn.weight"
    before, after = weights(setup[0] / "pretrained")[name], [weights(out)[name] for out in runs]
    assert not np.array_equal(after[0], before) and not np.array_equal(after[1], before)
    assert not np.array_equal(*after)


def pair_rows(n, seed):
    """Pairs of texts: a score of 5 when both come from one word set, 0 when not."""
    rng = np.random.default_rng(seed)
    rows = []
    for a, b in rng.integers(0, 2, (n, 2)):
        texts = [" ".join(rng.choice(WORD_SETS[s], rng.integers(2, 5))) for s in (a, b)]
        rows.append((*texts, 5.0 * (a == b)))
    return rows


def story_rows(n, seed):
    """A context from one word set and two one-word endings, the right one from the same set."""
    rng = np.random.default_rng(seed)
    rows = []
    for word_set, right in rng.integers(0, 2, (n, 2)):
        endings = [str(rng.choice(WORD_SETS[word_set if k == right else 1 - word_set])) for k in range(2)]
        rows.append(
            {"context": " ".join(rng.choice(WORD_SETS[word_set], 4)), "choices": endings, "label": int(right)}
        )
    return rows


def stsb(rows):
    return [
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore",
        *(f"{i}\tg\tf\t2012\t{i}\ts\ts\t{a}\t{b}\t{score}" for i, (a, b, score) in enumerate(rows)),
    ]


def mrpc(rows):
    return [
        "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
        *(f"{int(score > 0)}\t{i}\t{i}\t{a}\t{b}" for i, (a, b, score) in enumerate(rows)),
    ]


@pytest.mark.parametrize(
    "task, make, metrics, main, prediction",
    [
        ("stsb", lambda n, seed: stsb(pair_rows(n, seed)), ["pearson", "spearman"], "pearson", float),
        ("mrpc", lambda n, seed: mrpc(pair_rows(n, seed)), ["accuracy", "f1"], "f1", {"0", "1"}.__contains__),
        ("jsonl", lambda n, seed: story_rows(n, seed), ["accuracy"], "accuracy", {"0", "1"}.__contains__),
    ],
)
def test_each_kind_of_task_runs_and_reports_its_metrics(
    setup, tmp_path, task, make, metrics, main, prediction
):
    """Similarity as a score (STS-B) and as classes (MRPC), and multiple choice: the dev figures
    are the task's metrics, the best epoch is picked by the main one, test predictions are of the
    task's kind."""
    folder = setup[0]
    files = {
        split: write_jsonl(tmp_path / f"{split}.txt", make(n, seed))
        for split, n, seed in (("train", 32, 1), ("dev", 16, 2), ("test", 8, 3))
    }
    splits = [arg for split, path in files.items() for arg in (f"--{split}", str(path))]
    finetune.main(
        [
            "--init-from",
            str(folder / "pretrained"),
            "--task",
            task,
            "--out",
            str(tmp_path / "run"),
            *splits,
            *FAST,
            "--epochs",
            "2",
        ]
    )
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["main_metric"] == main
    assert set(results["best"]) == {*metrics, "step", "epoch", "val_loss"}
    assert results["best"][main] == max(e[main] for e in results["epochs"])
    rows = (tmp_path / "run" / "predictions.tsv").read_text().splitlines()[1:]
    assert len(rows) == 8 and all(prediction(row.split("\t")[1]) for row in rows)


def test_ctrl_c_saves_a_checkpoint_that_resumes(setup, tmp_path):
    """SIGINT stops the run after the current step with a checkpoint; --resume carries on from it."""
    out = tmp_path / "run"
    output = ctrl_c(out, "-m", "train.finetune", *finetune_argv(setup, out, "--epochs", 1000))
    step = checkpoint_steps(out)[-1]
    assert f"interrupted after step {step}" in output
    config = json.loads((out / "config.json").read_text())
    epochs = config["settings"]["epochs"] = step // 8 + 1  # 8 steps an epoch: one more epoch's end to reach
    (out / "config.json").write_text(json.dumps(config))
    digests = out / "checkpoints" / str(step) / "digests.json"  # the edit made the run's own
    digests.write_text(json.dumps(dependencies(out)))
    finetune.main(["--resume", str(out), "--device", "cpu"])
    assert checkpoint_steps(out)[-1] == 8 * epochs
    assert [m["step"] for m in read_metrics(out) if "loss" in m] == list(range(1, 8 * epochs + 1))


def test_the_default_rate_is_the_papers_for_gpt1_and_the_nearest_presets_for_other_widths():
    """GPT-1's width fine-tunes at the paper's 6.25e-5; a model of any width takes the rate of the
    preset nearest it, and the small presets' rates are larger than the paper's."""
    assert finetune.default_lr(GPTConfig.gpt1()) == 6.25e-5
    assert finetune.default_lr(GPTConfig(n_embd=1024, n_head=16)) == 6.25e-5
    assert finetune.default_lr(GPTConfig(n_embd=320, n_head=4)) == finetune.DEFAULT_LR["mini"]
    assert finetune.default_lr(GPTConfig(n_embd=32, n_head=4)) == finetune.DEFAULT_LR["tiny"]
    assert min(finetune.DEFAULT_LR["mini"], finetune.DEFAULT_LR["tiny"]) > 6.25e-5


def test_a_fine_tune_without_lr_runs_and_records_its_models_default(setup, tmp_path, capsys):
    """No --lr: the 32-wide model of the fixture trains at tiny's rate, which config.json records
    (so that a resume keeps it) and the run prints."""
    folder, _, _, train, dev = setup
    out = tmp_path / "run"
    argv = ["--init-from", str(folder / "pretrained"), "--task", "jsonl", "--train", str(train)]
    finetune.main([*argv, "--dev", str(dev), "--out", str(out), "--epochs", "1", "--device", "cpu"])
    _, settings = read_config(out)
    assert settings["lr"] == finetune.DEFAULT_LR["tiny"]
    assert f"peak learning rate {finetune.DEFAULT_LR['tiny']:g}" in capsys.readouterr().out
