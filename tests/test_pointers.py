"""Pointers that drift fail here. The pages (README.md, docs/*.md) name code in one form, in backticks:
`path` or `path:Name` (Name dotted, as `autograd/tensor.py:Tensor.backward`); a comment or docstring of
the code names a file of the repository by its path, bare, with `:Name` where it means one thing in it.
Each must name a file of the repository and, for a Python file, a def, class or assignment at its top
level or inside its classes (found with ast, nothing imported); for a C++/CUDA source, a word of its
text. A line of a CUDA source that docs/internals.md cites by number is the line it quotes (the links
of the pages are tests/test_readme.py's)."""

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from tests.helpers import FENCED

ROOT = Path(__file__).parents[1]
DOC = ROOT / "docs" / "internals.md"
TOP = r"(?:autograd|tinygpt|train|tests|bench|docs|\.ci)"  # where a path of the repository starts
PATH = rf"({TOP}/[\w./-]*\.(?:py|cuh|cu|h|cpp|md|toml)\b)(?::([A-Za-z_]\w*(?:\.\w+)*))?"
REFERENCE = re.compile(f"`{PATH}`")  # a page's; other files it names (an output, another project's) are not
CITATION = re.compile(rf"(?<![\w/.-]){PATH}")  # a comment's, bare
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CODE = sorted(
    path
    for folder in ("autograd", "tinygpt", "train", "tests", "bench", ".ci")
    for path in (ROOT / folder).rglob("*")
    if path.suffix in (".py", ".cu", ".cuh", ".h", ".cpp") and path != Path(__file__)
)


def references(text):
    """The (path, name) pairs of the code references outside code blocks; name is '' for a bare path."""
    return sorted(set(REFERENCE.findall(FENCED.sub("", text))))


def assigned(target):
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from assigned(element)


@cache
def python_names(path):
    """The dotted names a Python file defines: defs, classes and assigned names, top-level and in classes."""
    names = set()

    def visit(body, prefix):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(prefix + node.name)
                if isinstance(node, ast.ClassDef):
                    visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(prefix + name for target in targets for name in assigned(target))

    visit(ast.parse(path.read_text(encoding="utf-8")).body, "")
    return names


def problem(path, name):
    """Why the reference `path[:name]` is broken, or None where it is sound."""
    file = ROOT / path
    if not file.is_file():
        return f"{path}: no such file"
    if not name:
        return None
    if file.suffix == ".py":
        return None if name in python_names(file) else f"{path} defines no {name}"
    found = re.search(rf"\b{re.escape(name)}\b", file.read_text(encoding="utf-8"))
    return None if found else f"{path} has no {name}"


TEXT = DOC.read_text(encoding="utf-8")


def page_references():
    """(page, path, name) of every code reference of every page."""
    return [(page.name, path, name) for page in PAGES for path, name in references(page.read_text("utf-8"))]


def code_citations():
    """(file, path, name) of every path a file of the code cites (its own tests of the checker aside)."""
    cited = {(str(f.relative_to(ROOT)), *c) for f in CODE for c in CITATION.findall(f.read_text("utf-8"))}
    return sorted(cited)


@pytest.mark.parametrize("page, path, name", page_references(), ids=lambda value: value or "-")
def test_each_code_reference_of_a_page_names_what_is_there(page, path, name):
    assert problem(path, name) is None, f"{page}: {problem(path, name)}"


@pytest.mark.parametrize("file, path, name", code_citations(), ids=lambda value: value or "-")
def test_each_path_a_comment_cites_names_what_is_there(file, path, name):
    assert problem(path, name) is None, f"{file}: {problem(path, name)}"


def test_the_pages_and_the_code_hold_enough_pointers_to_check():
    assert len(references(TEXT)) >= 30  # a broken pattern would otherwise check nothing, and pass
    assert len(code_citations()) >= 100


def test_the_checker_reports_made_up_references_and_skips_code_blocks():
    text = (
        "`autograd/tensor.py:Tensor.backward` `autograd/tensor.py:Tensor.fly` `autograd/no_such.py`\n"
        "`autograd/kernels/cuda/gelu.cu:gelu_forward` `autograd/kernels/cuda/gelu.cu:gelu_fly`\n"
        "```\n`autograd/in_a_code_block.py`\n```\n"
    )
    found = {f"{p}:{n}" if n else p: problem(p, n) for p, n in references(text)}
    assert found == {
        "autograd/tensor.py:Tensor.backward": None,
        "autograd/tensor.py:Tensor.fly": "autograd/tensor.py defines no Tensor.fly",
        "autograd/no_such.py": "autograd/no_such.py: no such file",
        "autograd/kernels/cuda/gelu.cu:gelu_forward": None,
        "autograd/kernels/cuda/gelu.cu:gelu_fly": "autograd/kernels/cuda/gelu.cu has no gelu_fly",
    }


def test_each_line_the_page_cites_is_the_line_it_quotes():
    """`break gelu.cu:17` goes stale when gelu.cu moves: outside its transcripts, the page quotes each
    line of a CUDA source it cites by number (a breakpoint, where a session stops)."""
    prose = FENCED.sub("", TEXT)
    cited = re.findall(r"(\w+\.cuh?):(\d+)\b.*?the line `([^`]+)`", prose, re.S)
    assert len(cited) == len(re.findall(r"\w+\.cuh?:\d+", prose)) >= 3
    for file, line, quoted in cited:
        source = (ROOT / "autograd" / "kernels" / "cuda" / file).read_text().splitlines()
        assert source[int(line) - 1].strip().startswith(quoted), f"{file}:{line} is not `{quoted}`"
