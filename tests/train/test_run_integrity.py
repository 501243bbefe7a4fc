"""A run folder proves its own integrity, and nothing a user made in it is deleted or written over
unasked: later checkpoints a resume passes over are set aside, a user's file in a checkpoint or
best/ is kept (or the run refuses before any work), an output never lands on an input, and a
checkpoint of another step, a setting left out, or a tokenizer or label list changed since the
weights were written is refused with one line naming the file."""

import json
import os
import shutil

import numpy as np
import pytest

from autograd.serialization import load_file, save_file
from tinygpt import GPT
from tinygpt.tokenizer import BPETokenizer
from train import checkpoint, evaluate, finetune, generate, prepare, pretrain
from train.checkpoint import checkpoint_steps
from train.run_folder import read_metrics

from .runs import (
    TEXT,
    copy_of_run,
    examples,
    finetune_run,
    one_step_argv,
    snapshot,
    stopped,
    trained_pair,
    write_jsonl,
)


def one_line(capsys, main, argv, status=2):
    """The one stderr line of main(argv), which must stop with `status`."""
    capsys.readouterr()
    code, err = stopped(capsys, main, argv)
    code, err = (1, err + code) if isinstance(code, str) else (code, err)
    assert code == status, err
    [line] = err.strip().splitlines()
    return line


@pytest.fixture
def run(base, tmp_path, monkeypatch):
    """A copy of the base run, on its token cache."""
    return copy_of_run(base, tmp_path, monkeypatch)


# ----- nothing a user made is deleted or overwritten unasked -------------------------------------
def test_resuming_an_earlier_checkpoint_sets_the_later_ones_aside_saying_so_first(run, capsys):
    later = {step: snapshot(run / "checkpoints" / str(step)) for step in (3, 4)}
    metrics = read_metrics(run)
    pretrain.main(["--resume", str(run / "checkpoints" / "2"), "--device", "cpu", "--steps", "2"])
    printed = capsys.readouterr().out.splitlines()
    aside = run / "checkpoints" / "after-2"
    said = printed.index(f"setting aside checkpoints 3, 4 (after the one resumed) in {aside}")
    assert said < printed.index(f"resuming {run} at step 2")
    assert checkpoint_steps(run) == [1, 2] and [m["step"] for m in read_metrics(run)] == [1, 2]
    for step, files in later.items():
        moved = {aside / str(step) / path.name: data for path, data in files.items()}
        assert snapshot(aside / str(step)) == moved
    assert read_metrics(aside) == [m for m in metrics if m["step"] > 2]


def test_a_checkpoint_set_aside_says_how_to_use_it_again(run, capsys):
    pretrain.main(["--resume", str(run / "checkpoints" / "2"), "--device", "cpu", "--steps", "2"])
    aside = run / "checkpoints" / "after-2" / "4"
    for main, argv in [
        (pretrain.main, ["--resume", str(aside), "--device", "cpu"]),
        (evaluate.main, ["perplexity", "--run", str(aside), "--data", str(run / "config.json")]),
    ]:
        line = one_line(capsys, main, argv)
        assert f"{aside}: a checkpoint, but not in a run's checkpoints/<step>/" in line
        assert "move it back to checkpoints/<its step>" in line


def test_rotation_removes_a_checkpoints_own_files_and_keeps_a_users(tmp_path, capsys):
    model, optimizer = trained_pair()
    checkpoint.save_checkpoint(tmp_path, 1, model, optimizer, {}, keep=1)
    (tmp_path / "checkpoints" / "1" / "NOTES.txt").write_text("mine")
    checkpoint.save_checkpoint(tmp_path, 2, model, optimizer, {}, keep=1)
    assert checkpoint_steps(tmp_path) == [2]
    assert os.listdir(tmp_path / "checkpoints" / "1") == ["NOTES.txt"]
    assert f"{tmp_path}/checkpoints/1: checkpoint removed (--keep-checkpoints), kept NOTES.txt" in (
        capsys.readouterr().out
    )


