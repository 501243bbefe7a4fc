"""Checkpoints: the whole state of a training run at one step, written so a crash never loses it.

    checkpoints/<step>/model.safetensors       weights, openai-gpt layout (GPT.from_pretrained reads
    checkpoints/<step>/config.json             the folder as it is)
    checkpoints/<step>/head.safetensors        a fine-tuned task head's own weights (head.weight, ...),
                                               when the model is a head around a GPT (`.transformer`)
    checkpoints/<step>/optimizer.safetensors   Adam's moments, m.<name> and v.<name>
    checkpoints/<step>/state.json              step, Adam's step count and settings, and the loop's
                                               own counters (everything else is derived from them)

A checkpoint is written to a temporary folder and renamed into place, so `checkpoints/` only ever
holds whole checkpoints; the oldest beyond `keep` are then removed.
"""

import json
import os
import shutil

from autograd.serialization import SafetensorsError, load_file, save_file
from tinygpt import GPT

STATE_FILE = "state.json"
HEAD_FILE = "head.safetensors"


def save_weights(model, folder):
    """Write the weights of a GPT, or of a task head around one: the GPT in the openai-gpt layout
    (so the folder still loads with GPT.from_pretrained), the head's own parameters beside it."""
    transformer = getattr(model, "transformer", model)
    transformer.save_pretrained(folder)
    if transformer is not model:
        head = {name: p.data for name, p in model.named_parameters() if not name.startswith("transformer.")}
        save_file(head, os.path.join(folder, HEAD_FILE))


def read_weights(folder, model):
    """The state dict that save_weights wrote for `model` (a GPT or a task head around one)."""
    weights = GPT.read_weights(folder)
    if getattr(model, "transformer", model) is model:
        return weights
    return {
        **{f"transformer.{name}": array for name, array in weights.items()},
        **load_file(os.path.join(folder, HEAD_FILE)),
    }


def save_checkpoint(run_dir, step, model, optimizer, state, keep=3):
    """Write checkpoints/<step>/ under run_dir and keep only the newest `keep`; returns its path."""
    folder = os.path.join(run_dir, "checkpoints")
    final = os.path.join(folder, str(step))
    if os.path.isdir(final):
        return final  # this step is already saved, and a step's state is always the same
    temporary = os.path.join(folder, f".partial-{step}-{os.getpid()}")
    shutil.rmtree(temporary, ignore_errors=True)
    try:
        save_weights(model, temporary)
        names = [name for name, _ in model.named_parameters()]
        adam = optimizer.state_dict()
        moments = {f"m.{n}": m for n, m in zip(names, adam.pop("m"))}
        moments.update({f"v.{n}": v for n, v in zip(names, adam.pop("v"))})
        save_file(moments, os.path.join(temporary, "optimizer.safetensors"))
        with open(os.path.join(temporary, STATE_FILE), "w") as f:
            json.dump({"step": step, "optimizer": adam, **state}, f, indent=2)
        os.replace(temporary, final)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    for old in checkpoint_steps(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(os.path.join(folder, str(old)), ignore_errors=True)
    return final


def checkpoint_steps(run_dir):
    """The steps of the whole checkpoints in run_dir, oldest first."""
    folder = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(folder):
        return []
    return sorted(
        int(name)
        for name in os.listdir(folder)
        if name.isdigit() and os.path.isfile(os.path.join(folder, name, STATE_FILE))
    )


def find_checkpoint(path):
    """A checkpoint folder: `path` itself if it is one, else the newest checkpoint of the run at `path`."""
    if os.path.isfile(os.path.join(path, STATE_FILE)):
        return path
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: no such run or checkpoint folder")
    steps = checkpoint_steps(path)
    if not steps:
        raise FileNotFoundError(
            f"{path}: holds no checkpoint (looked in {os.path.join(path, 'checkpoints')})"
        )
    return os.path.join(path, "checkpoints", str(steps[-1]))


def load_checkpoint(path, model, optimizer=None):
    """Restore weights (and Adam's state, if an optimizer is given) from a checkpoint or the newest
    one of a run; returns the dict of state.json. Errors name the file that is wrong."""
    folder = find_checkpoint(path)
    state_path = os.path.join(folder, STATE_FILE)
    try:
        with open(state_path) as f:
            state = json.load(f)
    except json.JSONDecodeError as error:
        raise ValueError(f"{state_path}: not valid JSON ({error})") from None
    weights = read_weights(folder, model)
    try:
        model.load_state_dict(weights)
    except ValueError as error:
        raise ValueError(f"{folder}: the checkpoint does not fit this model: {error}") from None
    if optimizer is not None:
        moments = load_file(os.path.join(folder, "optimizer.safetensors"))
        names = [name for name, _ in model.named_parameters()]
        missing = [n for n in names if f"m.{n}" not in moments or f"v.{n}" not in moments]
        if missing:
            raise SafetensorsError(f"{folder}/optimizer.safetensors: no moments for {', '.join(missing)}")
        optimizer.load_state_dict(
            {
                **state["optimizer"],
                "m": [moments[f"m.{n}"] for n in names],
                "v": [moments[f"v.{n}"] for n in names],
            }
        )
    return state
