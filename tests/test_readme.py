"""What the README promises a new user: the quick start's install, snippets that run as written,
the token cache, and the top-level modules the package installs."""

import ast
import builtins
import re
from pathlib import Path

import numpy as np
import pytest

import autograd as ag
from train import data

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def section(title):
    return README.split(f"## {title}\n")[1].split("\n## ")[0]


def extras(text, pattern):
    [names] = re.findall(pattern, text)
    return set(names.split(","))


def test_the_quick_start_install_brings_matplotlib_and_ci_installs_as_much():
    """The quick start promises a loss curve, which matplotlib draws."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11
    asked = extras(section("Quick start"), r"pip install -e '\.\[([\w,]+)\]'")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    installed = project["dependencies"] + [
        r for extra in asked for r in project["optional-dependencies"][extra]
    ]
    assert any(re.match(r"matplotlib\b", requirement) for requirement in installed)
    assert asked <= extras((ROOT / ".ci" / "run").read_text(), r"pip install --quiet -e '\.\[([\w,]+)\]'")


SECTIONS = [part for part in README.split("\n## ")[1:] if "```python" in part]


@pytest.mark.parametrize("text", SECTIONS, ids=[part.split("\n")[0] for part in SECTIONS])
def test_each_sections_python_snippets_define_every_name_they_use(text):
    """A snippet may use what it defines, builtins, and what an earlier snippet of its section defined."""
    defined = set(dir(builtins))
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
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


def test_the_token_cache_is_where_the_readme_says(tmp_path, monkeypatch):
    monkeypatch.delenv("TINYGPT_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert data.cache_dir() == str(tmp_path / ".cache" / "tinygpt")
    monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "elsewhere"))
    assert data.cache_dir() == str(tmp_path / "elsewhere")
    assert "`~/.cache/tinygpt/tokens/`" in README and "`TINYGPT_CACHE`" in README


def test_the_readme_names_the_top_level_modules_and_asks_for_a_virtual_environment():
    tomllib = pytest.importorskip("tomllib")
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    [note] = [p for p in section("Quick start").split("\n\n") if "top-level modules" in p]
    for package in (pattern.rstrip("*") for pattern in patterns["include"]):
        assert f"`{package}`" in note
    assert "unrelated package on PyPI" in note and "virtual environment" in note


def your_own_op():
    """The namespace left by running the snippets of "Your own op" as written, in order."""
    namespace = {}
    for block in re.findall(r"```python\n(.*?)```", section("Your own op"), re.S):
        exec(compile(block, "README.md", "exec"), namespace)
    return namespace


def test_your_own_op_trains_in_a_model_and_passes_its_five_line_test():
    op = your_own_op()
    assert all(p.grad is not None and np.any(p.grad != 0) for p in op["model"].parameters())
    tests = [name for name in op if name.startswith("test_")]
    assert tests == ["test_softplus_gradient", "test_softplus_fast_path_gives_the_references_numbers"]
    for name in tests:
        op[name]()


def test_a_mistake_in_your_own_ops_backward_fails_as_the_readme_shows(monkeypatch):
    op = your_own_op()
    right = op["Softplus"].backward
    wrong = staticmethod(lambda ctx, grad: right(ctx, grad) * np.where(ctx.x > 1, 2.0, 1.0))
    for path in ("backward", "backward_cpu"):  # the reference, and the CPU's fast path
        monkeypatch.setattr(op["Softplus"], path, wrong)
    with pytest.raises(ag.GradcheckError) as failure:
        op["test_softplus_gradient"]()
    [shown] = re.findall(r"```\n(GradcheckError: .*?)```", section("Your own op"), re.S)
    for line in shown.splitlines()[:2]:
        assert line.removeprefix("GradcheckError: ") in str(failure.value)
    assert "x=array(2.)" in "".join(failure.value.__notes__).replace("\n", "").replace(" ", "")
