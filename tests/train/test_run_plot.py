"""loss.png: pretraining's losses, and a fine-tune's task loss L2 beside its dev metrics."""

import os

import pytest

from train.run_folder import append_metrics, loss_figure, plot_metrics

PRETRAIN = [
    {"step": 1, "loss": 5.0, "lr": 1e-4},
    {"step": 2, "loss": 4.0, "lr": 1e-4},
    {"step": 2, "val_loss": 4.5, "val_perplexity": 90.0},
]
FINETUNE = [  # as train.finetune logs them: training batches by step, the dev set after each epoch
    {"step": 1, "loss": 0.7, "objective": 3.2, "lm_loss": 5.0, "lr": 1e-4},
    {"step": 2, "loss": 0.6, "objective": 3.0, "lm_loss": 4.8, "lr": 1e-4},
    {"step": 2, "epoch": 1, "val_loss": 0.65, "accuracy": 0.6, "f1": 0.5},
    {"step": 4, "loss": 0.4, "objective": 2.8, "lm_loss": 4.8, "lr": 1e-4},
    {"step": 4, "epoch": 2, "val_loss": 0.5, "accuracy": 0.8, "f1": 0.75},
]


def lines(panel):
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in panel.get_lines()}


def test_a_fine_tunes_plot_names_its_task_loss_and_shows_the_dev_metrics():
    pytest.importorskip("matplotlib")
    losses, dev = loss_figure(FINETUNE, "run").axes
    assert "task loss L2" in losses.get_ylabel()
    assert lines(losses) == {
        "training batches": ([1, 2, 4], [0.7, 0.6, 0.4]),
        "dev set": ([2, 4], [0.65, 0.5]),
    }
    assert "dev" in dev.get_title()
    assert lines(dev) == {"accuracy": ([2, 4], [0.6, 0.8]), "f1": ([2, 4], [0.5, 0.75])}


def test_pretrainings_plot_is_one_panel_of_training_and_validation_loss():
    pytest.importorskip("matplotlib")
    [losses] = loss_figure(PRETRAIN, "run").axes
    assert losses.get_ylabel() == "loss (nats per token)"
    assert lines(losses) == {"training": ([1, 2], [5.0, 4.0]), "validation": ([2], [4.5])}


def test_plot_metrics_writes_loss_png(tmp_path):
    pytest.importorskip("matplotlib")
    for record in FINETUNE:
        append_metrics(tmp_path, record)
    path = plot_metrics(tmp_path)
    with open(path, "rb") as f:
        assert path.endswith("loss.png") and f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_a_run_folder_whose_name_is_not_utf8_gets_its_plot(tmp_path):
    """A name of bytes that do not decode (they arrive as lone surrogates) is escaped in the title,
    where matplotlib's fonts would refuse it."""
    folder = tmp_path / os.fsdecode(b"run-\xff")
    folder.mkdir()
    append_metrics(folder, {"step": 1, "loss": 3.0, "lr": 0.1})
    assert plot_metrics(folder) == os.path.join(folder, "loss.png") and (folder / "loss.png").exists()