@pytest.mark.parametrize("killed", [False, True])
def test_a_new_best_keeps_a_users_file_of_the_old_one(tmp_path, monkeypatch, killed):
    """Also where a process died after the new best/ was in and before the old one was retired."""
    model, _ = trained_pair()
    finetune.save_best(str(tmp_path), model, {})
    (tmp_path / "best" / "MYFILE.txt").write_text("mine")
    if killed:
        monkeypatch.setattr(finetune, "retire", lambda old, new: None)
    finetune.save_best(str(tmp_path), model, {})
    if killed:
        checkpoint.remove_partials(tmp_path)
    assert (tmp_path / "best" / "MYFILE.txt").read_text() == "mine"
    assert sorted(os.listdir(tmp_path)) == ["best"]


@pytest.mark.parametrize("mine", ["best/MYFILE.txt", "checkpoints/2/NOTES.txt", "metrics.jsonl/x"])
def test_overwrite_refuses_before_any_work_a_users_file_where_the_run_writes(base, run, capsys, mine):
    """A file in best/ or a checkpoint's folder, or a folder named metrics.jsonl: the new run would
    write there, so it refuses, naming it, and changes nothing."""
    if mine.startswith("metrics"):
        (run / "metrics.jsonl").unlink()
    (run / mine).parent.mkdir(exist_ok=True)
    (run / mine).write_text("mine")
    before = snapshot(run)
    line = one_line(capsys, pretrain.main, one_step_argv(base[1], run, "--overwrite"))
    named = run / (mine if mine.startswith(("best", "checkpoints")) else "metrics.jsonl")
    assert line.startswith(f"python -m train.pretrain: error: --out: {named}: no run wrote this")
    assert snapshot(run) == before


@pytest.mark.parametrize("linked", ["tokenizer", "checkpoints/2", "best", "checkpoints"])
def test_overwrite_refuses_a_link_where_the_run_writes_a_folder_and_empties_nothing(
    base, run, tmp_path, capsys, linked
):
    """Emptying a linked folder would empty the user's folder it points to, outside the run."""
    theirs = tmp_path / "theirs"
    shutil.copytree(run / linked, theirs) if (run / linked).is_dir() else theirs.mkdir()
    (theirs / "NOTES.txt").write_text("mine")
    shutil.rmtree(run / linked, ignore_errors=True)
    (run / linked).symlink_to(theirs, target_is_directory=True)
    before = snapshot(theirs)
    line = one_line(capsys, pretrain.main, one_step_argv(base[1], run, "--overwrite"))
    assert line.startswith(f"python -m train.pretrain: error: --out: {run / linked}: no run wrote this")
    assert snapshot(theirs) == before


def test_rotation_keeps_a_linked_checkpoint_and_what_it_points_to(tmp_path, capsys):
    model, optimizer = trained_pair()
    checkpoint.save_checkpoint(tmp_path / "run", 1, model, optimizer, {}, keep=0)
    os.replace(tmp_path / "run" / "checkpoints" / "1", tmp_path / "theirs")
    (tmp_path / "run" / "checkpoints" / "1").symlink_to(tmp_path / "theirs", target_is_directory=True)
    before = snapshot(tmp_path / "theirs")
    checkpoint.save_checkpoint(tmp_path / "run", 2, model, optimizer, {}, keep=1)
    assert snapshot(tmp_path / "theirs") == before
    assert "checkpoints/1: kept (--keep-checkpoints): a link, which no run wrote" in capsys.readouterr().out


