"""Generated damage to a run folder: a checkpoint whose state.json names another step or lacks a
field, config.json with a setting left out, a tokenizer file or a digest changed, a user's file
dropped in one of the run's folders, a checkpoint folder named with digits that are not ASCII. The
property draws one of them and a command that reads the run (generate, perplexity, a resume of the
newest or an earlier checkpoint, a new run from it, a new run over it with --overwrite): what the
digests cover is refused by every command that loads the weights, a damaged checkpoint by every
resume of it, each with one line naming the file; a usage error changes nothing; a user's file is
never lost."""

import json
import os
import shutil
import string

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from tinygpt.weights import TOKENIZER_FILES, is_step
from train import evaluate, generate, pretrain
from train.checkpoint import WEIGHT_FILES
from train.run_folder import RUN_FILES

from .runs import one_step_argv, snapshot

TAKEN = {*RUN_FILES, *TOKENIZER_FILES, *WEIGHT_FILES, "checkpoints", "tokenizer", "best", "cache"}
USER_NAMES = st.text(string.ascii_letters + string.digits + "_-", min_size=1, max_size=10).filter(
    lambda name: name not in TAKEN and not is_step(name)
)
ODD_STEPS = ["٤٥", "007", "٣", "１２", "00", "5\u0301"]  # Arabic-Indic, leading zeros, full-width, a mark


@st.composite
def damage(draw, run):
    """Damage `run` one way; returns (kind, the file that names it, the step of the checkpoint
    damaged or None, the bytes of a user's file or None)."""
    kind = draw(st.sampled_from(["config", "tokenizer", "digest", "step", "state", "user file", "odd"]))
    step = draw(st.sampled_from([1, 2, 3, 4]))
    if kind == "config":
        config = json.loads((run / "config.json").read_text())
        part = draw(st.sampled_from(["model", "settings"]))
        del config[part][draw(st.sampled_from(sorted(config[part])))]
        (run / "config.json").write_text(json.dumps(config))
        return kind, run / "config.json", None, None
    if kind == "tokenizer":
        path = run / "tokenizer" / draw(st.sampled_from(sorted(os.listdir(run / "tokenizer"))))
        path.write_bytes(path.read_bytes() + draw(st.binary(min_size=1, max_size=8)))
        return kind, path, None, None
    if kind == "digest":
        path = run / "checkpoints" / "4" / "digests.json"
        digests = json.loads(path.read_text())
        name = draw(st.sampled_from(sorted(digests)))
        how = draw(st.sampled_from(["change", "drop", "add"]))
        if how == "change":
            digests[name] = draw(st.text("0123456789abcdef", min_size=64, max_size=64))
        elif how == "drop":
            del digests[name]
        else:
            digests[f"tokenizer/{draw(st.sampled_from(TOKENIZER_FILES))}x"] = "0" * 64
            digests["labels.json"] = "0" * 64
        path.write_text(json.dumps(digests))
        return kind, path, 4, None
    if kind in ("step", "state"):
        path = run / "checkpoints" / str(step) / "state.json"
        state = json.loads(path.read_text())
        if kind == "step":
            state["step"] = draw(st.integers(0, 10).filter(lambda other: other != step))
        else:
            del state[draw(st.sampled_from(["step", "optimizer"]))]
        path.write_text(json.dumps(state))
        return kind, path, step, None
    if kind == "user file":
        folder = draw(st.sampled_from(["", "checkpoints", "checkpoints/1", "checkpoints/4", "tokenizer"]))
        path, data = run / folder / draw(USER_NAMES), draw(st.binary(max_size=32))
        path.write_bytes(data)
        return kind, path, None, data
    path = run / "checkpoints" / draw(st.sampled_from(ODD_STEPS))
    shutil.copytree(run / "checkpoints" / "1", path)
    return kind, path, None, None


def commands(run, corpus, tmp):
    """{name: (main, argv, the step of the checkpoint it loads or None)} of each command."""
    (tmp / "text.txt").write_text("the cat sat on the mat. " * 20)
    resume = ["--steps", "4", "--device", "cpu", "--keep-checkpoints", "2"]
    return {
        "generate": (generate.main, ["--run", str(run), "--prompt", "hi", "--device", "cpu"], 4),
        "perplexity": (evaluate.main, ["perplexity", "--run", str(run), "--data", str(tmp / "text.txt")], 4),
        "resume": (pretrain.main, ["--resume", str(run), *resume], 4),
        "resume 1": (pretrain.main, ["--resume", str(run / "checkpoints" / "1"), *resume], 1),
        "resume 3": (pretrain.main, ["--resume", str(run / "checkpoints" / "3"), *resume], 3),
        "init-from": (pretrain.main, ["--init-from", str(run), *one_step_argv(corpus, tmp / "new")], 4),
        "overwrite": (pretrain.main, one_step_argv(corpus, run, "--overwrite"), None),
    }


def refused(kind, damaged, path, name, loads):
    """Whether the command `name`, which loads checkpoint `loads`, must refuse the damage."""
    if name == "overwrite":  # a new run: only a user's file where it writes is in its way
        return kind == "user file" and path.parent.parent.name == "checkpoints"
    if kind in ("config", "tokenizer"):  # every checkpoint's digests cover them
        return True
    if kind in ("step", "state"):
        return name.startswith("resume") and damaged == loads
    return kind == "digest" and damaged == loads


def run_command(capsys, main, argv):
    """(exit status, stderr lines) of main(argv)."""
    capsys.readouterr()
    try:
        main(argv)
    except SystemExit as stop:
        code = 1 if isinstance(stop.code, str) else stop.code
        return code, capsys.readouterr().err.strip().splitlines() or [stop.code]
    return 0, []


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_no_damage_to_a_run_folder_goes_unnoticed_or_costs_a_users_file(base, tmp_path_factory, capsys, data):
    tmp = tmp_path_factory.mktemp("damage")
    run = tmp / "run"
    shutil.copytree(base[0], run)
    name, (main, argv, loads) = data.draw(st.sampled_from(sorted(commands(run, base[1], tmp).items())))
    kind, path, damaged, mine = data.draw(damage(run))
    event(f"{kind}, {name}")
    before = snapshot(run)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TINYGPT_CACHE", str(base[2]))
        code, lines = run_command(capsys, main, argv)
    assert code in (0, 1, 2), lines
    assert code == 0 or (len(lines) == 1 and lines[0].startswith("python -m train.")), lines
    assert code != 2 or snapshot(run) == before
    if refused(kind, damaged, path, name, loads):
        assert code == 2 and str(path) in lines[0], (kind, path, lines)
    elif kind == "odd":
        assert code == 0 and path.is_dir(), lines
    if mine is not None:  # kept, in its place or in a folder a resume set aside
        assert any(p.read_bytes() == mine for p in run.rglob(path.name) if p.is_file()), lines
