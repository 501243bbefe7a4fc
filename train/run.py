"""The run folder every training module writes, and reading one back.

A run folder holds:
    config.json      the model config and the settings the run was started with
    tokenizer/       the tokenizer's files (byte-level BPE, or GPT-1's original two files)
    checkpoints/     see train/checkpoint.py
    metrics.jsonl    one JSON object per line: {"step", "loss", ...} or {"step", "val_loss", ...}
    loss.png         the loss curve, when matplotlib is installed
"""

import json
import os
import shutil
import time

from tinygpt import GPT, GPTConfig
from tinygpt.tokenizer import BPETokenizer, GPT1Tokenizer

from .checkpoint import find_checkpoint, remove_partials, write_json


def save_tokenizer(tokenizer, run_dir):
    tokenizer.save(os.path.join(run_dir, "tokenizer"))


def load_tokenizer(directory):
    """A tokenizer from a folder: GPT-1's original files if they are there, else byte-level BPE."""
    if os.path.isfile(os.path.join(directory, GPT1Tokenizer.FILES[0])):
        return GPT1Tokenizer.from_folder(directory)
    if not os.path.isfile(os.path.join(directory, "vocab.json")):
        raise FileNotFoundError(
            f"{directory}: no tokenizer here (expected vocab.json + merges.txt, "
            f"or {' + '.join(GPT1Tokenizer.FILES)})"
        )
    return BPETokenizer.load(directory)


def write_config(run_dir, model_config, settings):
    write_json(os.path.join(run_dir, "config.json"), {"model": model_config.to_dict(), "settings": settings})


def read_config(run_dir):
    """(GPTConfig, settings dict) from a run's config.json."""
    path = os.path.join(run_dir, "config.json")
    try:
        with open(path) as f:
            config = json.load(f)
        return GPTConfig(**config["model"]), config["settings"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: not a tinygpt run config ({error})") from None


RUN_FILES = ("config.json", "tokenizer", "checkpoints", "metrics.jsonl", "loss.png", "labels.json")
RUN_FILES += ("best", "results.json", "predictions.tsv")  # a fine-tune's


def check_new_run_folder(path, overwrite=False):
    """Raise ValueError unless a new run may go to `path`: a folder that does not exist or is
    empty, or (with `overwrite`) any folder, whose run files empty_run_folder then removes."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{path} is a file, not a folder")
    entries = sorted(os.listdir(path)) if os.path.isdir(path) else []
    if entries and not overwrite:
        held = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
        raise ValueError(
            f"{path} is not empty (it holds {held}): --resume the run there, pass --overwrite to "
            f"replace its run, or choose another folder"
        )


def empty_run_folder(path):
    """Remove a run's files from `path` (--overwrite), leaving any other file there alone."""
    remove_partials(path)
    for name in RUN_FILES:
        target = os.path.join(path, name)
        if os.path.isdir(target):
            shutil.rmtree(target)
        elif os.path.exists(target):
            os.remove(target)


def new_run_folder(name):
    """runs/<name>-<date>-<time>: where a new run goes unless --out says otherwise."""
    return os.path.join("runs", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")


def run_folder_of(path):
    """The run folder of a checkpoint folder (run/checkpoints/<step>); any other folder as it is."""
    parent = os.path.dirname(os.path.abspath(path))
    return os.path.dirname(parent) if os.path.basename(parent) == "checkpoints" else path


def load_run(path, device="cpu"):
    """(model, tokenizer) from a run folder (its newest checkpoint) or from one checkpoint folder
    inside a run, on `device` and in eval mode."""
    checkpoint = find_checkpoint(path)
    run_dir = run_folder_of(checkpoint)
    model = GPT.from_pretrained(checkpoint, device=device).eval()
    return model, load_tokenizer(os.path.join(run_dir, "tokenizer"))


def append_metrics(run_dir, record):
    """Add one line to metrics.jsonl (flushed, so a crash keeps every line written)."""
    with open(os.path.join(run_dir, "metrics.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()


def read_metrics(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def rewrite_metrics(run_dir, records):
    """Replace metrics.jsonl with `records` (a resumed run drops the lines after its checkpoint)."""
    path = os.path.join(run_dir, "metrics.jsonl")
    with open(path + ".partial", "w") as f:
        f.writelines(json.dumps(record) + "\n" for record in records)
    os.replace(path + ".partial", path)


def loss_figure(metrics, title):
    """The figure of loss.png, drawn from the records of metrics.jsonl.

    Pretraining: the training and validation loss (nats per token) by step. A fine-tune, whose dev
    records carry an epoch: its task loss L2 on the training batches and on the dev set, and in a
    second panel the dev metrics measured after each epoch."""
    from matplotlib.figure import Figure

    dev = [m for m in metrics if "epoch" in m]
    labels = ("training batches", "dev set") if dev else ("training", "validation")
    figure = Figure(figsize=(12 if dev else 7, 4))
    panels = figure.subplots(1, 2 if dev else 1, squeeze=False)[0]
    for key, label, marker in (("loss", labels[0], None), ("val_loss", labels[1], "o")):
        points = [(m["step"], m[key]) for m in metrics if key in m]
        if points:
            panels[0].plot(*zip(*points), label=label, marker=marker)
    panels[0].set(xlabel="step", ylabel="task loss L2 (no LM term)" if dev else "loss (nats per token)")
    panels[0].legend()
    if dev:
        for name in [key for key in dev[0] if key not in ("step", "epoch", "val_loss")]:
            panels[1].plot([m["step"] for m in dev], [m[name] for m in dev], label=name, marker="o")
        panels[1].set(xlabel="step", ylabel="dev metric", title="the dev set after each epoch")
        panels[1].legend()
    figure.suptitle(title)
    return figure


def plot_metrics(run_dir):
    """Draw loss.png (see loss_figure); returns its path, or None when matplotlib is not installed
    (the quick start installs it: pip install -e '.[plot]')."""
    try:
        figure = loss_figure(read_metrics(run_dir), os.path.basename(os.path.abspath(run_dir)))
    except ImportError:
        return None
    path = os.path.join(run_dir, "loss.png")
    figure.savefig(path, dpi=100, bbox_inches="tight")
    return path