@pytest.mark.parametrize(
    "command, out, how",
    [
        ("pretrain --init-from", "", "is"),
        ("pretrain --init-from", "sub", "lies inside"),
        ("pretrain --tokenizer", "", "holds"),
        ("pretrain --data", "", "holds"),
        ("finetune --init-from", "", "is"),
        ("finetune --train", "", "holds"),
    ],
)
def test_an_output_on_an_input_of_the_same_command_is_a_usage_error(
    base, run, tmp_path, capsys, command, out, how
):
    """With --overwrite too: the run it starts from, its tokenizer and its data are never written over."""
    module, flag = command.split()
    write_jsonl(run / "train.jsonl", examples(8, 0))
    (run / "corpus.txt").write_text(TEXT)
    inputs = {
        "--init-from": run,
        "--tokenizer": run / "tokenizer",
        "--data": run / "corpus.txt",
        "--train": run / "train.jsonl",
    }
    given = [flag, str(inputs[flag])]
    if module == "pretrain":
        data = [] if flag == "--data" else ["--data", str(tmp_path / "corpus.txt")]
        (tmp_path / "corpus.txt").write_text(TEXT)
        main, argv = pretrain.main, [*one_step_argv(run / out, run / out, "--overwrite", *given)[2:], *data]
    else:
        splits = {
            "--init-from": str(run if flag == "--init-from" else base[0]),
            "--train": str(run / "train.jsonl"),
            "--dev": str(run / "train.jsonl"),
        }
        argv = [a for pair in splits.items() for a in pair] + ["--task", "jsonl", "--device", "cpu"]
        main, argv = finetune.main, [*argv, "--out", str(run / out), "--overwrite"]
    before = snapshot(run)
    line = one_line(capsys, main, argv)
    assert (
        f"--out: {run / out if out else run} {how} {flag} {inputs[flag]}: an output must stay apart" in line
    )
    assert snapshot(run) == before and not (run / "sub").exists()


# ----- a run folder proves its own integrity -----------------------------------------------------
@pytest.mark.parametrize("resume", ["checkpoints/2", ""])
def test_a_checkpoint_whose_state_names_another_step_is_refused(run, capsys, resume):
    folder = run / "checkpoints" / (resume.split("/")[-1] or "4")
    state = json.loads((folder / "state.json").read_text())
    (folder / "state.json").write_text(json.dumps({**state, "step": 1}))
    before = snapshot(run)
    line = one_line(capsys, pretrain.main, ["--resume", str(run / resume), "--steps", "4"])
    assert line.endswith(f"--resume: {folder / 'state.json'}: step 1, in the folder of step {folder.name}")
    assert snapshot(run) == before


@pytest.mark.parametrize("part, field", [("settings", "lr"), ("settings", "data_hash"), ("model", "n_inner")])
def test_a_setting_left_out_of_config_json_is_refused_not_defaulted(run, capsys, part, field):
    config = json.loads((run / "config.json").read_text())
    del config[part][field]
    (run / "config.json").write_text(json.dumps(config))
    before = snapshot(run)
    line = one_line(capsys, pretrain.main, ["--resume", str(run), "--steps", "4"])
    named = f"the setting {field} is missing" if part == "settings" else f"the model's {field} is missing"
    assert f"--resume: {run / 'config.json'}: {named}" in line and snapshot(run) == before


@pytest.mark.parametrize(
    "inside", ["checkpoints/new", "checkpoints/4/new", "best", "tokenizer/new", "link/new"]
)
@pytest.mark.parametrize("main", [pretrain.main, finetune.main], ids=["pretrain", "finetune"])
def test_a_new_run_inside_another_runs_own_folders_is_refused(run, tmp_path, capsys, inside, main):
    """checkpoints/, best/ and tokenizer/ hold what their run writes: a new run there is a usage error,
    also through a link (link/new: a link beside the run to its checkpoints/)."""
    (run / "best").mkdir()  # a fine-tune's, empty while it runs its first epoch
    (tmp_path / "link").symlink_to(run / "checkpoints")
    before = snapshot(run)
    out = tmp_path / inside if inside.startswith("link") else run / inside
    if main is pretrain.main:
        (tmp_path / "text.txt").write_text("the cat sat on the mat. " * 20)
        argv = one_step_argv(tmp_path / "text.txt", out)
    else:
        argv = [*commands(run, tmp_path)["finetune --init-from"][1], "--out", str(out)]
    line = one_line(capsys, main, argv)
    folder = (
        out if inside == "best" else run / ("checkpoints" if inside == "link/new" else inside.split("/")[0])
    )
    assert line.endswith(f"--out: {out} lies in {folder}, a folder of the run {run}: choose another")
    assert snapshot(run) == before
    assert inside == "best" or not out.exists()


