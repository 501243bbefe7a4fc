"""No user error ends in a traceback: a missing or broken tokenizer, a --data folder holding a folder
named x.txt, a name too long, a prompt that is not text, an output that cannot be written, a run's
config.json or checkpoint that is damaged, a dev file of another layout than the training file's
each end a command with one line (status 2 for a usage error found before the work, 1 for a failed
run), and nothing in the run folder is changed. The property draws every command (pretrain's resume,
finetune and its resume, predict, generate, the evaluations) with a damaged file of its run folder,
a bad path, or (fine-tuning and predict) task files of mixed layouts, blank lines, missing fields,
bad values, or a folder where a file goes."""

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from train import evaluate, finetune, generate, prepare, pretrain

from .runs import SMALLER, copy_of_run, examples, one_step_argv, pretrain_argv, stopped, tiny_run, write_jsonl


def one_line_error(capsys, main, argv, status=2):
    """The one stderr line of main(argv), which must stop it with `status` (either of 1, 2: None)."""
    code, err = stopped(capsys, main, argv)
    if isinstance(code, str):  # sys.exit(message): Python prints it, the status is 1
        code, err = 1, err + code
    assert code in ((1, 2) if status is None else (status,))
    [line] = err.strip().splitlines()
    return line


def snapshot(folder):
    """Every file under `folder` (but the lock file) and a digest of its bytes."""
    files = {}
    for root, _, names in os.walk(folder):
        for name in names:
            if name != ".lock":
                path = os.path.join(root, name)
                files[os.path.relpath(path, folder)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    return files


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """(a pretraining run folder at step 1, its corpus, a folder for the token cache)."""
    root = tmp_path_factory.mktemp("user_errors")
    corpus = root / "corpus.txt"
    corpus.write_text("The cat sat on the mat and the dog sat on the log. " * 40, encoding="utf-8")
    cache = root / "cache"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TINYGPT_CACHE", str(cache))
        pretrain.main(one_step_argv(corpus, root / "run"))
    return root / "run", corpus, cache


@pytest.fixture
def run(base, tmp_path, monkeypatch):
    """A copy of the base run, on the base run's token cache."""
    return copy_of_run(base, tmp_path, monkeypatch)


@pytest.mark.parametrize("flag", ["--tokenizer", "--gpt1-tokenizer"])
@pytest.mark.parametrize("broken", [False, True])
def test_a_missing_or_broken_tokenizer_is_a_usage_error(base, tmp_path, capsys, monkeypatch, flag, broken):
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "tokenizer"
    if broken:
        folder.mkdir()
        for name in ("vocab.json", "merges.txt", "encoder_bpe_40000.json", "vocab_40000.bpe"):
            (folder / name).write_text("{not json")
    line = one_line_error(capsys, pretrain.main, one_step_argv(base[1], tmp_path / "out", flag, str(folder)))
    assert str(folder) in line and not (tmp_path / "out").exists()


def test_resuming_a_run_whose_tokenizer_is_broken_is_a_usage_error(run, capsys):
    (run / "tokenizer" / "vocab.json").write_text("{not json")
    before = snapshot(run)
    line = one_line_error(capsys, pretrain.main, ["--resume", str(run), "--steps", "2"])
    assert "vocab.json" in line and snapshot(run) == before


def test_resuming_a_fine_tune_whose_tokenizer_is_broken_is_a_usage_error(tuned, tmp_path, capsys):
    shutil.copytree(tuned / "tuned", tmp_path / "tuned")
    (tmp_path / "tuned" / "tokenizer" / "special_tokens.json").write_text("{not json")
    line = one_line_error(capsys, finetune.main, ["--resume", str(tmp_path / "tuned"), "--device", "cpu"])
    assert line.startswith("python -m train.finetune: error: --resume: ") and "special_tokens.json" in line


def test_resuming_a_whole_fine_tune_whose_metrics_lost_its_epochs_reports_none(tuned, tmp_path, capsys):
    shutil.copytree(tuned / "tuned", tmp_path / "tuned")
    (tmp_path / "tuned" / "metrics.jsonl").write_text("")
    finetune.main(["--resume", str(tmp_path / "tuned"), "--device", "cpu"])
    assert "no dev epoch logged" in capsys.readouterr().out


def test_data_that_is_no_file_or_corpus_is_a_usage_error_naming_what_it_is(base, tmp_path, capsys):
    os.mkfifo(tmp_path / "pipe.txt")
    (tmp_path / "loop.txt").symlink_to(tmp_path / "loop.txt")
    for path, what in [
        ("/dev/zero", "a character device, not a file or a folder"),
        (tmp_path / "pipe.txt", "a FIFO, not"),
    ]:
        line = one_line_error(capsys, pretrain.main, one_step_argv(path, tmp_path / "out"))
        assert f"--data: {path}: {what}" in line and not (tmp_path / "out").exists()
        argv = ["perplexity", "--run", str(base[0]), "--data", str(path), "--device", "cpu"]
        assert f"--data: {path}: {what}" in one_line_error(capsys, evaluate.main, argv)
    line = one_line_error(
        capsys, prepare.main, ["--data", str(tmp_path / "loop.txt"), "--out", str(tmp_path / "o")]
    )
    assert f"--data: {tmp_path / 'loop.txt'}: Too many levels of symbolic links" in line


def test_a_tokenizer_that_stops_short_says_so_and_the_run_records_what_it_built(
    base, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("TINYGPT_CACHE", str(base[2]))
    pretrain.main(one_step_argv(base[1], tmp_path / "out", "--vocab-size", "99999999"))
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    built = config["model"]["vocab_size"]
    assert built < 1000 and config["settings"]["vocab_size"] == built
    assert f"asked for 99,999,999 tokens, built {built:,}: every word" in capsys.readouterr().out


@pytest.mark.parametrize("split", ["dev", "test"])
def test_a_file_of_another_layout_than_the_training_files_is_refused_row_by_row(
    tuned, tmp_path, capsys, split
):
    """A dev or test file whose rows (from the first, or from the third) are premise/hypothesis pairs
    beside a training file of texts: refused with the file and line, before a run folder is made."""
    pairs = [{"premise": "a cat", "hypothesis": "a dog", "label": "pos"}] * 3
    for first_bad in (1, 3):
        rows = [*examples(first_bad - 1, 0), *pairs]
        other = write_jsonl(tmp_path / f"{split}.jsonl", rows)
        files = {"--train": tuned / "train.jsonl", "--dev": tuned / "dev.jsonl", f"--{split}": other}
        argv = ["--init-from", tuned.parent / "run", "--task", "jsonl", *sum(files.items(), ())]
        line = one_line_error(capsys, finetune.main, [*map(str, argv), "--out", str(tmp_path / "out")])
        expected = "fields hypothesis, label, premise, not the training examples' label, text"
        assert f"--{split}: {other}: line {first_bad}: {expected}" in line
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("which", ["--data", "--out"])
def test_a_name_too_long_is_a_usage_error(base, tmp_path, capsys, which):
    long = tmp_path / ("a" * 300)
    argv = one_step_argv(long, tmp_path / "out") if which == "--data" else one_step_argv(base[1], long)
    line = one_line_error(capsys, pretrain.main, argv)
    assert "File name too long" in line and not (tmp_path / "out").exists()


def test_a_prompt_that_is_not_text_is_a_usage_error(tmp_path, capsys):
    tiny_run(tmp_path / "run")
    line = one_line_error(capsys, generate.main, ["--run", str(tmp_path / "run"), "--prompt", "\udc80"])
    assert "--prompt" in line


@pytest.mark.parametrize("command", ["perplexity", "attention"])
@pytest.mark.parametrize("how", ["read-only", "below a file"])
def test_an_output_that_cannot_be_written_is_a_usage_error_before_the_work(
    tmp_path, capsys, monkeypatch, command, how
):
    tiny_run(tmp_path / "run")
    (tmp_path / "text.txt").write_text("the cat sat on the mat. " * 20)
    (tmp_path / "file").write_text("")
    folder = tmp_path / ("file" if how == "below a file" else "out")
    folder.mkdir(exist_ok=True) if how == "read-only" else None
    if how == "read-only":  # the tests run as root, whom chmod does not stop
        monkeypatch.setattr(os, "access", lambda path, mode: not str(path).startswith(str(folder)))
    monkeypatch.setattr("train.cli.load_run", lambda *a: pytest.fail("the work began"))
    run = ["--run", str(tmp_path / "run"), "--device", "cpu"]
    if command == "perplexity":
        argv = ["perplexity", *run, "--data", str(tmp_path / "text.txt"), "--json", str(folder / "r.json")]
    else:
        argv = ["attention", *run, "--text", "hi", "--layer", "0", "--out", str(folder / "a.png")]
    line = one_line_error(capsys, evaluate.main, argv)
    assert str(folder) in line


@pytest.mark.parametrize(
    "change",
    [
        lambda config: {**config, "settings": 5},
        lambda config: {**config, "settings": {**config["settings"], "batch_size": "eight"}},
        lambda config: {**config, "settings": {**config["settings"], "steps": 0}},
        lambda config: {**config, "settings": {**config["settings"], "steps": None}},
        lambda config: {**config, "settings": {**config["settings"], "batch_size": []}},
        lambda config: {**config, "settings": {**config["settings"], "data_hash": True}},
    ],
    ids=["settings", "batch_size", "steps", "steps None", "batch_size []", "data_hash"],
)
def test_a_damaged_config_is_a_usage_error_of_resume(run, capsys, change):
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps(change(config)))
    before = snapshot(run)
    line = one_line_error(capsys, pretrain.main, ["--resume", str(run), "--steps", "2"])
    assert "--resume" in line and snapshot(run) == before


def test_a_real_bug_is_still_a_traceback(tmp_path, monkeypatch):
    tiny_run(tmp_path / "run")
    monkeypatch.setattr(generate, "generate", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        generate.main(["--run", str(tmp_path / "run"), "--prompt", "hi", "--device", "cpu"])


# the property: generated bad arguments and damaged run-folder files
# (a name holding a line break, which a command line may give, prints as it is: over two lines)
TEXT = st.text(st.characters(exclude_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"), max_size=4)
WRONG = st.none() | st.booleans() | st.integers(-3, 3) | st.floats() | TEXT | st.just([])


@pytest.fixture(scope="module")
def tuned(base):
    """A folder of a fine-tune of the base run (tuned/: one epoch on 8 examples) beside its train, dev
    and test files (jsonl)."""
    folder = base[0].parent / "tuned"
    folder.mkdir()
    splits = [
        arg for seed, split in enumerate(("train", "dev", "test")) for arg in (split, examples(8, seed))
    ]
    for split, rows in zip(splits[::2], splits[1::2]):
        write_jsonl(folder / f"{split}.jsonl", rows)
    argv = [
        "--init-from",
        base[0],
        "--task",
        "jsonl",
        "--train",
        folder / "train.jsonl",
        "--dev",
        folder / "dev.jsonl",
    ]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TINYGPT_CACHE", str(base[2]))
        finetune.main([*map(str, argv), "--out", str(folder / "tuned"), "--epochs", "1", "--batch-size", "4"])
    return folder


@st.composite
def damage(draw, run):
    """Change one file of `run`: cut short, replaced by bytes, or (config.json) a field of the wrong type."""
    files = sorted(
        str(path.relative_to(run)) for path in run.rglob("*") if path.is_file() and path.name != ".lock"
    )
    name = draw(st.sampled_from(files))
    path = run / name
    data = path.read_bytes()
    how = draw(st.sampled_from(["cut", "bytes", "field"]))
    if how == "cut":
        data = data[: draw(st.integers(0, max(len(data) - 1, 0)))]
    elif how == "bytes":
        data = draw(st.binary(max_size=64))
    else:
        config = json.loads((run / "config.json").read_text())
        part = draw(st.sampled_from(["model", "settings"]))
        field = draw(st.sampled_from(sorted(config[part])))
        config[part][field] = draw(WRONG)
        path, data = run / "config.json", json.dumps(config).encode()
    path.write_bytes(data)
    return name


def commands(run, tuned, tmp):
    """(main, argv, the run folder it reads) of each command: `run` a pretraining run at step 1 (a resume
    of --steps 1 trains no step), `tuned` a whole fine-tune of it (a resume trains no step)."""
    text, results, cpu = str(tmp / "text.txt"), str(tmp / "results.json"), ["--device", "cpu"]
    attention = ["attention", "--run", str(run), "--text", "hi", "--layer", "0", "--out", str(tmp / "a.png")]
    splits = ["--train", str(tmp / "train.jsonl"), "--dev", str(tmp / "dev.jsonl")]
    tune = ["--init-from", str(run), "--task", "jsonl", *splits, "--out", str(tmp / "tune"), "--epochs", "1"]
    sst2 = ["--init-from", str(run), "--task", "sst2", "--train", str(tmp / "train.tsv")]
    sst2 += ["--dev", str(tmp / "dev.tsv"), "--out", str(tmp / "tune"), "--epochs", "1"]
    predict = [
        "predict",
        "--run",
        str(tuned),
        "--data",
        str(tmp / "test.jsonl"),
        "--out",
        str(tmp / "p.jsonl"),
    ]
    return {
        "generate": (
            generate.main,
            ["--run", str(run), "--prompt", "hi", "--max-new-tokens", "2", *cpu],
            run,
        ),
        "perplexity": (
            evaluate.main,
            ["perplexity", "--run", str(run), "--data", text, "--json", results, *cpu],
            run,
        ),
        "attention": (evaluate.main, [*attention, *cpu], run),
        "summary": (evaluate.main, ["summary", "--run", str(run)], run),
        "resume": (pretrain.main, ["--resume", str(run), "--steps", "1", *cpu], run),
        "finetune": (
            finetune.main,
            [*tune, "--test", str(tmp / "test.jsonl"), "--batch-size", "4", *cpu],
            run,
        ),
        "finetune sst2": (finetune.main, [*sst2, "--batch-size", "4", *cpu], run),
        "predict": (evaluate.main, [*predict, *cpu], tuned),
        "resume a fine-tune": (finetune.main, ["--resume", str(tuned), *cpu], tuned),
    }


BAD_PATHS = st.sampled_from(["missing", "a" * 300, "file/below", "file", "\udcff", ""])


# rows of a jsonl task file: the training file's layout, rows to predict, other layouts, missing fields,
# bad values, blank lines, and text that holds the special tokens' names
JSONL_ROWS = [
    *(json.dumps(row) for row in examples(3, 5)),
    '{"text": "a _start_ cat _classify_", "label": "pos"}',
    '{"text": "a cat", "id": "q1"}',
    '{"premise": "a cat", "hypothesis": "a dog", "label": "pos"}',
    '{"text_a": "a", "text_b": "b", "score": 1.5}',
    '{"context": "a", "choices": ["b", "c"], "label": 0}',
    '{"label": "pos"}',
    '{"text": 5, "label": "pos"}',
    '{"text": "a cat", "label": 1}',
    '{"text": "a cat", "label": "other"}',
    '{"text": "a cat", "label": "pos", "id": [1]}',
    "",
    "  ",
    "not json",
    "[1, 2]",
]
TSV_HEADERS = ["sentence\tlabel", "index\tsentence", "sentence", "text\tlabel", ""]
TSV_ROWS = ["the cat sat\t1", "a dog\t0", "a _classify_ hat\t1", "", "one column", "a\tb\tc", "odd\t2", "\t1"]


@st.composite
def task_file(draw, path):
    """Rewrite the task file `path` (jsonl or, for sst2, tsv) with drawn rows, or put a folder there."""
    if draw(st.integers(0, 9)) == 0:
        path.unlink()
        path.mkdir()
        return
    rows = st.lists(
        st.sampled_from(TSV_ROWS if path.suffix == ".tsv" else JSONL_ROWS), min_size=1, max_size=8
    )
    lines = ([draw(st.sampled_from(TSV_HEADERS))] if path.suffix == ".tsv" else []) + draw(rows)
    path.write_text("\n".join(lines) + draw(st.sampled_from(["\n", ""])), encoding="utf-8")


def tsv_files(tmp):
    """train.tsv and dev.tsv of SST-2 in `tmp`, from the texts of the jsonl files."""
    for split in ("train", "dev"):
        rows = [json.loads(line) for line in (tmp / f"{split}.jsonl").read_text().splitlines()]
        cells = [f"{row['text']}\t{int(row['label'] == 'pos')}" for row in rows]
        (tmp / f"{split}.tsv").write_text("\n".join(["sentence\tlabel", *cells]) + "\n", encoding="utf-8")


TASK_FILES = ("train.jsonl", "dev.jsonl", "test.jsonl", "train.tsv", "dev.tsv")
TASK_FLAGS = ["--skip-bad-rows", "--special-tokens-as-text"]
# HYPOTHESIS_PROFILE=thorough runs that profile's count; 15 examples (commands) otherwise
EXAMPLES = 15 if settings.default.max_examples < 100 else settings.default.max_examples


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.data())
def test_no_generated_user_error_ends_in_a_traceback(base, tuned, tmp_path_factory, capsys, data):
    """Each command ends normally, or with one line, status 1 or 2, and a usage error (2) leaves the
    run folder it reads as it was."""
    tmp = tmp_path_factory.mktemp("case")
    shutil.copytree(base[0], tmp / "run")
    shutil.copytree(tuned, tmp, dirs_exist_ok=True)  # tmp/tuned, and the jsonl files
    tsv_files(tmp)
    (tmp / "text.txt").write_text("the cat sat on the mat. " * 20)
    (tmp / "file").write_text("")
    name, (main, argv, run) = data.draw(
        st.sampled_from(sorted(commands(tmp / "run", tmp / "tuned", tmp).items()))
    )
    event(name)  # pytest --hypothesis-show-statistics: how often each command ran
    files = [i for i, arg in enumerate(argv) if arg in {str(tmp / name) for name in TASK_FILES}]
    how = data.draw(st.sampled_from(["damage", "path", *(["task files"] if files else [])]))
    event(how)
    if how == "damage":  # a damaged file of the run
        data.draw(damage(run))
    elif how == "path":  # a bad path in place of one the command reads or writes
        index = data.draw(st.sampled_from([i for i, arg in enumerate(argv) if str(tmp) in arg]))
        argv = [*argv[:index], str(tmp / data.draw(BAD_PATHS)), *argv[index + 1 :]]
    else:  # task files drawn row by row, read with or without the flags for such files
        for index in data.draw(st.lists(st.sampled_from(files), min_size=1, unique=True)):
            data.draw(task_file(Path(argv[index])))
        argv += data.draw(st.lists(st.sampled_from(TASK_FLAGS), unique=True))
    before = snapshot(run)
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TINYGPT_CACHE", str(base[2]))
        try:
            main(argv)
        except SystemExit as stop:
            code = 1 if isinstance(stop.code, str) else stop.code
            lines = capsys.readouterr().err.strip().splitlines() or [stop.code]
            assert code in (1, 2) and len(lines) == 1 and lines[0].startswith("python -m train.")
            assert code == 1 or snapshot(run) == before


def test_predict_on_a_run_whose_settings_are_not_an_object_is_a_usage_error(tmp_path, capsys):
    tiny_run(tmp_path / "run")
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    (tmp_path / "run" / "config.json").write_text(json.dumps({**config, "settings": 5}))
    (tmp_path / "test.tsv").write_text("index\tsentence\n0\ta cat\n")
    argv = ["predict", "--run", str(tmp_path / "run"), "--data", str(tmp_path / "test.tsv"), "--task", "sst2"]
    line = one_line_error(capsys, evaluate.main, argv)
    assert "--run" in line and "not a fine-tuning run" in line


def test_the_settings_of_a_whole_run_pass_the_check(run):
    pretrain.main(["--resume", str(run), "--steps", "1", "--device", "cpu"])  # at step 1: no step to train


@pytest.mark.parametrize("command", ["pretrain", "finetune"])
def test_an_out_below_a_file_is_a_usage_error_before_anything_is_written(tmp_path, capsys, command):
    """A file where --out's parent folder goes: refused with one line before the work (it was met
    when the run first wrote, after the tokenizer and the model were built)."""
    (tmp_path / "file").write_text("not a folder")
    out = tmp_path / "file" / "run"
    common = ["--out", str(out), "--device", "cpu"]
    if command == "pretrain":
        line = one_line_error(capsys, pretrain.main, ["--data", str(tmp_path / "file"), *common])
    else:
        splits = ["--train", str(tmp_path / "file"), "--dev", str(tmp_path / "file")]
        argv = ["--init-from", str(tmp_path), "--task", "sst2", *splits, *common]
        line = one_line_error(capsys, finetune.main, argv)
    assert f"--out: [Errno 20] Not a directory: '{out}'" in line
    assert sorted(os.listdir(tmp_path)) == ["file"]


def test_a_path_that_is_not_utf8_is_printed_escaped(tuned, tmp_path, capsys):
    """An --out named by bytes that do not decode (a lone surrogate) is written, and named escaped."""
    out = tmp_path / "\udcff.jsonl"
    data = tuned / "test.jsonl"
    evaluate.main(
        ["predict", "--run", str(tuned / "tuned"), "--data", str(data), "--out", str(out), "--device", "cpu"]
    )
    assert out.exists() and f"in {tmp_path}/\\udcff.jsonl\n" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["pretrain", "finetune", "perplexity", "zeroshot", "predict"])
def test_a_missing_file_or_run_is_named_the_same_way_by_every_command(base, tuned, tmp_path, capsys, command):
    run, tune, missing = str(base[0]), str(tuned / "tuned"), str(tmp_path / "missing")
    out, cpu = ["--out", str(tmp_path / "out")], ["--device", "cpu"]
    splits, sst2 = ["--task", "jsonl", "--train", missing, "--dev", missing, *out, *cpu], ["--task", "sst2"]
    main, argv, flag = {
        "pretrain": (pretrain.main, pretrain_argv(missing, tmp_path / "out", size=SMALLER), "--data"),
        "finetune": (finetune.main, ["--init-from", run, *splits], "--train"),
        "perplexity": (evaluate.main, ["perplexity", "--run", run, "--data", missing, *cpu], "--data"),
        "zeroshot": (evaluate.main, ["zeroshot", "--run", run, *sst2, "--data", missing], "--data"),
        "predict": (evaluate.main, ["predict", "--run", tune, "--data", missing, *cpu], "--data"),
    }[command]
    assert one_line_error(capsys, main, argv).endswith(f"{flag}: {missing}: no such file or folder")
    if command in ("perplexity", "predict"):  # these open the run before they read --data
        argv[argv.index("--run") + 1] = missing
        line = one_line_error(capsys, main, argv)
        assert line.endswith(f"--run: {missing}: no such run or checkpoint folder")
