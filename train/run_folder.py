"""The run folder every training module writes, and reading one back.

A run folder holds:
    config.json      the model config and the settings the run was started with
    tokenizer/       the tokenizer's files (byte-level BPE, or GPT-1's original two files)
    checkpoints/     see train/checkpoint.py
    metrics.jsonl    one JSON object per line: {"step", "loss", ...} or {"step", "val_loss", ...}
    loss.png         the loss curve, when matplotlib is installed
    .lock            held by the run under way, which it names (see hold_folder)
"""

import fcntl
import io
import json
import os
import sys
import time
from dataclasses import fields
from pathlib import Path

from tinygpt import GPT, GPTConfig
from tinygpt.files import write_whole
from tinygpt.tokenizer import load_tokenizer
from tinygpt.weights import TOKENIZER_FILES, is_step, run_of, run_weights

from .checkpoint import WEIGHT_FILES, find_checkpoint, remove_partials, write_json


def save_tokenizer(tokenizer, run_dir):
    tokenizer.save(os.path.join(run_dir, "tokenizer"))


def write_config(run_dir, model_config, settings):
    write_json(os.path.join(run_dir, "config.json"), {"model": model_config.to_dict(), "settings": settings})


def read_config(run_dir):
    """(GPTConfig, settings dict) from a run's config.json, whose model config must be whole: a field
    left out is an error naming it, never the default's."""
    path = os.path.join(run_dir, "config.json")
    try:
        with open(path) as f:
            config = json.load(f)
        missing = [field.name for field in fields(GPTConfig) if field.name not in config["model"]]
        if missing:
            raise ValueError(f"{path}: the model's {missing[0]} is missing")
        return GPTConfig(**config["model"]), config["settings"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: not a tinygpt run config ({error})") from None


# what runs write, which --overwrite removes by name: the run folder's files (the tokenizer's and a
# checkpoint's: TOKENIZER_FILES, WEIGHT_FILES)
RUN_FILES = ("config.json", "metrics.jsonl", "loss.png", "labels.json", "results.json", "predictions.tsv")
LOCK_FILE = ".lock"


def check_new_run_folder(path, overwrite=False):
    """Raise ValueError unless a new run may go to `path`: a folder that does not exist or is empty
    (but for the lock file), or (with `overwrite`) any folder with nothing in the way of the new run
    (in_the_way), whose run files empty_run_folder then removes; never in another run (in_a_run)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{path} is a file, not a folder")
    if why := in_a_run(path):
        raise ValueError(why)
    entries = sorted(set(os.listdir(path)) - {LOCK_FILE}) if os.path.isdir(path) else []
    if entries and not overwrite:
        held = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
        raise ValueError(
            f"{path} is not empty (it holds {held}): --resume the run there, pass --overwrite to "
            f"replace its run, or choose another folder"
        )
    blocking = in_the_way(path) if overwrite else []
    if blocking:
        raise ValueError(
            f"{blocking[0]}: no run wrote this, where the new run writes: move it, or choose another folder"
        )


def in_a_run(path):
    """Why an output at `path` would lie in a run's checkpoints/, best/ or tokenizer/ (links followed),
    which hold only what the run writes; None where it would not."""
    for folder in (there := Path(os.path.realpath(path)), *there.parents):
        if folder.name in ("checkpoints", "best", "tokenizer") and is_run(folder.parent):
            return f"{path} lies in {folder}, a folder of the run {folder.parent}: choose another"
    return None


def is_run(folder):
    """Whether `folder` is a run's: its config.json and tokenizer/."""
    return (Path(folder) / "config.json").is_file() and (Path(folder) / "tokenizer").is_dir()


def in_the_way(path):
    """What the new run would write over in run folder `path`, though no run wrote it: someone else's
    file in best/ or a checkpoint's folder, a folder named as a run's file, a file as a run's folder,
    a link where a run writes a folder (emptying it would empty the folder it points to)."""
    checkpoints = os.path.join(path, "checkpoints")
    steps = [os.path.join(checkpoints, n) for n in sorted_entries(checkpoints) if is_step(n)]
    folders = [os.path.join(path, "best"), *steps]
    linked = [os.path.join(path, n) for n in ("best", "checkpoints", "tokenizer")] + steps
    found = [f for f in linked if os.path.islink(f)]
    found += [f for f in folders if os.path.exists(f) and not os.path.isdir(f)]
    found += [os.path.join(f, n) for f in folders for n in sorted_entries(f) if n not in WEIGHT_FILES]
    files = [os.path.join(f, n) for f in folders for n in WEIGHT_FILES]
    files += [os.path.join(path, n) for n in RUN_FILES]
    return found + [f for f in files if os.path.exists(f) and not os.path.isfile(f)]


def sorted_entries(folder):
    """The names in `folder`, sorted; none where it is not a folder."""
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def empty_run_folder(path):
    """Remove what a run writes from `path` (--overwrite), by name: RUN_FILES, the tokenizer's files,
    best/ and the checkpoints, and their folders where nothing else is left in them. Returns what is
    kept, the paths (under `path`) of the files and folders that no run writes."""
    remove_partials(path)
    checkpoints = os.path.join(path, "checkpoints")
    steps = [name for name in sorted_entries(checkpoints) if is_step(name)]
    plan = {os.path.join("checkpoints", step): WEIGHT_FILES for step in steps}
    plan.update({"checkpoints": (), "best": WEIGHT_FILES, "tokenizer": TOKENIZER_FILES, "": RUN_FILES})
    kept = []
    for folder, names in plan.items():  # each folder after those inside it
        where = os.path.join(path, folder)
        if not os.path.isdir(where):
            continue
        for name in [name for name in names if os.path.isfile(os.path.join(where, name))]:
            os.remove(os.path.join(where, name))
        left = [os.path.join(folder, name) for name in sorted(os.listdir(where))]
        kept += [name for name in left if name not in plan and name != LOCK_FILE]
        if folder and not left:
            os.rmdir(where)
    return kept


def set_aside(run_dir, step, metrics):
    """Move the checkpoint folders after `step`, the one a resume goes on from, and their `metrics`
    records into checkpoints/after-<step>/ (after-<step>.2/, ... where it is taken), saying so first:
    they are the user's, and the resumed run writes its own steps."""
    checkpoints = os.path.join(run_dir, "checkpoints")
    later = sorted((n for n in sorted_entries(checkpoints) if is_step(n) and int(n) > step), key=int)
    if not later:
        return
    aside, tries = os.path.join(checkpoints, f"after-{step}"), 1
    while os.path.exists(aside):
        tries += 1
        aside = os.path.join(checkpoints, f"after-{step}.{tries}")
    print(f"setting aside checkpoints {', '.join(later)} (after the one resumed) in {aside}")
    os.mkdir(aside)
    for name in later:
        os.replace(os.path.join(checkpoints, name), os.path.join(aside, name))
    rewrite_metrics(aside, metrics)


def hold_folder(run_dir):
    """Hold run_dir for this process: an exclusive flock on run_dir/.lock, which the process's id is
    written to. The lock ends with the process, so a killed run leaves none; release_folder ends it
    before. Returns its descriptor; raises ValueError naming the process that holds it already."""
    path = os.path.join(run_dir, LOCK_FILE)
    descriptor = lock(run_dir, os.O_RDWR | os.O_CREAT, fcntl.LOCK_EX, tries=5)
    while not os.path.exists(path) or not os.path.samestat(os.fstat(descriptor), os.stat(path)):
        os.close(descriptor)  # its holder removed the file as we opened it: take the one now there
        descriptor = lock(run_dir, os.O_RDWR | os.O_CREAT, fcntl.LOCK_EX, tries=5)
    os.ftruncate(descriptor, 0)
    os.write(descriptor, f"{os.getpid()}\n".encode())
    return descriptor


def release_folder(run_dir, descriptor):
    """End hold_folder's lock, removing the lock file first (a process that opened it meanwhile
    finds another file at its path, and tries again)."""
    try:
        os.remove(os.path.join(run_dir, LOCK_FILE))
    finally:
        os.close(descriptor)


def check_free(run_dir):
    """Raise ValueError, naming the process, where a run holds run_dir; nothing is written (the lock
    file, where there is one, is opened to read, and a shared lock tried)."""
    try:
        os.close(lock(run_dir, os.O_RDONLY, fcntl.LOCK_SH, tries=1))
    except OSError:  # no lock file, or no folder: no run holds it
        pass


def lock(run_dir, flags, kind, tries):
    """A descriptor of run_dir's lock file, opened with `flags` and flocked (`kind`) without waiting:
    tried `tries` times 50 ms apart (check_free holds it for a moment only), then a ValueError naming
    the process that holds it."""
    descriptor = os.open(os.path.join(run_dir, LOCK_FILE), flags, 0o644)
    for _ in range(tries):
        try:
            fcntl.flock(descriptor, kind | fcntl.LOCK_NB)
            return descriptor
        except BlockingIOError:
            time.sleep(0.05)
    holder = os.read(descriptor, 20).decode(errors="replace").strip() or "(starting)"
    os.close(descriptor)
    raise ValueError(
        f"{run_dir} is in use by process {holder}, a run that holds it (its lock file "
        f"{os.path.join(run_dir, LOCK_FILE)}): wait for it to end, or choose another folder"
    )


def new_run_folder(name):
    """runs/<name>-<date>-<time>: where a new run goes unless --out says otherwise."""
    return os.path.join("runs", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")


def run_folder_of(path):
    """The run folder of a weights folder (run/checkpoints/<step>, run/best); any other folder as it is."""
    return run_of(path) or path


def load_run(path, device="cpu"):
    """(model, tokenizer) from a run folder (its best/, else its newest checkpoint: run_weights) or
    from one weights folder inside a run, on `device` and in eval mode."""
    # a folder that holds no weights: find_checkpoint names what is missing
    folder = path if run_of(path) else run_weights(path) or find_checkpoint(path)
    model = GPT.from_pretrained(folder, device=device).eval()
    return model, load_tokenizer(os.path.join(run_folder_of(folder), "tokenizer"))


def append_metrics(run_dir, record):
    """Add one line to metrics.jsonl (flushed, so a crash keeps every line written)."""
    with open(os.path.join(run_dir, "metrics.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()


def read_metrics(run_dir):
    """The records of metrics.jsonl. A last line cut short (a write that a full disk or a kill ended
    before its newline) is dropped, saying so on stderr; any other line that is not a JSON object
    with an integer "step" is a ValueError naming the file and the line."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    if not os.path.isfile(path):
        raise ValueError(f"{path}: not a file")
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):  # the last line, no newline after it
                print(f"{path}, line {number}: cut short (an unfinished write), dropped", file=sys.stderr)
                break
            record = None
        if not isinstance(record, dict) or type(record.get("step")) is not int:
            raise ValueError(f'{path}, line {number}: not a JSON object with an integer "step": {line!r:.60}')
        records.append(record)
    return records


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
        name = os.path.basename(os.path.abspath(run_dir))  # bytes of a name that are not UTF-8, escaped:
        figure = loss_figure(read_metrics(run_dir), name.encode(errors="backslashreplace").decode())
    except ImportError:
        return None
    path = os.path.join(run_dir, "loss.png")
    save_figure(figure, path)
    return path


def save_figure(figure, path):
    """Save a matplotlib figure to `path`, whole or not at all, in the format its name ends in."""
    image = io.BytesIO()
    figure.savefig(image, format=os.path.splitext(path)[1][1:].lower(), dpi=100, bbox_inches="tight")
    write_whole(path, image.getvalue())
