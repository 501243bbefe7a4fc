"""What the README and the docs pages promise a new user: the quick start's install, snippets that run as
written (each found on its page by its section's title), the cache of prepared text, the top-level modules
the package installs, and links that lead to pages, files and headings that exist."""

import ast
import builtins
import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import autograd as ag
from train import data

ROOT = Path(__file__).resolve().parents[1]
README = "README.md"
PRETRAINING = "docs/pretraining.md"
FINE_TUNING = "docs/fine-tuning.md"
YOUR_OWN_OP = "docs/your-own-op.md"
PAGES = [README, *sorted(f"docs/{path.name}" for path in (ROOT / "docs").glob("*.md"))]


@functools.cache
def read(page):
    """The text of a page, named by its path from the repository root."""
    return (ROOT / page).read_text(encoding="utf-8")


def headings(text):
    """The lines of a markdown text and its headings outside code blocks, as (line index, level, title)."""
    lines, found, fenced = text.split("\n"), [], False
    for index, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (heading := re.match(r"(#+) (.+)$", line)):
            found.append((index, len(heading[1]), heading[2]))
    return lines, found


def section(page, title):
    """The text under a page's heading `title` (any level), up to its next heading of that level or above."""
    lines, found = headings(read(page))
    [(start, level)] = [(index, level) for index, level, name in found if name == title]
    end = next((index for index, n, _ in found if index > start and n <= level), len(lines))
    return "\n".join(lines[start + 1 : end])


def parts(page):
    """(title, text) of each part of a page, from one heading to the next of any level."""
    lines, found = headings(read(page))
    starts = [index for index, _, _ in found] + [len(lines)]
    return [(title, "\n".join(lines[index + 1 : end])) for (index, _, title), end in zip(found, starts[1:])]


def extras(text, pattern):
    [names] = re.findall(pattern, text)
    return set(names.split(","))


def test_the_quick_start_install_brings_matplotlib_and_ci_installs_as_much():
    """The quick start promises a loss curve, which matplotlib draws."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11
    asked = extras(section(README, "Quick start"), r"pip install -e '\.\[([\w,]+)\]'")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    installed = project["dependencies"] + [
        r for extra in asked for r in project["optional-dependencies"][extra]
    ]
    assert any(re.match(r"matplotlib\b", requirement) for requirement in installed)
    assert asked <= extras((ROOT / ".ci" / "run").read_text(), r"pip install --quiet -e '\.\[([\w,]+)\]'")


# docs/internals.md quotes the code's own lines, as excerpts (tests/test_pointers.py checks its names)
EXAMPLES = [page for page in PAGES if page != "docs/internals.md"]
SECTIONS = [(page, title, text) for page in EXAMPLES for title, text in parts(page) if "```python" in text]


@pytest.mark.parametrize("page, title, text", SECTIONS, ids=[f"{p}: {title}" for p, title, _ in SECTIONS])
def test_each_python_snippet_defines_every_name_it_uses(page, title, text):
    """A snippet runs on its own: it uses what it defines or imports, and builtins."""
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        defined = set(dir(builtins))
        nodes = list(ast.walk(ast.parse(block)))
        defined |= {
            alias.asname or alias.name.split(".")[0]
            for n in nodes
            if isinstance(n, (ast.Import, ast.ImportFrom))
            for alias in n.names
        }
        defined |= {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        defined |= {n.name for n in nodes if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        defined |= {n.arg for n in nodes if isinstance(n, ast.arg)}
        used = {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        assert used - defined == set()


def test_the_prepared_text_is_cached_where_the_docs_say(tmp_path, monkeypatch):
    monkeypatch.delenv("TINYGPT_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert data.cache_dir() == str(tmp_path / ".cache" / "tinygpt")
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "elsewhere"))
    assert data.cache_dir() == str(tmp_path / "elsewhere")
    page = read(PRETRAINING)
    assert "`~/.cache/tinygpt/datasets/<hash>/`" in page and "`TINYGPT_CACHE`" in page


def test_the_readme_names_the_top_level_modules_and_asks_for_a_virtual_environment():
    tomllib = pytest.importorskip("tomllib")
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    [note] = [p for p in section(README, "Quick start").split("\n\n") if "top-level modules" in p]
    for package in (pattern.rstrip("*") for pattern in patterns["include"]):
        assert f"`{package}`" in note
    assert "unrelated package on PyPI" in note and "virtual environment" in note


def snippets(page, title):
    """{file name: code} of a section's python snippets, each named on its first line (`# name.py`)."""
    blocks = re.findall(r"```python\n(.*?)```", section(page, title), re.S)
    return {re.match(r"# (\w+\.py)\n", block)[1]: block for block in blocks}


