"""Checkpoints: the whole state of a training run at one step, written so a crash never loses it.

    checkpoints/<step>/model.safetensors       weights, openai-gpt layout (GPT.from_pretrained reads
    checkpoints/<step>/config.json             the folder as it is)
    checkpoints/<step>/head.safetensors        a fine-tuned task head's own weights (head.weight, ...),
                                               when the model is a head around a GPT (`.transformer`)
    checkpoints/<step>/optimizer.safetensors   Adam's moments, m.<name> and v.<name>
    checkpoints/<step>/state.json              step, Adam's step count and settings, and the loop's
                                               own counters (everything else is derived from them)
    checkpoints/<step>/digests.json            the run's files the weights depend on, by digest
                                               (tinygpt/weights.py)

A checkpoint is written to a temporary folder, flushed to the disk and renamed into place, so
`checkpoints/` only ever holds whole checkpoints; the files of the oldest beyond `keep` are then
removed, and a file of someone else's in their folder kept. A temporary folder that a killed
process left behind is removed when the run starts again.
"""

import glob
import json
import math
import os
import shutil

import numpy as np

from autograd.serialization import SafetensorsError, load_file, save_file
from tinygpt import GPT
from tinygpt.model import check_finite
from tinygpt.weights import (
    DIGESTS_FILE,
    STATE_FILE,
    WEIGHTS_FILE,
    check_dependencies,
    checkpoint_steps,
    dependencies,
    is_step,
    latest_checkpoint,
    run_of,
)

HEAD_FILE = "head.safetensors"
WEIGHT_FILES = ("config.json", WEIGHTS_FILE, HEAD_FILE, "optimizer.safetensors", STATE_FILE, DIGESTS_FILE)


def save_weights(model, folder, digests=None):
    """Write the weights of a GPT, or of a task head around one: the GPT in the openai-gpt layout
    (so the folder still loads with GPT.from_pretrained), the head's own parameters beside it, and
    `digests` (of the run's files they depend on) where given."""
    transformer = getattr(model, "transformer", model)
    transformer.save_pretrained(folder)
    if transformer is not model:
        head = {name: p.data for name, p in model.named_parameters() if not name.startswith("transformer.")}
        save_file(head, os.path.join(folder, HEAD_FILE))
    if digests is not None:
        write_json(os.path.join(folder, DIGESTS_FILE), digests)


def read_weights(folder, model):
    """The state dict that save_weights wrote for `model` (a GPT or a task head around one), once
    the run's files are found to be those the weights were written with (check_dependencies)."""
    check_dependencies(folder)
    weights = GPT.read_weights(folder)
    if getattr(model, "transformer", model) is model:
        return weights
    return {
        **{f"transformer.{name}": array for name, array in weights.items()},
        **check_finite(folder, load_file(os.path.join(folder, HEAD_FILE))),
    }


