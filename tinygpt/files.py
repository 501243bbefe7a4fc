"""Reading the files a stranger may hand us (config.json, tokenizer files, label lists).

Bad content is a ValueError and an unreadable file an OSError, each naming the file (and the line
where there is one), so that a command line can print it as one line.
"""

import json
from pathlib import Path


def read_text(path):
    """The text of a UTF-8 file (a BOM dropped); a bad byte is a ValueError naming its line."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ValueError(f"{path}: line {line}: not valid UTF-8 ({error.reason})") from None


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
