"""A run folder's checkpoints are the folders named by a step in ASCII digits, and its weights prove
that the run's files are those they were written with (tinygpt/weights.py)."""

import json

import pytest

from tinygpt import GPT, GPTConfig
from tinygpt.weights import check_dependencies, checkpoint_steps, dependencies, is_step, run_of

CONFIG = GPTConfig(vocab_size=11, n_ctx=6, n_embd=8, n_layer=1, n_head=2)


@pytest.mark.parametrize(
    "name, step", [("0", True), ("45", True), ("٤٥", False), ("007", False), ("１２", False)]
)
def test_only_a_step_in_ascii_digits_names_a_checkpoint(tmp_path, name, step):
    (tmp_path / "checkpoints" / name).mkdir(parents=True)
    (tmp_path / "checkpoints" / name / "state.json").write_text("{}")
    assert is_step(name) == step and checkpoint_steps(tmp_path) == ([int(name)] if step else [])


def test_the_run_of_a_weights_folder(tmp_path):
    assert run_of(tmp_path / "run" / "checkpoints" / "3") == str(tmp_path / "run")
    assert run_of(f"{tmp_path}/run/best/") == str(tmp_path / "run")
    assert run_of(tmp_path / "run" / "checkpoints" / "after-3") is None and run_of(tmp_path / "gpt") is None


def run_with_digests(root):
    """A run folder with config.json, a tokenizer file and checkpoints/1 recording their digests."""
    (root / "tokenizer").mkdir(parents=True)
    (root / "config.json").write_text("{}")
    (root / "tokenizer" / "vocab.json").write_text('{"a": 0}')
    folder = root / "checkpoints" / "1"
    GPT(CONFIG).save_pretrained(folder)
    (folder / "state.json").write_text('{"step": 1}')
    (folder / "digests.json").write_text(json.dumps(dependencies(root)))
    return folder


@pytest.mark.parametrize(
    "change, named, how",
    [
        (lambda root: (root / "config.json").write_text('{"x": 1}'), "config.json", "changed"),
        (lambda root: (root / "tokenizer" / "vocab.json").unlink(), "tokenizer/vocab.json", "removed"),
        (lambda root: (root / "labels.json").write_text("[]"), "labels.json", "added"),
    ],
)
def test_a_run_file_changed_since_its_weights_were_written_is_named(tmp_path, change, named, how):
    folder = run_with_digests(tmp_path)
    GPT.from_pretrained(tmp_path)
    (tmp_path / "tokenizer" / "notes.txt").write_text("not the tokenizer's")  # no file the weights depend on
    check_dependencies(folder)
    change(tmp_path)
    with pytest.raises(ValueError, match=f"^{tmp_path / named}: {how} since {folder}/digests.json recorded"):
        GPT.from_pretrained(tmp_path)


def test_weights_without_digests_or_outside_a_run_load_unchecked(tmp_path):
    """Weights of a run older than digests load, and say so; weights outside a run load as they are."""
    folder = run_with_digests(tmp_path / "run")
    (tmp_path / "run" / "config.json").write_text('{"x": 1}')
    (folder / "digests.json").unlink()
    with pytest.warns(UserWarning, match="holds no digests.json: the run's config and tokenizer go"):
        GPT.from_pretrained(tmp_path / "run")
    GPT(CONFIG).save_pretrained(tmp_path / "gpt")
    (tmp_path / "gpt" / "digests.json").write_text(json.dumps({"config.json": "0" * 64}))
    GPT.from_pretrained(tmp_path / "gpt")
