"""python -m train.evaluate predict, and finetune --test, on files without labels: tiny fine-tunes
on generated SST-2 and jsonl files, then their predictions on GLUE's test layout and on JSON lines,
with the files' ids, equal to those of the labelled path."""

import argparse
import json
import os
import shutil
from pathlib import Path

import pytest

from train import finetune
from train.evaluate import main
from train.predict import output_path

from .runs import FAST, examples, pretrained_run, tiny_run, write_jsonl

SST2_LABEL = {"neg": "0", "pos": "1"}


def write_tsv(path, header, rows):
    path.write_text("".join("\t".join(map(str, cells)) + "\n" for cells in [header, *rows]), encoding="utf-8")
    return path


def fine_tune(folder, task, extension, test):
    splits = [arg for split in ("train", "dev") for arg in (f"--{split}", folder / f"{split}.{extension}")]
    argv = ["--init-from", folder / "pretrained", "--task", task, *splits, "--test", folder / test]
    finetune.main([*map(str, argv), "--out", str(folder / task), "--epochs", "1", *FAST])
    return folder / task


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The data folder with an SST-2 fine-tune tested on a labelled file, a jsonl one on an
    unlabelled file, and the test files: the same 12 texts with and without labels."""
    folder = tmp_path_factory.mktemp("predict")
    pretrained_run(folder / "pretrained")
    splits = {"train": examples(64, seed=1), "dev": examples(32, seed=2), "test": examples(12, seed=3)}
    for split, rows in splits.items():
        sst2 = [(row["text"], SST2_LABEL[row["label"]]) for row in rows]
        write_tsv(folder / f"{split}.tsv", ["sentence", "label"], sst2)
        write_jsonl(folder / f"{split}.jsonl", rows)
    texts = [row["text"] for row in splits["test"]]
    write_tsv(
        folder / "test.unlabelled.tsv", ["index", "sentence"], [(100 + i, t) for i, t in enumerate(texts)]
    )
    write_jsonl(folder / "test.unlabelled.jsonl", [{"id": f"q{i}", "text": t} for i, t in enumerate(texts)])
    fine_tune(folder, "sst2", "tsv", "test.tsv")
    fine_tune(folder, "jsonl", "jsonl", "test.unlabelled.jsonl")
    return folder


def rows_of(path):
    return [line.split("\t") for line in path.read_text().splitlines()]


def predict(*argv):
    return main(["predict", *map(str, argv), "--device", "cpu"])


def test_a_glue_test_file_gets_its_submission_file(runs, tmp_path):
    """SST-2.tsv in --out (a folder): GLUE's header, the test file's indices, and the predictions
    of finetune --test on the same sentences with labels."""
    assert predict(
        "--run", runs / "sst2", "--task", "sst2", "--data", runs / "test.unlabelled.tsv", "--out", tmp_path
    ) == {"predictions": str(tmp_path / "SST-2.tsv")}
    rows = rows_of(tmp_path / "SST-2.tsv")
    labelled = rows_of(runs / "sst2" / "predictions.tsv")
    assert rows[0] == labelled[0] == ["index", "prediction"]
    assert [index for index, _ in rows[1:]] == [str(100 + i) for i in range(12)]
    assert {prediction for _, prediction in rows[1:]} <= {"0", "1"}
    assert [prediction for _, prediction in rows[1:]] == [prediction for _, prediction in labelled[1:]]


def test_jsonl_output_gives_each_labels_probability(runs, tmp_path):
    out = tmp_path / "sst2.jsonl"
    predict("--run", runs / "sst2", "--data", runs / "test.unlabelled.tsv", "--out", out, "--format", "jsonl")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    labelled = rows_of(runs / "sst2" / "predictions.tsv")[1:]
    assert [row["index"] for row in rows] == [str(100 + i) for i in range(12)]
    assert [row["prediction"] for row in rows] == [prediction for _, prediction in labelled]
    for row in rows:
        probabilities = row["probabilities"]
        assert set(probabilities) == {"0", "1"} and sum(probabilities.values()) == pytest.approx(1, abs=1e-5)
        assert max(probabilities, key=probabilities.get) == row["prediction"]


def test_finetune_and_predict_keep_the_ids_of_an_unlabelled_jsonl_file(runs):
    """finetune --test on a file without labels writes its predictions and measures nothing; predict
    on the run's task by default writes the same predictions, as JSON lines in the run folder."""
    run = runs / "jsonl"
    assert json.loads((run / "results.json").read_text())["test"] is None
    rows = rows_of(run / "predictions.tsv")
    assert [index for index, _ in rows[1:]] == [f"q{i}" for i in range(12)]
    assert {prediction for _, prediction in rows[1:]} <= {"neg", "pos"}
    assert predict("--run", run, "--data", runs / "test.unlabelled.jsonl") == {
        "predictions": str(run / "predictions.jsonl")
    }
    lines = [json.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines()]
    assert [[line["index"], line["prediction"]] for line in lines] == rows[1:]


