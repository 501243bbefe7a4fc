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
import time

from tinygpt import GPT, GPTConfig
from tinygpt.tokenizer import BPETokenizer, GPT1Tokenizer

from .checkpoint import find_checkpoint


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
    with open(os.path.join(run_dir, "config.json"), "w") as f:
        json.dump({"model": model_config.to_dict(), "settings": settings}, f, indent=2)


def read_config(run_dir):
    """(GPTConfig, settings dict) from a run's config.json."""
    path = os.path.join(run_dir, "config.json")
    try:
        with open(path) as f:
            config = json.load(f)
        return GPTConfig(**config["model"]), config["settings"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: not a tinygpt run config ({error})") from None


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


def plot_metrics(run_dir):
    """Draw loss.png from metrics.jsonl (training and validation loss by step); returns its path,
    or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    metrics = read_metrics(run_dir)
    train = [(m["step"], m["loss"]) for m in metrics if "loss" in m]
    val = [(m["step"], m["val_loss"]) for m in metrics if "val_loss" in m]
    figure, axes = plt.subplots(figsize=(7, 4))
    for points, label in ((train, "training"), (val, "validation")):
        if points:
            axes.plot(*zip(*points), label=label, marker="o" if label == "validation" else None)
    axes.set(xlabel="step", ylabel="loss (nats per token)", title=os.path.basename(os.path.abspath(run_dir)))
    axes.legend()
    path = os.path.join(run_dir, "loss.png")
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
    return path