def save_checkpoint(run_dir, step, model, optimizer, state, keep=3, digests=None):
    """Write checkpoints/<step>/ under run_dir (with `digests`, see save_weights: by default those of
    run_dir's files now) and keep only the newest `keep`; returns its path. A folder of that step
    already there is an error (FileExistsError), never written over."""
    folder = os.path.join(run_dir, "checkpoints")
    final = os.path.join(folder, str(step))
    if os.path.exists(final):
        raise FileExistsError(f"{final}: a checkpoint of step {step} is there already")
    temporary = os.path.join(folder, f".partial-{step}-{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    try:
        save_weights(model, temporary, dependencies(run_dir) if digests is None else digests)
        names = [name for name, _ in model.named_parameters()]
        adam = optimizer.state_dict()
        moments = {f"{kind}.{n}": array for kind in "mv" for n, array in zip(names, adam.pop(kind))}
        save_file(moments, os.path.join(temporary, "optimizer.safetensors"))  # fsynced by save_file
        write_json(os.path.join(temporary, STATE_FILE), {"step": step, "optimizer": adam, **state})
        fsync(os.path.join(temporary, "config.json"))  # write_json flushed the folder's entries
        os.replace(temporary, final)
        fsync(folder)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    for old in [os.path.join(folder, str(s)) for s in checkpoint_steps(run_dir)[:-keep]] if keep > 0 else []:
        if os.path.islink(old):  # someone's link to a folder of theirs: neither it nor what it holds goes
            print(f"{old}: kept (--keep-checkpoints): a link, which no run wrote")
            continue
        kept = remove_checkpoint(old)
        if kept:
            print(f"{old}: checkpoint removed (--keep-checkpoints), kept {', '.join(kept)}: no run wrote it")
    return final


def remove_checkpoint(folder):
    """Remove the files a run writes in a checkpoint or best/ (WEIGHT_FILES), and the folder where
    nothing else is left in it; returns the names of what is left, someone else's."""
    for name in WEIGHT_FILES:
        if os.path.isfile(os.path.join(folder, name)):
            os.remove(os.path.join(folder, name))
    left = sorted(os.listdir(folder))
    if not left:
        os.rmdir(folder)
    return left


def retire(old, new):
    """Replace weights folder `old` by `new`, which took its place: what is someone else's in old
    moves into new, then old's own files go (see remove_checkpoint)."""
    for name in os.listdir(old):
        if name not in WEIGHT_FILES:
            os.replace(os.path.join(old, name), os.path.join(new, name))
    remove_checkpoint(old)


def fsync(path):
    """Flush a file, or a folder's entries, to the disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_json(path, record):
    """Write a JSON file whole or not at all: written beside, flushed to the disk, renamed."""
    with open(f"{path}.partial", "w") as f:
        json.dump(record, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(f"{path}.partial", path)
    fsync(os.path.dirname(os.path.abspath(path)))


def remove_partials(run_dir):
    """Undo what a killed process left half done: remove checkpoints/.partial-*, *.partial files
    and .best-partial/; put back best/ where finetune's save_best had moved it aside (.best-old/),
    or retire it where the new best/ is in place."""
    patterns = (("checkpoints", ".partial-*"), ("*.partial",), (".best-partial",))
    for path in (path for pattern in patterns for path in glob.glob(os.path.join(run_dir, *pattern))):
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    old, best = os.path.join(run_dir, ".best-old"), os.path.join(run_dir, "best")
    if os.path.isdir(old):
        retire(old, best) if os.path.isdir(best) else os.replace(old, best)


def find_checkpoint(path):
    """A checkpoint folder: `path` itself if it is one, else the newest checkpoint of the run at `path`."""
    if os.path.isfile(os.path.join(path, STATE_FILE)):
        if run_of(path) is None:
            raise FileNotFoundError(
                f"{path}: a checkpoint, but not in a run's checkpoints/<step>/ (one a resume set aside is in "
                "checkpoints/after-<step>/: move it back to checkpoints/<its step> to use it)"
            )
        return path
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: no such run or checkpoint folder")
    checkpoint = latest_checkpoint(path)
    if checkpoint is None:
        looked_in = os.path.join(path, "checkpoints")
        raise FileNotFoundError(f"{path}: holds no checkpoint (looked in {looked_in})")
    return checkpoint


def check_checkpoint(path):
    """The checkpoint folder of `path` (see find_checkpoint), once its state.json and the run's files
    are found sound (read_state, check_dependencies): a resume's first check, before any work."""
    folder = find_checkpoint(path)
    read_state(os.path.join(folder, STATE_FILE), with_optimizer=False)
    check_dependencies(folder)
    return folder


def load_checkpoint(path, model, optimizer=None):
    """Restore weights (and Adam's state, if an optimizer is given) from a checkpoint or the newest
    one of a run; returns the dict of state.json. Errors name the file, and the field, that is wrong."""
    folder = find_checkpoint(path)
    state = read_state(os.path.join(folder, STATE_FILE), optimizer is not None)
    weights = read_weights(folder, model)
    try:
        model.load_state_dict(weights)
    except ValueError as error:
        raise ValueError(f"{folder}: the checkpoint does not fit this model: {error}") from None
    if optimizer is not None:
        moments = read_moments(os.path.join(folder, "optimizer.safetensors"), model)
        names = [name for name, _ in model.named_parameters()]
        m, v = ([moments[f"{kind}.{n}"] for n in names] for kind in "mv")
        optimizer.load_state_dict({**state["optimizer"], "m": m, "v": v})
    return state


def integer(low):
    return (lambda value: type(value) is int and value >= low), f"an integer >= {low}"


def number(low, high=math.inf):
    within = f"in [{low}, {high})" if high < math.inf else f">= {low}"
    return (lambda value: type(value) in (int, float) and low <= value < high), f"a number {within}"


STATE_FIELDS = {
    "step": integer(0),
    "elapsed": number(0),
    "world_size": integer(1),
    "optimizer": (lambda value: type(value) is dict, "an object"),
}
ADAM_FIELDS = {
    "step": integer(0),
    "lr": number(0),
    "betas": (
        lambda v: type(v) is list and len(v) == 2 and all(number(0, 1)[0](b) for b in v),
        "two numbers in [0, 1)",
    ),
    "eps": number(0),
    "l2": number(0),
    "l2_mode": (lambda value: value in ("decoupled", "coupled"), "'decoupled' or 'coupled'"),
    "vector_l2": (lambda value: type(value) is bool, "true or false"),
}


def read_state(path, with_optimizer=True):
    """A checkpoint's state.json, checked: step (that of its folder, in a run), elapsed and world_size
    where present and, with `with_optimizer`, Adam's settings. An error names the file and the field."""
    try:
        with open(path) as f:
            state = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(state, dict):
        raise ValueError(f"{path}: not a JSON object")
    check_fields(path, state, STATE_FIELDS, required=("step", "optimizer") if with_optimizer else ("step",))
    folder, name = os.path.dirname(path), os.path.basename(os.path.dirname(path))
    if run_of(folder) and is_step(name) and state["step"] != int(name):
        raise ValueError(f"{path}: step {state['step']}, in the folder of step {name}")
    if with_optimizer:
        check_fields(path, state["optimizer"], ADAM_FIELDS, required=ADAM_FIELDS, prefix="optimizer.")
    return state


def check_fields(path, record, fields, required=(), prefix=""):
    """Raise ValueError naming `path` and the field of `record` that is missing (of `required`) or
    fails its check in `fields` {name: (check, what the value must be)}."""
    for name, (holds, requirement) in fields.items():
        if name not in record and name in required:
            raise ValueError(f"{path}: the field {prefix}{name} is missing")
        if name in record and not holds(record[name]):
            raise ValueError(f"{path}: {prefix}{name} must be {requirement}, got {record[name]!r:.60}")


def read_moments(path, model):
    """Adam's moments of a checkpoint, {m.<name> / v.<name>: array}, checked against `model`: one
    of each per parameter, floating point, of its shape. An error names the file and the tensor."""
    moments = load_file(path)
    params = {f"{kind}.{name}": p for name, p in model.named_parameters() for kind in "mv"}
    missing, unexpected = sorted(params.keys() - moments.keys()), sorted(moments.keys() - params.keys())
    for what, names in (("missing", missing), ("unexpected", unexpected)):
        if names:
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            raise SafetensorsError(f"{path}: {what} moments {', '.join(names[:3])}{more}")
    for name, p in params.items():
        array = moments[name]
        if array.dtype.kind != "f" or tuple(array.shape) != tuple(p.shape):
            shapes = f"{array.dtype} {tuple(array.shape)}; its parameter is {p.dtype} {tuple(p.shape)}"
            raise SafetensorsError(f"{path}: {name} is {shapes}")
        finite = np.isfinite(array).all()
        if not finite or name.startswith("v.") and (array < 0).any():  # v: a mean of squares
            bad = "NaN or infinite numbers" if not finite else "negative second moments"
            raise SafetensorsError(f"{path}: {name} holds {bad}: not a usable checkpoint")
    return moments
