"""python -m train.evaluate zeroshot | attention | summary on a tiny run folder: the zero-shot
scores against log-probabilities worked out here one position at a time, the attention weights
against the model's own attention output, and the parameter and FLOP counts against the config."""

import json
import math
import sys

import numpy as np
import pytest

import autograd as ag
from autograd import backend
from train import inspection
from train.evaluate import main
from train.inspection import attention_weights, draw_attention
from train.zeroshot import best_threshold, continuation_log_probs

from .runs import tiny_run

N_CTX = 16


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("run")
    model, tokenizer = tiny_run(folder, n_ctx=N_CTX)
    return folder, model, tokenizer


def log_probs_by_hand(model, ids):
    """log P(ids[j] | ids[:j]) for j = 1.., one forward pass per position, in float64."""
    out = []
    with ag.no_grad():
        for j in range(1, len(ids)):
            logits = backend.to_host(model(np.array([ids[max(0, j - N_CTX) : j]])).data)[0, -1].astype(
                np.float64
            )
            out.append(logits[ids[j]] - logits.max() - np.log(np.exp(logits - logits.max()).sum()))
    return np.array(out)


def continuation_by_hand(model, context, continuation):
    """The summed log-probability of the continuation's tokens, the context cut from the left to
    fit n_ctx + 1 tokens in all."""
    ids = (context + continuation)[-(N_CTX + 1) :]
    n = min(len(continuation), len(ids) - 1)
    return log_probs_by_hand(model, ids)[len(ids) - 1 - n :].sum(), n


# ----- zeroshot --------------------------------------------------------------------------------
@pytest.mark.parametrize("batch_size", [1, 3])
def test_continuation_log_probs_agree_with_one_position_at_a_time(run, batch_size):
    """Padded batches, several lengths, a context longer than n_ctx, a one-token text."""
    _, model, tokenizer = run
    encode = tokenizer.encode
    pairs = [
        (encode("the cat sat"), encode(" on the mat.")),
        (encode("a dog"), encode(" met a cat")),
        (encode("the end of the story is near. " * 3), encode(" the end")),
        (encode("the"), []),
    ]
    totals, counts = continuation_log_probs(model, pairs, batch_size)
    for (context, continuation), total, count in zip(pairs, totals, counts):
        expected, n = continuation_by_hand(model, context, continuation)
        assert count == n and total == pytest.approx(expected, rel=1e-4, abs=1e-4)


def test_best_threshold_separates_what_can_be_separated():
    scores = np.array([-3.0, -1.0, -2.5, -0.5, -2.0])
    labels = np.array([0, 1, 0, 1, 1])
    threshold = best_threshold(scores, labels)
    assert -2.5 < threshold < -2.0  # every acceptable sentence above it, every other below


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


SST2 = ["the cat sat on the mat.", "the dog sat on the log.", "a cat and a dog met.", "the end is near."]


def test_zeroshot_sst2_compares_positive_and_negative_after_very(run, tmp_path, capsys):
    folder, model, tokenizer = run
    data = write(
        tmp_path / "dev.tsv", "sentence\tlabel\n" + "".join(f"{s}\t{i % 2}\n" for i, s in enumerate(SST2))
    )
    results = main(
        [
            "zeroshot",
            "--run",
            str(folder),
            "--task",
            "sst2",
            "--data",
            str(data),
            "--device",
            "cpu",
            "--json",
            str(tmp_path / "out.json"),
        ]
    )
    predictions = []
    for text in SST2:
        context = tokenizer.encode(text + " very")
        positive, negative = (
            continuation_by_hand(model, context, tokenizer.encode(word))[0]
            for word in (" positive", " negative")
        )
        predictions.append(int(positive > negative))
    expected = np.mean(np.array(predictions) == np.arange(len(SST2)) % 2)
    assert results["accuracy"] == pytest.approx(expected)
    assert json.loads((tmp_path / "out.json").read_text())["accuracy"] == results["accuracy"]
    assert f"accuracy   {expected:.4f}" in capsys.readouterr().out


def test_zeroshot_cola_thresholds_the_mean_log_probability(run, tmp_path):
    folder, model, tokenizer = run
    labels = [1, 0, 1, 0]
    data = write(tmp_path / "dev.tsv", "".join(f"src\t{label}\t\t{s}\n" for s, label in zip(SST2, labels)))
    means = np.array([log_probs_by_hand(model, tokenizer.encode(s)).mean() for s in SST2])
    threshold = float(np.median(means))
    results = main(
        [
            "zeroshot",
            "--run",
            str(folder),
            "--task",
            "cola",
            "--data",
            str(data),
            "--device",
            "cpu",
            "--threshold",
            str(threshold),
        ]
    )
    predictions = (means > threshold).astype(int)
    tp, tn = (
        np.sum((predictions == 1) & (np.array(labels) == 1)),
        np.sum((predictions == 0) & (np.array(labels) == 0)),
    )
    fp, fn = (
        np.sum((predictions == 1) & (np.array(labels) == 0)),
        np.sum((predictions == 0) & (np.array(labels) == 1)),
    )
    denominator = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert results["mcc"] == pytest.approx((tp * tn - fp * fn) / denominator if denominator else 0.0)
    chosen = main(
        ["zeroshot", "--run", str(folder), "--task", "cola", "--data", str(data), "--device", "cpu"]
    )
    assert chosen["mcc"] >= results["mcc"]  # the best threshold for the data does at least as well