def test_a_labelled_file_gets_the_same_predictions_and_its_metrics(runs, tmp_path, capsys):
    out = tmp_path / "labelled.tsv"
    results = predict(
        "--run", runs / "jsonl", "--data", runs / "test.jsonl", "--out", out, "--format", "glue"
    )
    assert set(results) == {"predictions", "loss", "accuracy"}
    assert f"accuracy {results['accuracy']:.4f}" in capsys.readouterr().out
    labelled, unlabelled = rows_of(out), rows_of(runs / "jsonl" / "predictions.tsv")
    assert [index for index, _ in labelled[1:]] == [str(i) for i in range(12)]  # no ids: places
    assert [prediction for _, prediction in labelled[1:]] == [prediction for _, prediction in unlabelled[1:]]


@pytest.mark.parametrize(
    "task, data, name",
    [("mnli", "glue/MNLI/test_mismatched.tsv", "MNLI-mm.tsv"), ("stsb", "test.tsv", "STS-B.tsv")]
    + [("rte", "test.tsv", "RTE.tsv"), ("jsonl", "test.jsonl", "predictions.tsv")],
)
def test_a_folder_to_write_to_gets_the_glue_submissions_file_name(task, data, name):
    args = argparse.Namespace(out=None, run="runs/x", data=data)
    assert output_path(args, task, "glue") == f"runs/x/{name}"


def test_usage_errors_name_the_argument(runs, tmp_path, capsys):
    no_best = tmp_path / "no-best"
    shutil.copytree(runs / "sst2", no_best, ignore=shutil.ignore_patterns("best"))
    wrong = write_tsv(tmp_path / "wrong.tsv", ["index", "text"], [(0, "a cat")])
    other_tokenizer = tmp_path / "other-tokenizer"  # the run with another run's tokenizer, of 300 tokens
    shutil.copytree(runs / "sst2", other_tokenizer, ignore=shutil.ignore_patterns("tokenizer"))
    tiny_run(tmp_path / "tiny")
    shutil.copytree(tmp_path / "tiny" / "tokenizer", other_tokenizer / "tokenizer")
    for digests in other_tokenizer.rglob("digests.json"):  # as a run from before the digests were recorded
        digests.unlink()
    data = runs / "test.unlabelled.tsv"
    cases = [
        (
            [runs / "sst2", "--task", "cola", "--data", data],
            f"--task: {runs / 'sst2'} is a fine-tune on sst2",
        ),
        ([no_best, "--data", data], f"--run: {no_best} has no best/ weights"),
        ([runs / "pretrained", "--data", data], f"--run: {runs / 'pretrained'} is not a fine-tuning run"),
        ([runs / "sst2", "--data", wrong], f"--data: {wrong}: line 1: the header has no column 'sentence'"),
        ([other_tokenizer, "--data", data], f"--run: {other_tokenizer}: the model has 276 tokens and"),
        ([runs / "sst2", "--data", data, "--out", tmp_path / "nowhere" / "x.tsv"], "--out: the folder of"),
    ]
    for argv, expected in cases:
        with pytest.raises(SystemExit):
            predict("--run", *argv)
        assert f"error: {expected}" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        finetune.main(
            [*map(str, ["--init-from", runs / "pretrained", "--task", "sst2", "--train", data]), "--dev"]
            + [str(runs / "dev.tsv"), "--out", str(tmp_path / "run"), *FAST]
        )
    assert f"error: --train: {data} has no labels" in capsys.readouterr().err


def test_an_output_on_what_predict_reads_is_refused_and_the_file_kept(runs, tmp_path, capsys):
    data = tmp_path / "test.tsv"
    shutil.copy(runs / "test.unlabelled.tsv", data)
    run = runs / "sst2"
    records = [run / name for name in ("metrics.jsonl", "results.json", "labels.json")]
    for out, flag in [(data, "--data"), (run / "config.json", "--run"), (run / "best", "--run")] + [
        (record, "--run") for record in records
    ]:
        before = sorted((p, p.read_bytes()) for p in ([out] if out.is_file() else out.rglob("*.*")))
        with pytest.raises(SystemExit):
            predict("--run", run, "--data", data, "--out", out)
        error = capsys.readouterr().err
        assert f"error: --out: {out}" in error and f" {flag} " in error and "apart from the inputs" in error
        assert sorted((p, p.read_bytes()) for p in ([out] if out.is_file() else out.rglob("*.*"))) == before
    with pytest.raises(SystemExit):
        main(["perplexity", "--run", str(runs / "pretrained"), "--data", str(data), "--json", str(data)])
    assert f"error: --json: {data} is --data {data}" in capsys.readouterr().err


def test_a_checkpoint_folder_of_a_fine_tune_predicts_with_its_weights(runs, tmp_path):
    """--run a checkpoint of a fine-tune (as --help allows): its weights, with the run's tokenizer
    and labels; after one epoch the checkpoint is the best epoch, so the predictions are best/'s."""
    [checkpoint] = [path for path in (runs / "jsonl" / "checkpoints").iterdir() if path.name.isdigit()]
    data = runs / "test.unlabelled.jsonl"
    for run, name in [(checkpoint, "checkpoint.jsonl"), (runs / "jsonl", "best.jsonl")]:
        predict("--run", run, "--data", data, "--out", tmp_path / name)
    assert (tmp_path / "checkpoint.jsonl").read_text() == (tmp_path / "best.jsonl").read_text()


