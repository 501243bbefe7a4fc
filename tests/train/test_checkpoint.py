"""Checkpoints are whole or absent, keep the newest few, and restore weights and Adam exactly."""

import numpy as np
import pytest

import autograd as ag
from autograd.optim import Adam
from tinygpt import GPT, GPTConfig
from train import checkpoint as ckpt

CONFIG = GPTConfig(vocab_size=11, n_ctx=6, n_embd=8, n_layer=1, n_head=2)


def trained_pair(seed=0):
    """A model and its optimizer after one step, so the moments are not zero."""
    ag.manual_seed(seed)
    model = GPT(CONFIG)
    optimizer = Adam(model.parameters(), lr=1e-2)
    ids = np.random.default_rng(seed).integers(0, 11, (2, 6))
    ag.functional.cross_entropy(model(ids[:, :-1]), ids[:, 1:]).backward()
    optimizer.step()
    return model, optimizer


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
