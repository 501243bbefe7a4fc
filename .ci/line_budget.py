"""Fail when a package outgrows its line budget in pyproject.toml ([tool.line-budget]).

A line counts when it holds code or a docstring: blank lines and lines holding only a comment do
not. Each package is budgeted as a whole, and so is the engine's reference path (the files a
reader reads to learn how autograd works), which must stay readable in one sitting.
"""

import io
import sys
import tokenize
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
NOT_CODE = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}


def count_lines(path):
    """The lines of a Python file that hold a token other than a comment or white space."""
    tokens = tokenize.tokenize(io.BytesIO(path.read_bytes()).readline)
    lines = set()
    for token in tokens:
        if token.type not in NOT_CODE:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines)


def main():
    budget = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["line-budget"]
    groups = {name: sorted((ROOT / name).rglob("*.py")) for name in budget["packages"]}
    groups["reference path of autograd"] = [ROOT / name for name in budget["reference"]["files"]]
    limits = {**budget["packages"], "reference path of autograd": budget["reference"]["budget"]}
    over = []
    for name, files in groups.items():
        lines = sum(count_lines(path) for path in files)
        print(f"{name:28} {lines:6,} lines of {limits[name]:6,}")
        if lines > limits[name]:
            over.append(f"{name}: {lines:,} lines, over its budget of {limits[name]:,}")
    if over:
        sys.exit("line budget exceeded (pyproject.toml, [tool.line-budget]):\n  " + "\n  ".join(over))


if __name__ == "__main__":
    main()