@pytest.mark.parametrize("out", ["run", "run/tokenizer", "run/checkpoints/ds", "link/ds"])
def test_a_dataset_is_never_prepared_into_a_run(run, tmp_path, capsys, out):
    """prepare writes tokenizer/ and shards/ into --out: a run's folder, or one of its own, would lose
    its tokenizer."""
    (tmp_path / "text.txt").write_text("the cat sat on the mat. " * 20)
    (tmp_path / "link").symlink_to(run / "checkpoints")
    before, path = snapshot(run), tmp_path / out if out.startswith("link") else run.parent / out
    line = one_line(capsys, prepare.main, ["--data", str(tmp_path / "text.txt"), "--out", str(path)])
    assert line.endswith(": choose another") and f"--out: {path} " in line and snapshot(run) == before


@pytest.mark.parametrize("flag", ["predict --out", "perplexity --json"])
def test_an_evaluation_never_writes_into_another_runs_folders(run, tuned, tmp_path, capsys, flag):
    target = run / "checkpoints" / "4" / "model.safetensors"
    (tmp_path / "text.txt").write_text("the cat sat on the mat. " * 20)
    write_jsonl(tmp_path / "dev.jsonl", examples(8, 0))
    command, data, out = (
        ("predict", "dev.jsonl", "--out") if flag == "predict --out" else ("perplexity", "text.txt", "--json")
    )
    argv = [command, "--run", str(tuned), "--data", str(tmp_path / data), out, str(target), "--device", "cpu"]
    before = snapshot(run)
    line = one_line(capsys, evaluate.main, argv)
    assert f"{flag.split()[1]}: {target} lies in {run / 'checkpoints'}, a folder of the run {run}" in line
    assert snapshot(run) == before


def test_a_link_to_a_checkpoint_is_that_checkpoint_of_its_run(run, tmp_path):
    (tmp_path / "four").symlink_to(run / "checkpoints" / "4")
    (tmp_path / "two").symlink_to(run / "checkpoints" / "2")
    (run / "checkpoints" / "2" / "digests.json").unlink()  # its step is 2, though the link's name is not
    with pytest.raises(ValueError, match="two/digests.json: removed, though .*run/checkpoints/1, written"):
        GPT.from_pretrained(tmp_path / "two")
    swap_tokenizer(run)  # the run's files checked through the link too
    with pytest.raises(ValueError, match="tokenizer/.*: changed since"):
        GPT.from_pretrained(tmp_path / "four")


def swap_tokenizer(run):
    """Put another tokenizer of the same size in the run's tokenizer/ folder."""
    size = BPETokenizer.load(run / "tokenizer").vocab_size
    other = BPETokenizer.train(["Colourless green ideas sleep furiously. " * 30], vocab_size=size)
    assert other.vocab_size == size
    other.save(run / "tokenizer")


def commands(run, tmp_path):
    """{name: (main, argv)} of each command that loads the run's weights."""
    (tmp_path / "text.txt").write_text("the cat sat on the mat. " * 20)
    for split in ("train", "dev"):
        write_jsonl(tmp_path / f"{split}.jsonl", examples(8, 0))
    splits = ["--train", str(tmp_path / "train.jsonl"), "--dev", str(tmp_path / "dev.jsonl")]
    tune = ["--init-from", str(run), "--task", "jsonl", *splits, "--out", str(tmp_path / "tune")]
    return {
        "generate": (generate.main, ["--run", str(run), "--prompt", "hi", "--device", "cpu"]),
        "perplexity": (
            evaluate.main,
            ["perplexity", "--run", str(run), "--data", str(tmp_path / "text.txt")],
        ),
        "resume": (pretrain.main, ["--resume", str(run), "--steps", "4", "--device", "cpu"]),
        "pretrain --init-from": (
            pretrain.main,
            ["--init-from", str(run), *one_step_argv(tmp_path / "text.txt", tmp_path / "p")],
        ),
        "finetune --init-from": (finetune.main, [*tune, "--epochs", "1", "--device", "cpu"]),
    }