@pytest.fixture
def your_own_op(tmp_path, monkeypatch):
    """The namespace left by running the snippets of docs/your-own-op.md as one file, in order, beside
    the snippets as files of their own (which the later ones import)."""
    files = snippets(YOUR_OWN_OP, "Your own op")
    for name, code in files.items():
        (tmp_path / name).write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in [name.removesuffix(".py") for name in files]:
        monkeypatch.delitem(sys.modules, module, raising=False)
    namespace = {"__name__": "readme_op"}
    exec(compile("\n".join(files.values()), YOUR_OWN_OP, "exec"), namespace)
    return namespace


def test_your_own_ops_snippets_each_run_alone_as_the_files_they_name(tmp_path):
    """Each snippet in a folder of its own with the files it imports: the model trains, and pytest
    passes the two test files, the CUDA kernel's on the emulated device included."""
    files = snippets(YOUR_OWN_OP, "Your own op")
    assert list(files) == [
        "softplus.py",
        "softplus_mlp.py",
        "test_softplus.py",
        "fast_softplus.py",
        "test_fast_softplus.py",
    ]
    for name, code in files.items():
        (tmp_path / name).write_text(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = functools.partial(
        subprocess.run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    done = run([sys.executable, "softplus_mlp.py"])
    assert done.returncode == 0, done.stderr
    done = run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-s",
            "-p",
            "no:cacheprovider",
            "test_softplus.py",
            "test_fast_softplus.py",
        ]
    )
    assert done.returncode == 0 and " passed" in done.stdout, done.stdout + done.stderr
    [shown] = re.findall(r"it prints.*?:\n\n```\n(.*?)```", section(YOUR_OWN_OP, "Your own op"), re.S)
    for line in shown.splitlines():  # hypothesis's own default draws 100 examples, the profiles 25
        assert line.replace("25", "100") in done.stdout, done.stdout


def test_your_own_op_trains_in_a_model_and_passes_its_tests(your_own_op):
    op = your_own_op
    assert all(p.grad is not None and np.any(p.grad != 0) for p in op["model"].parameters())
    assert op["test_softplus_gradient"]() is None
    for device in ["cpu", "cuda-emulated"]:
        op["test_fast_softplus"](device)


def test_a_mistake_in_your_own_ops_backward_fails_as_the_page_shows(your_own_op, monkeypatch):
    op = your_own_op
    right = op["Softplus"].backward
    wrong = staticmethod(lambda ctx, grad: right(ctx, grad) * np.where(ctx.x > 1, 2.0, 1.0))
    monkeypatch.setattr(op["Softplus"], "backward", wrong)
    with pytest.raises(ag.GradcheckError) as failure:
        op["test_softplus_gradient"]()
    [shown] = re.findall(r"```\n(GradcheckError: .*?)```", section(YOUR_OWN_OP, "Your own op"), re.S)
    for line in shown.splitlines()[:2]:
        assert line.removeprefix("GradcheckError: ") in str(failure.value)
    notes = "\n".join(failure.value.__notes__)
    assert "x=array(2.)" in notes.replace(" ", "") and "x = array(2.) (requires grad: True)" in notes


def test_a_wrong_sign_in_your_own_cuda_kernel_fails_on_the_emulated_device(your_own_op, monkeypatch):
    kernels = your_own_op["fast_softplus"].__globals__["KERNELS"]  # what the test's op launches
    wrong = kernels.text.replace("grad[i] / (1.0f + expf(-x[i]))", "grad[i] / (1.0f + expf(x[i]))")
    assert wrong != kernels.text
    monkeypatch.setattr(kernels, "text", wrong)
    your_own_op["test_fast_softplus"]("cpu")
    with pytest.raises(
        AssertionError, match=r"gradient of x \(float32 on cuda-emulated\): fast path and reference"
    ):
        your_own_op["test_fast_softplus"]("cuda-emulated")


