"""python -m train.evaluate predict, and finetune --test, on files without labels: tiny fine-tunes
on generated SST-2 and jsonl files, then their predictions on GLUE's test layout and on JSON lines,
with the files' ids, equal to those of the labelled path."""

import argparse
import json
import shutil

import pytest

from train import finetune
from train.evaluate import main
from train.predict import output_path

from .runs import tiny_run
from .test_finetune import FAST, examples, pretrained_run, write_jsonl

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