@pytest.mark.parametrize(
    "command", ["generate", "perplexity", "resume", "pretrain --init-from", "finetune --init-from"]
)
def test_a_tokenizer_swapped_for_another_of_its_size_is_refused_wherever_the_run_is_loaded(
    run, tmp_path, capsys, command
):
    swap_tokenizer(run)
    before = snapshot(run)
    main, argv = commands(run, tmp_path)[command]
    line = one_line(capsys, main, argv)
    assert f"{run}/tokenizer/" in line and f"changed since {run}/checkpoints/4/digests.json recorded" in line
    assert snapshot(run) == before
    with pytest.raises(ValueError, match=f"{run}/tokenizer/.*: changed since .*digests.json recorded"):
        GPT.from_pretrained(run)


@pytest.mark.parametrize(
    "command", ["generate", "perplexity", "resume", "pretrain --init-from", "finetune --init-from"]
)
def test_digests_removed_where_the_run_keeps_others_are_refused_wherever_the_run_is_loaded(
    run, tmp_path, capsys, command
):
    """A checkpoint's digests.json cannot go quietly: its run's other checkpoints hold their own."""
    (run / "checkpoints" / "4" / "digests.json").unlink()
    swap_tokenizer(run)
    before = snapshot(run)
    main, argv = commands(run, tmp_path)[command]
    line = one_line(capsys, main, argv)
    assert (
        f"{run}/checkpoints/4/digests.json: removed, though {run}/checkpoints/1, written before it," in line
    )
    assert snapshot(run) == before


@pytest.mark.parametrize(
    "command", ["generate", "perplexity", "resume", "pretrain --init-from", "finetune --init-from"]
)
def test_a_checkpoint_of_nan_weights_is_refused_up_front_wherever_it_is_loaded(
    run, tmp_path, capsys, command
):
    """Weights that are NaN train and generate nothing: every loader refuses them before any work."""
    path = run / "checkpoints" / "4" / "model.safetensors"
    save_file({name: np.full_like(a, np.nan) for name, a in load_file(str(path)).items()}, str(path))
    before = snapshot(run)
    main, argv = commands(run, tmp_path)[command]
    line = one_line(capsys, main, argv)
    assert (
        f"{run}/checkpoints/4: not a usable checkpoint: " in line and "holds NaN or infinite weights" in line
    )
    assert snapshot(run) == before


def test_nan_weights_are_refused_by_the_python_api_and_nan_moments_by_a_resume(run, capsys):
    model = run / "checkpoints" / "4" / "model.safetensors"
    weights = load_file(str(model))
    save_file({name: np.full_like(a, np.inf) for name, a in weights.items()}, str(model))
    with pytest.raises(
        ValueError, match=f"^{run}/checkpoints/4: not a usable checkpoint: .* holds NaN or inf"
    ):
        GPT.from_pretrained(run)
    save_file(weights, str(model))
    moments = run / "checkpoints" / "4" / "optimizer.safetensors"
    save_file({name: np.full_like(a, np.nan) for name, a in load_file(str(moments)).items()}, str(moments))
    before = snapshot(run)
    line = one_line(capsys, pretrain.main, ["--resume", str(run), "--steps", "6"])
    assert f"{moments}: " in line and "holds NaN or infinite numbers: not a usable checkpoint" in line
    save_file({name: -np.ones_like(a) for name, a in load_file(str(moments)).items()}, str(moments))
    before = snapshot(run)
    line = one_line(capsys, pretrain.main, ["--resume", str(run), "--steps", "6"])
    assert f"{moments}: v." in line and "holds negative second moments: not a usable checkpoint" in line
    assert snapshot(run) == before


def test_checkpoints_older_than_the_runs_digests_load_with_a_warning_and_a_best_without_them_is_refused(
    run, tuned, tmp_path, capsys
):
    """A run older than digests, resumed: its checkpoints from before the resume hold none, the later
    ones do. The old ones still load (with the warning); a fine-tune's best/ without them, where every
    checkpoint holds its own, was emptied of them."""
    for step in (1, 2):
        (run / "checkpoints" / str(step) / "digests.json").unlink()
    with pytest.warns(UserWarning, match="checkpoints/2 holds no digests.json"):
        GPT.from_pretrained(run / "checkpoints" / "2")
    GPT.from_pretrained(run / "checkpoints" / "4")
    shutil.copytree(tuned, tmp_path / "tuned")
    (tmp_path / "tuned" / "best" / "digests.json").unlink()
    with pytest.raises(
        ValueError, match=r"best/digests.json: removed, though .*/checkpoints/\d+, written before"
    ):
        GPT.from_pretrained(tmp_path / "tuned")