def test_zeroshot_multiple_choice_picks_the_likeliest_answer(run, tmp_path):
    folder, model, tokenizer = run
    rows = [
        {"context": "the cat sat on the", "choices": ["mat.", "log."], "label": 0},
        {"context": "the dog sat on the", "choices": ["mat.", "log."], "label": 1},
        {"context": "a cat and a dog", "choices": ["met on a mat.", "end"], "label": 0},
    ]
    data = write(tmp_path / "dev.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    results = main(
        [
            "zeroshot",
            "--run",
            str(folder),
            "--task",
            "jsonl",
            "--data",
            str(data),
            "--device",
            "cpu",
            "--batch-size",
            "2",
        ]
    )
    right = 0
    for row in rows:
        means = [
            np.divide(
                *continuation_by_hand(model, tokenizer.encode(row["context"]), tokenizer.encode(" " + c))
            )
            for c in row["choices"]
        ]
        right += int(np.argmax(means)) == row["label"]
    assert results["accuracy"] == pytest.approx(right / len(rows))


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--task", "sst2", "--threshold", "1"], "--threshold is for --task cola"),
        (["--task", "jsonl", "--data", "{classification}"], "zero-shot on jsonl is for multiple choice"),
        (["--task", "sst2", "--data", "{tmp}/missing.tsv"], "missing.tsv"),
        (["--task", "sst2", "--data", "{unlabelled}"], "has no labels to measure the heuristic against"),
        (["--task", "sst2", "--data", "{blank}"], "got 0 (--skip-bad-rows leaves such rows out)"),
    ],
)
def test_zeroshot_usage_errors(run, tmp_path, capsys, argv, expected):
    classification = write(tmp_path / "c.jsonl", '{"text": "a cat", "label": 1}\n')
    data = write(tmp_path / "dev.tsv", "sentence\tlabel\nthe cat\t1\n")
    unlabelled = write(tmp_path / "test.tsv", "index\tsentence\n0\tthe cat\n")
    blank = write(tmp_path / "blank.tsv", "sentence\tlabel\nthe cat\t1\n\n")
    files = {"classification": classification, "unlabelled": unlabelled, "blank": blank}
    argv = [a.format(tmp=tmp_path, **files) for a in argv]
    if "--data" not in argv:
        argv += ["--data", str(data)]
    with pytest.raises(SystemExit) as stop:
        main(["zeroshot", "--run", str(run[0]), "--device", "cpu", *argv])
    assert stop.value.code == 2 and expected in capsys.readouterr().err


# ----- attention -------------------------------------------------------------------------------
def test_attention_weights_reproduce_the_layers_output(run):
    """Each row is a distribution over the positions up to its own; the weights times the values,
    heads merged and projected, are what the attention layer itself puts out."""
    _, model, tokenizer = run
    ids = tokenizer.encode("the cat sat on the mat.")
    weights = attention_weights(model, ids, 0)
    n_head, T = model.h[0].attn.n_head, len(ids)
    assert weights.shape == (n_head, T, T)
    ahead = np.triu(np.ones((T, T), dtype=bool), k=1)
    assert (
        np.allclose(weights.sum(axis=-1), 1)
        and np.all(weights[:, ahead] == 0)
        and np.all(weights[:, ~ahead] >= 0)  # float32: a far-off key may underflow to 0
    )
    with ag.no_grad():
        x = model.tokens_embed(np.array([ids])) + model.positions_embed(np.arange(T))
        attn = model.h[0].attn
        # (head, time, width)
        v = attn.c_attn(x).numpy()[0].reshape(T, 3, n_head, -1)[:, 2].transpose(1, 0, 2)
        merged = (weights @ v).transpose(1, 0, 2).reshape(T, -1)
        expected = attn(x).numpy()[0]
    projected = merged @ attn.c_proj.weight.numpy() + attn.c_proj.bias.numpy()
    assert np.allclose(projected, expected, atol=1e-4)


def attention(run, out, text="the cat sat on the mat.", layer=0):
    """python -m train.evaluate attention of `run` over `text`, to the file `out`."""
    argv = ["attention", "--run", str(run), "--text", text, "--layer", str(layer), "--out", str(out)]
    return main([*argv, "--device", "cpu"])


