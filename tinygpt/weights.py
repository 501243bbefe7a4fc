"""Where the weights of a training run are, so that GPT.from_pretrained can take a run folder, and
the proof that a run folder is still the one its weights were written in.

    run/checkpoints/<step>/   a checkpoint: config.json + model.safetensors in the openai-gpt layout,
                              and state.json, which makes it whole (train/checkpoint.py writes them)
    run/best/                 a fine-tune's best epoch: config.json + model.safetensors, and the
                              task head's own weights beside them

Each holds digests.json: the sha256 of every file of the run its weights depend on (DEPENDENCIES:
config.json, the tokenizer's files, labels.json) as they were when the run wrote them. Loading
them checks the run's files against it. A folder without it is refused where the run recorded them
before it was written (check_digests_kept); weights older than digests load with a warning.
The lookup lives here, not in train/, because train imports tinygpt and never the other way.
"""

import hashlib
import os
import re
import warnings

from .files import read_json
from .tokenizer import GPT1Tokenizer
from .tokenizer.bpe import CONFIG_FILE as BPE_CONFIG_FILE

STATE_FILE = "state.json"
WEIGHTS_FILE = "model.safetensors"
DIGESTS_FILE = "digests.json"
TOKENIZER_FILES = ("vocab.json", "merges.txt", "special_tokens.json", BPE_CONFIG_FILE, *GPT1Tokenizer.FILES)
DEPENDENCIES = ("config.json", "labels.json", *(f"tokenizer/{name}" for name in TOKENIZER_FILES))
STEP_NAME = re.compile(r"0|[1-9][0-9]*")  # a checkpoint's folder: its step in ASCII digits, as str(step)


def is_step(name):
    """Whether `name` is the name of a checkpoint folder (a step written as str(step) writes it)."""
    return STEP_NAME.fullmatch(name) is not None


def checkpoint_steps(run_dir):
    """The steps of the whole checkpoints in run_dir, oldest first."""
    folder = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(folder):
        return []
    return sorted(
        int(name)
        for name in os.listdir(folder)
        if is_step(name) and os.path.isfile(os.path.join(folder, name, STATE_FILE))
    )


def latest_checkpoint(run_dir):
    """run_dir/checkpoints/<the newest step>, or None where the run holds no whole checkpoint."""
    steps = checkpoint_steps(run_dir)
    return os.path.join(run_dir, "checkpoints", str(steps[-1])) if steps else None


def run_weights(run_dir):
    """The weights of a run that a model is loaded from: its best/ (a fine-tune's best epoch, the one
    its dev and test figures are of), else its newest whole checkpoint; None where it has neither."""
    best = os.path.join(run_dir, "best")
    return best if os.path.isfile(os.path.join(best, WEIGHTS_FILE)) else latest_checkpoint(run_dir)


def weights_folder(path):
    """The folder of config.json + model.safetensors that `path` stands for: path itself where it
    holds them (save_pretrained's folder, a checkpoint, best/), else run_weights(path); its run's
    files checked against its digests (check_dependencies)."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: no such folder")
    for folder in (path, run_weights(path)):
        if folder is not None and os.path.isfile(os.path.join(folder, WEIGHTS_FILE)):
            check_dependencies(folder)
            return folder
    raise FileNotFoundError(
        f"{path}: no weights here (neither {WEIGHTS_FILE} + config.json, as save_pretrained writes, "
        f"nor a run folder with best/ or a whole checkpoint in checkpoints/<step>/)"
    )


def run_of(folder):
    """The run folder that a weights folder (run/checkpoints/<step> or run/best) is in, as named or else
    with links followed; None for another."""
    for path in (os.path.normpath(folder), os.path.realpath(folder)):
        parent = os.path.dirname(path)
        if os.path.basename(path) == "best":
            return parent
        if is_step(os.path.basename(path)) and os.path.basename(parent) == "checkpoints":
            return os.path.dirname(parent)
    return None


def dependencies(run_dir):
    """{name: sha256} of the DEPENDENCIES that run_dir holds: what its results depend on."""
    digests = {}
    for name in DEPENDENCIES:
        path = os.path.join(run_dir, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                digests[name] = hashlib.file_digest(f, "sha256").hexdigest()
    return digests


def check_dependencies(folder):
    """Raise ValueError, naming the file, where a DEPENDENCIES file of the run that weights `folder`
    is in was changed, removed or added since they were written (see the top of this file)."""
    path, run_dir = os.path.join(folder, DIGESTS_FILE), run_of(folder)
    if run_dir is None:
        return  # weights outside a run
    if os.path.exists(path) and not os.path.isfile(path):
        raise ValueError(f"{path}: not a file of digests")
    if not os.path.isfile(path):
        check_digests_kept(folder, run_dir)
        return
    recorded = read_json(path)
    if not isinstance(recorded, dict):
        raise ValueError(f"{path}: not a JSON object of digests")
    now = dependencies(run_dir)
    for name in sorted(recorded.keys() | now.keys()):
        if recorded.get(name) != now.get(name):
            how = "changed" if name in now and name in recorded else "added" if name in now else "removed"
            changed = os.path.join(run_dir, name)
            raise ValueError(f"{changed}: {how} since {path} recorded the run's files: put back its own")


def check_digests_kept(folder, run_dir):
    """Raise ValueError where weights `folder` lost its digests: a checkpoint of an earlier step holds
    its own (for best/: every checkpoint does), so the run recorded them when it wrote `folder`. Else
    (weights of a run older than digests, or resumed since) say in one line that they go unchecked."""
    steps = checkpoint_steps(run_dir)
    kept = [s for s in steps if os.path.isfile(os.path.join(run_dir, "checkpoints", str(s), DIGESTS_FILE))]
    name = os.path.basename(os.path.realpath(folder))  # a link's own name is not its step
    earlier = [s for s in kept if s < int(name)] if is_step(name) else kept if kept == steps else []
    if earlier:
        raise ValueError(
            f"{os.path.join(folder, DIGESTS_FILE)}: removed, though {run_dir}/checkpoints/{earlier[0]}, "
            f"written before it, holds its own: put it back, or copy {folder} out of the run to load it "
            "unchecked"
        )
    unchecked = "the run's config and tokenizer go unchecked against its weights"
    warnings.warn(f"{folder} holds no {DIGESTS_FILE}: {unchecked}", stacklevel=2)