def test_your_own_command_counts_words_and_names_a_file_it_cannot_read(tmp_path):
    (tmp_path / "count_words.py").write_text(snippets(FINE_TUNING, "Your own command")["count_words.py"])
    (tmp_path / "text.txt").write_text("the cat sat on the mat\n", encoding="utf-8")
    (tmp_path / "latin.txt").write_bytes("café".encode("latin-1"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = functools.partial(subprocess.run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    done = run([sys.executable, "count_words.py", "--data", "text.txt"])
    assert done.returncode == 0 and done.stdout == "6 words\n", done.stderr
    for name in ("missing.txt", "latin.txt"):
        done = run([sys.executable, "count_words.py", "--data", name])
        assert done.returncode == 2 and done.stderr.startswith("python count_words.py: error: --data: ")
        assert done.stderr.count("\n") == 1, done.stderr


def test_your_own_evaluate_command_reads_a_run_and_names_one_it_cannot(tmp_path):
    from tests.train.runs import tiny_run
    from tinygpt.tokenizer import load_tokenizer

    (tmp_path / "tokens.py").write_text(snippets(FINE_TUNING, "Your own command")["tokens.py"])
    tiny_run(tmp_path / "run")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = functools.partial(subprocess.run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    done = run([sys.executable, "tokens.py", "tokens", "--run", "run", "--text", "the cat sat"])
    expected = load_tokenizer(tmp_path / "run" / "tokenizer").encode("the cat sat")
    assert done.returncode == 0 and done.stdout == f"{expected}\n", done.stderr
    done = run([sys.executable, "tokens.py", "tokens", "--run", "missing", "--text", "a"])
    assert (done.returncode, done.stderr.count("\n")) == (2, 1), done.stderr
    assert "tokens: error: --run: missing: no such run or checkpoint folder" in done.stderr
    done = run([sys.executable, "tokens.py", "perplexity", "--help"])
    assert done.returncode == 0 and "--max-tokens" in done.stdout


def test_your_own_task_is_read_and_fine_tuned(tmp_path):
    from tests.train.runs import tiny_run

    snippet = snippets(FINE_TUNING, "Your own task")["finetune_reviews.py"]
    (tmp_path / "finetune_reviews.py").write_text(snippet)
    tiny_run(tmp_path / "pretrained")
    rows = ["a good film\t1", "a bad film\t0", "the cat sat on the mat\t1", "the dog sat on the log\t0"]
    for name in ("train.tsv", "dev.tsv"):
        (tmp_path / name).write_text("review\tliked\n" + "\n".join(rows * 4) + "\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = ["--init-from", "pretrained", "--task", "reviews", "--train", "train.tsv", "--dev", "dev.tsv"]
    argv += ["--out", "out", "--epochs", "1", "--batch-size", "8", "--device", "cpu"]
    options = dict(cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    done = subprocess.run([sys.executable, "finetune_reviews.py", *argv], **options)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "config.json").is_file() and "accuracy" in done.stdout + done.stderr
    predicting = ["predict", "--run", "out", "--data", "dev.tsv", "--out", "p.jsonl", "--device", "cpu"]
    done = subprocess.run([sys.executable, "finetune_reviews.py", *predicting], **options)
    assert done.returncode == 0 and (tmp_path / "p.jsonl").is_file(), done.stderr
    for module, args in [("train.evaluate", predicting), ("train.finetune", ["--resume", "out"])]:
        done = subprocess.run([sys.executable, "-m", module, *args], **options)
        [line] = done.stderr.splitlines()
        assert done.returncode == 2 and "the task 'reviews' is not one of sst2, " in line, done.stderr
        assert (
            "a task that a launcher adds to train.tasks.TASKS is known where the command runs through" in line
        )


FENCED = re.compile(r"^```.*?^```", re.M | re.S)  # code blocks: commands, not links
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def relative_links(text):
    """The targets of a text's links and images outside code that are not URLs (`page#anchor`, `#anchor`)."""
    prose = re.sub(r"`[^`]*`", "", FENCED.sub("", text))
    return sorted({target for target in LINK.findall(prose) if not re.match(r"[a-z][\w+.-]*:", target)})


def anchor(title):
    """GitHub's anchor for a heading: lower case, code marks and punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def broken_links(page, text):
    """Why each relative link of `text` (the page at `page`) leads nowhere: no such file or heading."""
    broken = []
    for target in relative_links(text):
        path, _, heading = target.partition("#")
        file = (ROOT / page).parent.joinpath(path).resolve() if path else ROOT / page
        if not file.is_file():
            broken.append(f"{target}: no such file")
        elif heading and file.suffix == ".md":
            _, found = headings(text if file == ROOT / page else file.read_text(encoding="utf-8"))
            if heading not in {anchor(title) for _, _, title in found}:
                broken.append(f"{target}: no such heading")
    return broken


@pytest.mark.parametrize("page", PAGES)
def test_each_relative_link_leads_to_a_file_and_heading_that_exist(page):
    assert broken_links(page, read(page)) == []


def test_the_readme_ends_with_a_map_of_every_docs_page_and_each_page_it_names_exists():
    assert PAGES[1:] and headings(read(README))[1][-1][2] == "Documentation"
    mapped = relative_links(section(README, "Documentation"))
    assert mapped == PAGES[1:]  # every page of docs/, and no other target
    linked = {target.partition("#")[0] for target in relative_links(read(README))}
    assert all((ROOT / target).is_file() for target in linked if target.startswith("docs/"))


def test_the_link_checker_reports_missing_files_and_headings_and_skips_code_and_urls():
    text = (
        "# A page\n\n## Its part: `code` (1)\n[a](#its-part-code-1) [b](#no-part) [c](docs/gpu.md#on-a-gpu)\n"
        "[d](docs/gpu.md#no-part) ![e](docs/no-such.png) [f](https://example.org) `[g](no.md)`\n"
        "```\n[h](no-such.md)\n```\n"
    )
    assert len(relative_links(text)) == 5 and len(relative_links(read(README))) >= 10
    assert broken_links(README, text) == [
        "#no-part: no such heading",
        "docs/gpu.md#no-part: no such heading",
        "docs/no-such.png: no such file",
    ]
