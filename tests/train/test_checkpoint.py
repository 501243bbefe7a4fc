"""Checkpoints are whole or absent, never written over, flushed to the disk, keep the newest few,
restore weights and Adam exactly, and name the file and field of a bad state.json or moment."""

import json
import os

import numpy as np
import pytest

from autograd.optim import Adam
from autograd.serialization import load_file, save_file
from tinygpt import GPT
from train import checkpoint as ckpt
from train.run_folder import write_config

from .runs import CONFIG, trained_pair


def test_save_and_load_restore_weights_moments_and_state(tmp_path):
    model, optimizer = trained_pair()
    ckpt.save_checkpoint(tmp_path, 7, model, optimizer, {"elapsed": 1.5})
    fresh, fresh_optimizer = trained_pair(seed=1)
    state = ckpt.load_checkpoint(tmp_path, fresh, fresh_optimizer)
    assert state["step"] == 7 and state["elapsed"] == 1.5
    for (name, a), b in zip(model.named_parameters(), fresh.parameters()):
        np.testing.assert_array_equal(a.data, b.data, err_msg=name)
    for a, b in zip(optimizer.m + optimizer.v, fresh_optimizer.m + fresh_optimizer.v):
        np.testing.assert_array_equal(a, b)
    assert fresh_optimizer.step_count == optimizer.step_count


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    model, optimizer = trained_pair()
    for step in (1, 2, 3, 4):
        ckpt.save_checkpoint(tmp_path, step, model, optimizer, {}, keep=2)
    assert ckpt.checkpoint_steps(tmp_path) == [3, 4]
    assert ckpt.find_checkpoint(tmp_path).endswith("4")


def test_a_failed_write_leaves_the_last_checkpoint_and_no_partial_one(tmp_path, monkeypatch):
    """A disk that fills up while the optimizer file is written: the error comes out, checkpoint 1
    is whole, and no half-written folder is left behind."""
    model, optimizer = trained_pair()
    ckpt.save_checkpoint(tmp_path, 1, model, optimizer, {})

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt, "save_file", full_disk)
    with pytest.raises(OSError, match="No space"):
        ckpt.save_checkpoint(tmp_path, 2, model, optimizer, {})
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["1"]
    ckpt.load_checkpoint(tmp_path, GPT(CONFIG), Adam(GPT(CONFIG).parameters()))


def test_missing_runs_and_moments_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such run"):
        ckpt.find_checkpoint(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="holds no checkpoint"):
        ckpt.find_checkpoint(tmp_path)


def test_a_step_saved_already_is_an_error_not_skipped(tmp_path):
    """A second save of a step whose folder exists raises, naming it; the first one stays as it was."""
    model, optimizer = trained_pair()
    ckpt.save_checkpoint(tmp_path, 1, model, optimizer, {})
    first = (tmp_path / "checkpoints" / "1" / "model.safetensors").read_bytes()
    other, other_optimizer = trained_pair(seed=1)
    with pytest.raises(FileExistsError, match="checkpoints/1: a checkpoint of step 1 is there already"):
        ckpt.save_checkpoint(tmp_path, 1, other, other_optimizer, {})
    assert (tmp_path / "checkpoints" / "1" / "model.safetensors").read_bytes() == first


def test_state_and_config_reach_the_disk_before_and_after_the_rename(tmp_path, monkeypatch):
    """state.json and config.json are fsynced inside the checkpoint before it is renamed into
    place, and checkpoints/ after; a run's config.json is fsynced too."""
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(
        os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")) or real_fsync(fd)
    )
    model, optimizer = trained_pair()
    ckpt.save_checkpoint(tmp_path, 3, model, optimizer, {})
    names = [os.path.basename(path) if ".partial-3-" in path else path for path in synced]
    assert {"state.json.partial", "config.json"} <= set(names)
    assert synced[-1] == str(tmp_path / "checkpoints")  # its new entry, after the rename
    synced.clear()
    write_config(tmp_path, CONFIG, {})
    assert synced == [str(tmp_path / "config.json.partial"), str(tmp_path)]