def test_attention_draws_a_png(run, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "attention.png"
    weights = attention(run[0], out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"{len(weights)} heads of layer 0" in capsys.readouterr().out


@pytest.mark.parametrize("n_head, rows, columns", [(12, 3, 4), (6, 2, 4), (1, 1, 1)])
def test_attention_figure_is_legible(tmp_path, n_head, rows, columns):
    """GPT-1's 12 heads over 20 tokens, and fewer: a grid of heads on one colour scale, [0, 1], with
    one colour bar; every panel's axes are the tokens, keys on x and queries on y, written and named
    on the outer panels; and once drawn no text, panel or colour bar lies over another."""
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    T, labels = 20, [f"·word{i}" for i in range(20)]
    weights = np.tril(np.random.default_rng(0).random((n_head, T, T))) / 2  # the scale stays [0, 1]
    figure = draw_attention(weights, labels, "layer 0 of a run", tmp_path / "a.png")
    heads = [ax for ax in figure.axes if ax.images]
    assert [ax.get_title() for ax in heads] == [f"head {h}" for h in range(n_head)]
    assert {ax.get_subplotspec().get_geometry()[:2] for ax in heads} == {(rows, columns)}
    assert {ax.images[0].get_clim() for ax in heads} == {(0, 1)}
    (colorbar,) = [ax.images[0].colorbar for ax in heads if ax.images[0].colorbar]
    assert colorbar.ax in figure.axes and colorbar.ax.get_ylabel()
    assert [t.get_text() for t in figure.texts] == ["layer 0 of a run"]  # the suptitle

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    drawn = [*figure.texts, colorbar.ax]
    for head, ax in enumerate(heads):
        for axis, outer in ((ax.xaxis, head + columns >= n_head), (ax.yaxis, head % columns == 0)):
            assert [tick.label1.get_text() for tick in axis.get_major_ticks()] == labels
            assert [t.get_text() for t in axis.get_ticklabels()] == (labels if outer else [])  # visible
            assert axis.get_label_text().startswith(("key", "query")) == outer
            drawn += [*axis.get_ticklabels(), axis.label] if outer else []
        drawn += [ax, ax.title]
    boxes = [(str(item), item.get_window_extent(canvas.get_renderer())) for item in drawn]
    assert [(a, b) for i, (a, box) in enumerate(boxes) for b, other in boxes[:i] if box.overlaps(other)] == []


def test_attention_without_matplotlib_says_what_to_install(run, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(SystemExit) as stop:
        attention(run[0], tmp_path / "a.png", "a cat", layer=0)
    assert stop.value.code == 2 and "pip install 'tinygpt[plot]'" in capsys.readouterr().err


def test_attention_refuses_a_layer_the_model_lacks(run, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    with pytest.raises(SystemExit) as stop:
        attention(run[0], tmp_path / "a.png", "a cat", layer=1)
    assert stop.value.code == 2 and "--layer 1: the model has blocks 0..0" in capsys.readouterr().err


def test_attention_refuses_a_file_name_no_figure_format_has_before_loading(run, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "notes.txt"
    with pytest.raises(SystemExit) as stop:
        attention(run[0], out)
    error = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(error) == 1 and f"--out: {out}: not a figure's file name" in error[-1]
    assert ".png" in error[-1] and not out.exists()


def test_attention_refuses_an_out_in_a_missing_folder_before_loading(run, tmp_path, capsys, monkeypatch):
    """As predict's and the --json of every command: a usage error before any work."""
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(inspection, "open_run", lambda *args: pytest.fail("loaded the run first"))
    out = tmp_path / "missing" / "a.png"
    with pytest.raises(SystemExit) as stop:
        attention(run[0], out)
    assert stop.value.code == 2 and f"--out: the folder of {out} does not exist" in capsys.readouterr().err
    (tmp_path / "a file").write_text("")
    with pytest.raises(SystemExit) as stop:
        attention(run[0], tmp_path / "a file" / "a.png")
    assert f"--out: {tmp_path / 'a file'} is a file, not a folder" in capsys.readouterr().err


# ----- summary ---------------------------------------------------------------------------------
@pytest.mark.parametrize("context", [None, 4])
def test_summary_counts_parameters_and_flops_per_token(run, capsys, context):
    """Parameters add up to the model's; a block costs 2 FLOPs per weight of its four matrices
    (d x 3d, d x d, d x 4d, 4d x d) plus 2*2*T*d for attention; the tied LM head 2*V*d."""
    folder, model, _ = run
    results = main(["summary", "--run", str(folder), *(["--context", str(context)] if context else [])])
    config = model.config
    d, V, T = config.n_embd, config.vocab_size, context or config.n_ctx
    rows = {name: (params, matmul, attention) for name, params, matmul, attention in results["rows"]}
    assert results["total"][1] == model.num_parameters()
    assert rows["h.0"] == (sum(p.size for _, p in model.h[0].named_parameters()), 2 * 12 * d * d, 4 * T * d)
    assert rows["tokens_embed"] == (V * d, 0, 0) and rows["lm head (tied to tokens_embed)"] == (
        0,
        2 * V * d,
        0,
    )
    printed = capsys.readouterr().out
    assert f"T = {T} tokens" in printed and f"{model.num_parameters():,}" in printed
