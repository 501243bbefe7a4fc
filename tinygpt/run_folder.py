"""Where the weights of a training run are, so that GPT.from_pretrained can take a run folder.

    run/checkpoints/<step>/   a checkpoint: config.json + model.safetensors in the openai-gpt layout,
                              and state.json, which makes it whole (train/checkpoint.py writes them)
    run/best/                 a fine-tune's best epoch: config.json + model.safetensors, and the
                              task head's own weights beside them

The lookup lives here, not in train/, because train imports tinygpt and never the other way.
"""

import os

STATE_FILE = "state.json"
WEIGHTS_FILE = "model.safetensors"


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


def latest_checkpoint(run_dir):
    """run_dir/checkpoints/<the newest step>, or None where the run holds no whole checkpoint."""
    steps = checkpoint_steps(run_dir)
    return os.path.join(run_dir, "checkpoints", str(steps[-1])) if steps else None


def weights_folder(path):
    """The folder of config.json + model.safetensors that `path` stands for: path itself where it
    holds them (save_pretrained's folder, a checkpoint, best/); else a run's best/, the weights a
    fine-tune's dev and test figures are of; else the run's newest checkpoint."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: no such folder")
    for folder in (path, os.path.join(path, "best"), latest_checkpoint(path)):
        if folder is not None and os.path.isfile(os.path.join(folder, WEIGHTS_FILE)):
            return folder
    raise FileNotFoundError(
        f"{path}: no weights here (neither {WEIGHTS_FILE} + config.json, as save_pretrained writes, "
        f"nor a run folder with best/ or a whole checkpoint in checkpoints/<step>/)"
    )