def test_a_file_of_another_layout_than_the_runs_is_refused_with_its_line(runs, tmp_path, capsys):
    rows = [{"text": "a cat", "id": "q0"}, {"premise": "a cat", "hypothesis": "a dog", "id": "q1"}]
    other = write_jsonl(tmp_path / "other.jsonl", rows)
    with pytest.raises(SystemExit):
        predict("--run", runs / "jsonl", "--data", other, "--out", tmp_path / "p.jsonl")
    expected = f"--data: {other}: line 2: fields hypothesis, premise, not the training examples' label, text"
    assert expected in capsys.readouterr().err and not (tmp_path / "p.jsonl").exists()


def test_a_blank_line_names_the_flag_of_predict_that_leaves_it_out(runs, tmp_path, capsys):
    data = tmp_path / "blank.tsv"
    data.write_text("index\tsentence\n7\ta cat\n\n8\ta dog\n", encoding="utf-8")
    with pytest.raises(SystemExit):
        predict("--run", runs / "sst2", "--data", data, "--out", tmp_path)
    err = capsys.readouterr().err
    assert f"{data}: line 3: expected 2 tab-separated columns, got 0 (--skip-bad-rows leaves" in err
    predict("--run", runs / "sst2", "--data", data, "--out", tmp_path, "--skip-bad-rows")
    assert [index for index, _ in rows_of(tmp_path / "SST-2.tsv")[1:]] == ["7", "8"]
    assert f"skipped 1 bad rows, the first: {data}: line 3" in capsys.readouterr().out


def test_special_tokens_as_text_reads_their_names_as_plain_text(runs, tmp_path):
    """A text holding _classify_ and _start_: as the task's tokens by default, as plain text with the
    flag, or by default after a fine-tune that read its examples so."""
    data = write_jsonl(tmp_path / "special.jsonl", [{"text": "cat _classify_ mat _start_ hat", "id": 0}])

    def probabilities(run, *flags):
        predict("--run", run, "--data", data, "--out", tmp_path / "p.jsonl", *flags)
        return json.loads((tmp_path / "p.jsonl").read_text())["probabilities"]

    as_tokens, as_text = (
        probabilities(runs / "jsonl"),
        probabilities(runs / "jsonl", "--special-tokens-as-text"),
    )
    assert as_tokens != as_text
    splits = [arg for split in ("train", "dev") for arg in (f"--{split}", runs / f"{split}.jsonl")]
    argv = ["--init-from", runs / "pretrained", "--task", "jsonl", *splits, "--out", tmp_path / "run"]
    finetune.main(
        [*map(str, argv), "--epochs", "1", "--limit-train", "16", "--special-tokens-as-text", *FAST]
    )
    assert json.loads((tmp_path / "run" / "config.json").read_text())["settings"]["special_tokens_as_text"]
    assert probabilities(tmp_path / "run") == probabilities(tmp_path / "run", "--special-tokens-as-text")


def outputs(runs, tmp_path, out):
    """{name: evaluate's argv} of every command that writes a file a flag names, to `out`."""
    (tmp_path / "text.txt").write_text("the cat sat on the mat. " * 20, encoding="utf-8")
    perplexity = ["perplexity", "--run", runs / "pretrained", "--data", tmp_path / "text.txt"]
    predicting = ["predict", "--run", runs / "sst2", "--data", runs / "test.unlabelled.tsv", "--out", out]
    return {
        "predict --out": predicting,
        "predict --format jsonl --out": [*predicting, "--format", "jsonl"],
        "perplexity --json": [*perplexity, "--json", out],
        "zeroshot --json": ["zeroshot", "--run", runs / "pretrained", "--task", "sst2", "--data",
                            runs / "test.tsv", "--json", out],
    }  # fmt: skip


def full_disk(descriptor):
    raise OSError(28, "No space left on device")


@pytest.mark.parametrize(
    "command", ["predict --out", "predict --format jsonl --out", "perplexity --json", "zeroshot --json"]
)
@pytest.mark.parametrize("full", ["/dev/full", "a regular file"])
def test_an_output_that_cannot_be_written_names_its_flag_and_file_and_leaves_none_of_it(
    runs, tmp_path, capsys, monkeypatch, command, full
):
    """A full disk: one line naming the flag and the file, status 1; a file there before is kept as it
    was and no part of the new one is left beside it."""
    out = Path("/dev/full") if full == "/dev/full" else tmp_path / "out" / "figures"
    if full == "a regular file":
        out.parent.mkdir()
        out.write_text("what was there")
        monkeypatch.setattr(os, "fsync", full_disk)
    argv = [*map(str, outputs(runs, tmp_path, out)[command]), "--device", "cpu"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    flag = command.split()[-1]
    assert line.endswith(f"error: {flag}: {out}: No space left on device; nothing was written"), line
    if full == "a regular file":
        assert out.read_text() == "what was there" and os.listdir(out.parent) == ["figures"]
