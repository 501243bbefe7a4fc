"""Reading the files a stranger may hand us (config.json, tokenizer files, label lists, text), and
writing a file whole or not at all.

Bad content is a ValueError and an unreadable file an OSError, each naming the file (and the line
where there is one), so that a command line can print it as one line.
"""

import contextlib
import glob
import json
import os
from pathlib import Path


def read_text(path, encoding="utf-8", errors="strict"):
    """The text of a file (a BOM dropped); with errors="strict" a byte that does not decode is a
    ValueError naming its line and offset."""
    data = Path(path).read_bytes()
    try:
        return data.decode(encoding, errors).removeprefix("\ufeff")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ValueError(
            f"{path}: line {line}: not valid {encoding.upper()} at byte {error.start} ({error.reason})"
        ) from None


def read_json(path):
    """The JSON value in a UTF-8 file."""
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{path}: line {error.lineno} column {error.colno}: not valid JSON ({error.msg})"
        ) from None
    except (ValueError, RecursionError) as error:  # an integer of over 4300 digits; nesting too deep
        raise ValueError(f"{path}: not readable JSON ({error})") from None


def write_whole(path, data):
    """Write the bytes `data` to `path` whole or not at all: to path.partial-<pid>, flushed to the disk,
    then renamed over it; a device or a pipe (/dev/stdout) is written as it is. An OSError (a full disk)
    names `path`."""
    special = os.path.exists(path) and not os.path.isfile(path)
    temporary = path if special else f"{path}.partial-{os.getpid()}"
    try:
        with open(temporary, "wb") as file:
            file.write(data)
            file.flush()
            if not special:
                os.fsync(file.fileno())
                os.replace(temporary, path)
    except OSError as error:
        raise OSError(error.errno, error.strerror, path) from None
    finally:
        if not special:
            with contextlib.suppress(FileNotFoundError):
                os.remove(temporary)


class UndecodableFiles(ValueError):
    """Text files that do not decode: `problems` names each with the line and offset of its first
    bad byte. The message ends with how to read them all the same."""

    def __init__(self, problems):
        self.problems = problems
        super().__init__(self.advice())

    def advice(self, flags=False):
        """The problems and what to pass to read the files: keyword arguments, or a command line's
        flags (--errors, --encoding)."""
        replace, latin1 = "errors='replace'", "encoding='latin-1'"
        if flags:
            replace, latin1 = "--errors replace", "--encoding latin-1"
        them = "it" if len(self.problems) == 1 else "them"
        remedy = f"convert {them}, or pass {replace} (bad bytes become U+FFFD) or {latin1}"
        return ("; " if len(self.problems) == 1 else "\n").join([*self.problems, remedy])


def find_text_files(paths):
    """Expand files, folders (every *.txt below) and glob patterns into a sorted list."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files = []
    for path in map(str, paths):
        if any(char in path for char in "*?["):
            matches = sorted(glob.glob(path, recursive=True))
            if not matches:
                raise ValueError(f"{path}: the pattern matches no file")
            files += find_text_files(matches)
        elif Path(path).is_dir():
            files += sorted(Path(path).rglob("*.txt"))
        elif Path(path).is_file():
            files.append(Path(path))
        else:
            raise ValueError(f"{path}: no such file or folder")
    return files


def read_text_files(paths, encoding="utf-8", errors="strict"):
    """The texts of files, folders (every *.txt below) and globs, each line end ("\\r\\n", "\\r")
    made "\\n" as Python's text mode makes it. Every file is read before the files that do not
    decode are all named in one UndecodableFiles."""
    texts, problems = [], []
    for path in find_text_files(paths):
        try:
            texts.append(read_text(path, encoding, errors).replace("\r\n", "\n").replace("\r", "\n"))
        except ValueError as error:
            problems.append(str(error))
    if problems:
        raise UndecodableFiles(problems)
    return texts


def check_apart(output, inputs):
    """Raise ValueError where `output`, a path a command writes, is, holds or lies inside one of its
    `inputs` [(flag, path)], whose writing could change what it reads (links followed, a glob's
    matches taken); the message names the input."""
    there = os.path.realpath(output)
    for flag, path in inputs:
        for read in glob.glob(path) if any(char in path for char in "*?[") else [path]:
            here = os.path.realpath(read)
            common = os.path.commonpath([there, here])
            if common in (there, here):
                how = "is" if there == here else "holds" if common == there else "lies inside"
                raise ValueError(f"{output} {how} {flag} {read}: an output must stay apart from the inputs")