def test_orphaned_partial_checkpoints_are_removed(tmp_path):
    """What a SIGKILL during a save leaves (checkpoints/.partial-*, *.partial files) is removed."""
    model, optimizer = trained_pair()
    ckpt.save_checkpoint(tmp_path, 1, model, optimizer, {})
    (tmp_path / "checkpoints" / ".partial-2-12345").mkdir()
    (tmp_path / "checkpoints" / ".partial-2-12345" / "model.safetensors").write_bytes(b"half")
    (tmp_path / "metrics.jsonl.partial").write_text("{")
    ckpt.remove_partials(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["1"]
    ckpt.load_checkpoint(tmp_path, *trained_pair())


def saved_state(tmp_path):
    model, optimizer = trained_pair()
    ckpt.save_checkpoint(tmp_path, 1, model, optimizer, {"elapsed": 1.0, "world_size": 1})
    return tmp_path / "checkpoints" / "1"


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda s: s.update(step="3"), "step must be an integer >= 0, got '3'"),
        (lambda s: s.pop("step"), "the field step is missing"),
        (lambda s: s.update(elapsed=-1), "elapsed must be a number >= 0"),
        (lambda s: s.update(world_size=0), "world_size must be an integer >= 1"),
        (lambda s: s.pop("optimizer"), "the field optimizer is missing"),
        (lambda s: s.update(optimizer=[1, 2]), "optimizer must be an object"),
        (lambda s: s["optimizer"].update(betas=[0.9]), "optimizer.betas must be two numbers in [0, 1)"),
        (lambda s: s["optimizer"].update(lr=None), "optimizer.lr must be a number >= 0, got None"),
        (
            lambda s: s["optimizer"].update(l2_mode="both"),
            "optimizer.l2_mode must be 'decoupled' or 'coupled'",
        ),
        (lambda s: s["optimizer"].update(vector_l2=1), "optimizer.vector_l2 must be true or false"),
        (lambda s: s["optimizer"].pop("eps"), "the field optimizer.eps is missing"),
    ],
)
def test_a_bad_state_json_is_named_with_its_field(tmp_path, change, field):
    folder = saved_state(tmp_path)
    state = json.loads((folder / "state.json").read_text())
    change(state)
    (folder / "state.json").write_text(json.dumps(state))
    model, optimizer = trained_pair()
    with pytest.raises(ValueError) as error:
        ckpt.load_checkpoint(folder, model, optimizer)
    assert str(error.value).startswith(f"{folder / 'state.json'}: {field}")


def test_state_json_that_is_not_an_object_is_named(tmp_path):
    folder = saved_state(tmp_path)
    (folder / "state.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="state.json: not a JSON object"):
        ckpt.load_checkpoint(folder, *trained_pair())


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda m: m.pop("v.h.0.ln_1.bias"), "missing moments v.h.0.ln_1.bias"),
        (lambda m: m.update({"m.extra": np.zeros(3, np.float32)}), "unexpected moments m.extra"),
        (
            lambda m: m.update({"m.h.0.ln_1.bias": np.zeros(5, np.float32)}),
            "m.h.0.ln_1.bias is float32 (5,); its parameter is float32 (8,)",
        ),
        (
            lambda m: m.update({"v.h.0.ln_1.bias": np.zeros(8, np.int32)}),
            "v.h.0.ln_1.bias is int32 (8,); its parameter is float32 (8,)",
        ),
    ],
)
def test_bad_optimizer_moments_are_named_with_the_tensor(tmp_path, change, message):
    folder = saved_state(tmp_path)
    moments = load_file(folder / "optimizer.safetensors")
    change(moments)
    save_file(moments, folder / "optimizer.safetensors")
    with pytest.raises(ValueError) as error:
        ckpt.load_checkpoint(folder, *trained_pair())
    assert str(error.value) == f"{folder / 'optimizer.safetensors'}: {message}"
