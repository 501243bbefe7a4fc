"""python -m train.evaluate perplexity on a tiny run folder: the figures against the negative
log-likelihood worked out here token by token, reading the data, and usage errors."""

import json
import math

import numpy as np
import pytest

import autograd as ag
from autograd import backend
from train.evaluate import main

from .runs import finished, tiny_run

N_CTX = 16
TEXTS = {  # non-ASCII text too, so bytes and characters differ
    "a.txt": "the cat sat on the mat, and the dog sat on the log. " * 4 + "naïve café — 日本語.\n",
    "b.txt": "a story: the end is near, the cat said to the dog on the mat.\n" * 2,
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("run")
    model, tokenizer = tiny_run(folder, n_ctx=N_CTX)
    data = tmp_path_factory.mktemp("data")
    for name, text in TEXTS.items():
        (data / name).write_text(text, encoding="utf-8")
    return folder, data, model, tokenizer


def nll_by_hand(model, ids):
    """Negative log-likelihood (nats) of ids[1:]: token j is predicted from the tokens since the
    start of its window, the multiple of n_ctx just below j (windows start every n_ctx tokens)."""
    total = 0.0
    with ag.no_grad():
        for j in range(1, len(ids)):
            start = (j - 1) // N_CTX * N_CTX
            logits = backend.to_host(model(np.array([ids[start:j]])).data)[0, -1].astype(np.float64)
            log_probs = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
            total -= log_probs[ids[j]]
    return total


def evaluate(capsys, *argv):
    results = main(["perplexity", *map(str, argv)])
    return results, capsys.readouterr().out


@pytest.mark.parametrize("batch_size", [1, 2, 8])
def test_perplexity_and_bits_per_byte_of_one_file(run, capsys, batch_size):
    folder, data, model, tokenizer = run
    text = TEXTS["a.txt"]
    ids = tokenizer.encode(text)
    assert len(ids) > 3 * N_CTX and (len(ids) - 1) % N_CTX  # several windows, the last one partial
    results, out = evaluate(
        capsys, "--run", folder, "--data", data / "a.txt", "--batch-size", batch_size, "--device", "cpu"
    )
    nll = nll_by_hand(model, ids)
    assert results["tokens"] == len(ids) - 1
    assert results["bytes"] == len(text.encode("utf-8"))
    assert results["perplexity"] == pytest.approx(math.exp(nll / (len(ids) - 1)), rel=1e-5)
    assert results["bits_per_byte"] == pytest.approx(nll / math.log(2) / len(text.encode("utf-8")), rel=1e-5)
    for figure in (
        f"{results['perplexity']:.4f}",
        f"{results['bits_per_byte']:.4f}",
        str(len(ids) - 1),
        str(results["bytes"]),
    ):
        assert figure in out


def test_a_folder_is_its_files_in_order_and_json_holds_the_figures(run, capsys, tmp_path):
    folder, data, model, tokenizer = run
    ids = tokenizer.encode(TEXTS["a.txt"]) + tokenizer.encode(TEXTS["b.txt"])
    results, _ = evaluate(capsys, "--run", folder, "--data", data, "--json", tmp_path / "ppl.json")
    assert results["tokens"] == len(ids) - 1
    assert results["bytes"] == sum(len(text.encode("utf-8")) for text in TEXTS.values())
    assert results["loss"] == pytest.approx(nll_by_hand(model, ids) / (len(ids) - 1), rel=1e-5)
    written = json.loads((tmp_path / "ppl.json").read_text())
    assert {key: written[key] for key in results} == results
    glob_results, _ = evaluate(capsys, "--run", folder, "--data", data / "b.txt", data / "a.*")
    assert glob_results["tokens"] == results["tokens"] and glob_results["loss"] != results["loss"]


@pytest.mark.parametrize("in_second_file", [False, True])
def test_max_tokens_cuts_the_token_stream(run, capsys, in_second_file):
    folder, data, model, tokenizer = run
    first, second = tokenizer.encode(TEXTS["a.txt"]), tokenizer.encode(TEXTS["b.txt"])
    limit = len(first) + 7 if in_second_file else 21
    kept = (first + second)[:limit]
    results, _ = evaluate(capsys, "--run", folder, "--data", data, "--max-tokens", limit)
    assert results["tokens"] == limit - 1
    whole_texts, cut_ids = ([TEXTS["a.txt"]], second[:7]) if in_second_file else ([], first[:21])
    spelled = "".join(whole_texts) + tokenizer.decode(cut_ids)  # the text the kept tokens spell
    assert results["bytes"] == len(spelled.encode("utf-8"))
    assert results["loss"] == pytest.approx(nll_by_hand(model, kept) / (limit - 1), rel=1e-5)


def test_a_file_that_is_not_utf8_is_named_with_the_byte_offset(run, capsys, tmp_path):
    folder, _, _, _ = run
    (tmp_path / "latin1.txt").write_bytes("the café".encode("latin-1"))
    with pytest.raises(SystemExit) as exit_info:
        main(["perplexity", "--run", str(folder), "--data", str(tmp_path)])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "--data" in error and "latin1.txt" in error and "at byte 7" in error


@pytest.mark.parametrize(
    "argv, named",
    [
        (["perplexity", "--run", "{missing}", "--data", "{data}"], "--run"),
        (["perplexity", "--run", "{run}", "--data", "{missing}"], "--data"),
        (["perplexity", "--run", "{run}", "--data", "{missing}/*.txt"], "--data"),
        (["perplexity", "--run", "{run}", "--data", "{tiny}"], "--data"),
        (["perplexity", "--run", "{run}", "--data", "{data}", "--batch-size", "0"], "--batch-size"),
        (["perplexity", "--run", "{run}", "--data", "{data}", "--max-tokens", "-3"], "--max-tokens"),
        (["perplexity", "--run", "{run}", "--data", "{data}", "--device", "gpu"], "--device"),
        (["perplexity", "--run", "{run}", "--data", "{data}", "--json", "{missing}/out.json"], "--json"),
        (["perplexity", "--run", "{run}"], "--data"),
        (["--run", "{run}"], "COMMAND"),
    ],
)
def test_bad_arguments_are_usage_errors_naming_the_argument(run, tmp_path, capsys, argv, named):
    folder, data, _, _ = run
    (tmp_path / "one_token.txt").write_text("a", encoding="utf-8")
    paths = dict(run=folder, data=data, missing=tmp_path / "nowhere", tiny=tmp_path / "one_token.txt")
    with pytest.raises(SystemExit) as exit_info:
        main([arg.format(**paths) for arg in argv])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert named in error and "Traceback" not in error


def test_runs_as_a_module(run):
    folder, data, _, _ = run
    result = finished(
        "-m",
        "train.evaluate",
        "perplexity",
        "--run",
        str(folder),
        "--data",
        str(data / "b.txt"),
        "--device",
        "cpu",
    )
    assert result.returncode == 0, result.stderr
    assert "perplexity" in result.stdout and "bits per byte" in result.stdout