def test_digests_that_are_not_a_file_are_named_as_such(run):
    digests = run / "checkpoints" / "4" / "digests.json"
    digests.unlink()
    digests.mkdir()
    with pytest.raises(ValueError, match=f"^{digests}: not a file of digests$"):
        GPT.from_pretrained(run)


def test_a_run_without_digests_loads_with_a_one_line_warning(run, capsys):
    """Weights of a run older than digests (no weights folder holds them) load, and say they go unchecked."""
    for folder in (run / "checkpoints").iterdir():
        (folder / "digests.json").unlink()
    swap_tokenizer(run)
    with pytest.warns(
        UserWarning, match=r"checkpoints/4 holds no digests.json: the run's config and tokenizer"
    ):
        GPT.from_pretrained(run)
    capsys.readouterr()
    generate.main(["--run", str(run), "--prompt", "hi", "--device", "cpu", "--max-new-tokens", "2"])
    [line] = capsys.readouterr().err.splitlines()
    assert (
        line == f"warning: {run}/checkpoints/4 holds no digests.json: the run's config and tokenizer go "
        "unchecked against its weights"
    )


@pytest.fixture(scope="module")
def tuned(setup, tmp_path_factory):
    """A fine-tune of two epochs: best/ and a checkpoint at each epoch's end."""
    return finetune_run(setup, tmp_path_factory.mktemp("tuned") / "run", "--epochs", 2, "--limit-train", 32)


def test_labels_reordered_are_refused_by_predict(setup, tuned, tmp_path, capsys):
    shutil.copytree(tuned, tmp_path / "run")
    labels = tmp_path / "run" / "labels.json"
    labels.write_text(json.dumps(json.loads(labels.read_text())[::-1]))
    argv = [
        "predict",
        "--run",
        str(tmp_path / "run"),
        "--data",
        str(setup[4]),
        "--out",
        str(tmp_path / "p.jsonl"),
    ]
    line = one_line(capsys, evaluate.main, [*argv, "--device", "cpu"])
    assert f"--run: {labels}: changed since {tmp_path / 'run' / 'best' / 'digests.json'} recorded" in line


def test_init_from_a_fine_tune_takes_its_best_epoch_and_says_so_first(setup, tuned, tmp_path, capsys):
    capsys.readouterr()
    finetune_run(setup, tmp_path / "again", "--epochs", 1, "--limit-train", 16, "--init-from", tuned)
    first = capsys.readouterr().out.splitlines()[0]
    assert (
        first
        == f"starting from the weights in {tuned}/best (of a run: its best/, else its newest checkpoint)"
    )
    best = GPT.from_pretrained(tuned / "best")
    assert all(
        np.array_equal(a, GPT.from_pretrained(tuned).state_dict()[n]) for n, a in best.state_dict().items()
    )


@pytest.mark.parametrize("name", ["٤٥", "007", "٣"])
def test_only_ascii_digit_folders_are_checkpoints(run, tmp_path, capsys, name):
    shutil.copytree(run / "checkpoints" / "1", run / "checkpoints" / name)
    assert checkpoint_steps(run) == [1, 2, 3, 4]
    generate.main(["--run", str(run), "--prompt", "hi", "--device", "cpu", "--max-new-tokens", "2"])
    pretrain.main(["--resume", str(run), "--steps", "4", "--device", "cpu"])
    pretrain.main(["--resume", str(run / "checkpoints" / "3"), "--steps", "3", "--device", "cpu"])
    assert (run / "checkpoints" / name).is_dir() and checkpoint_steps(run) == [1, 2, 3]


def test_a_metrics_file_that_is_a_folder_is_named_as_it_is(run, capsys):
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").mkdir()
    line = one_line(capsys, pretrain.main, ["--resume", str(run), "--steps", "4", "--device", "cpu"])
    assert line.endswith(f"--resume: {run}/metrics.jsonl: not a file")
