"""Readers for the fine-tuning tasks' files -> examples in tinygpt.transformations' format, with label maps.

Task names and file layouts are those of ../shared/data/README.md, each task's in its record
(train/tasks.py): GLUE's TSVs (sst2, cola, rte, qnli, mnli, stsb, mrpc), SNLI's JSONL (snli) and the
Story Cloze CSV (rocstories). `jsonl` reads your own data, one JSON object per line, in any one of
these layouts:

    {"text", "label"}   {"premise", "hypothesis", "label"}   {"text_a", "text_b", "label" | "score"}
    {"context", "choices": [...], "label": the index of the right choice}

A class's id is its index in the dataset's label names: the documented order for the named tasks,
the sorted labels of the file for jsonl. Save them with save_labels and pass them back as
`labels=` when reading a dev set, so that its ids are the train set's. A jsonl file's labels are
all strings or all integers: `1` and `"1"` in one file would be two classes, so the first row's
type decides and a row with the other is a bad row (nothing is converted behind your back).

A file without labels is read for predictions: GLUE's test files (a TSV without the label or score
column), or JSON lines without "label", "score" or "gold_label" (then none of its rows has one).
Each example's id, for the predictions, is the TSV's `index` column or a JSON line's "id" or
"idx", else its place among the examples (from 0).

Every file of a task has its layout: a dev, test or prediction file is read with `layout=`, the
fields of the training examples (Dataset.layout), which each of its rows must have (less the
label or score, for a row to predict). A row with the wrong number of columns or fields, fields
of another layout, a field of the wrong type, a score that is not a finite number, or an unknown
label, stops reading with a ValueError naming the file and line; with
skip_bad_rows=True it is left out and counted. Rows the dataset itself marks unusable (SNLI's
gold_label "-") are always left out and counted. A file that does not decode (as UTF-8 unless
`encoding=` says otherwise) is refused with the line of its first bad byte, and a label file
(save_labels) that is not a list of names with its name.
"""

import csv
import io
import itertools
import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tinygpt.files import UndecodableFiles, read_json, read_text
from tinygpt.transformations import KINDS, kind_of

from .tasks import TASKS, Tsv, unknown

STORY_COLUMNS = (
    "InputStoryid",
    "InputSentence1",
    "InputSentence2",
    "InputSentence3",
    "InputSentence4",
    "RandomFifthSentenceQuiz1",
    "RandomFifthSentenceQuiz2",
    "AnswerRightEnding",
)
NO_GOLD_LABEL = "no gold label ('-')"
TARGETS = {"label", "score"}  # the fields an example to predict has not


@dataclass
class Dataset:
    """A task's examples. labels: the label names, a class's id being its index (None for scores
    and multiple choice); skipped: {why: rows left out}; bad_rows: "file: line n: why" of each bad
    row skipped; ids: each example's id, for its prediction."""

    task: str
    kind: str
    examples: list
    labels: list
    skipped: dict
    bad_rows: list
    ids: list

    @property
    def labelled(self):
        """Whether the examples carry their labels (or scores): a file to predict has none."""
        return any(TARGETS & example.keys() for example in self.examples[:1])

    @property
    def layout(self):
        """The fields of its examples, sorted: what the other files of its task must hold."""
        return sorted(self.examples[0]) if self.examples else []

    @property
    def n_classes(self):
        """How many classes a head needs; None for a score (and for multiple choice)."""
        return len(self.labels) if self.labels is not None else None

    @property
    def metrics(self):
        """Names of train.metrics' measures for this task."""
        if TASKS[self.task].metrics:
            return TASKS[self.task].metrics
        scores = self.kind == "similarity" and self.labels is None
        return ("pearson", "spearman") if scores else ("accuracy",)

    @property
    def main_metric(self):
        """The metric that picks the best epoch of a fine-tune on this dataset."""
        return TASKS[self.task].main or self.metrics[0]


class BadRow(Exception):
    """A row that breaks the file's layout: an error, or counted when skipping bad rows."""


class SkipRow(Exception):
    """A row the dataset marks as unusable: always left out and counted."""


def read(task, path, labels=None, skip_bad_rows=False, encoding="utf-8", errors="strict", layout=None):
    """The examples of one file of `task` -> Dataset. labels: label names in id order, to read a
    dev set with its train set's ids (by default the task's documented ones, or for jsonl the
    file's own, sorted). encoding, errors: how the file is decoded, as bytes.decode takes them.
    layout: the training examples' fields, which every row must have (see the top of this file)."""
    if task not in TASKS:
        raise ValueError(unknown(task))
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path}: a folder, not a file of {task} examples")
    reading, files, kind = _Reading(path, skip_bad_rows), TASKS[task].files, TASKS[task].kind
    if isinstance(files, Tsv):
        rows = reading.keep(_tsv_rows(path, encoding, errors, files))
    else:
        rows = reading.keep(READERS[files](path, encoding, errors))
    if layout is not None:
        rows = reading.keep(_converted(rows, lambda example: _fits(example, layout)))
    if kind is None:  # each file's own (jsonl): the kind of its first row kept
        if not rows:
            raise ValueError(f"{path}: no examples")
        kind = kind_of(rows[0][1])
    if rows:  # all rows labelled or none, and of one layout (a JSON line may have any fields)
        first = rows[0][1]
        rows = reading.keep(_converted(rows, lambda example: _same_layout(example, first)))

    first, known = rows[0][1] if rows else {}, labels if labels is not None else TASKS[task].labels
    if "label" in first and kind != "multiple_choice":
        labels = list(known or sorted({e["label"] for _, e in rows}))
        class_ids = {label: i for i, label in enumerate(labels)}
        rows = reading.keep(_converted(rows, lambda example: _with_label_id(example, class_ids)))
    else:  # scores, answers, or none: examples to predict keep the label names they are predicted with
        labels = None if TARGETS & first.keys() or known is None else list(known)
    ids = [example.pop("index", place) for place, (_, example) in enumerate(rows)]
    examples = [example for _, example in rows]
    return Dataset(task, kind, examples, labels, dict(reading.skipped), reading.bad_rows, ids)


def save_labels(labels, path):
    """Write the label names, in id order, as a JSON list."""
    Path(path).write_text(json.dumps(list(labels), indent=1) + "\n", encoding="utf-8")


def load_labels(path):
    """The label names saved by save_labels: distinct strings, or distinct integers."""
    labels = read_json(path)
    if (
        not isinstance(labels, list)
        or len({type(label) for label in labels}) > 1
        or not all(type(label) in (str, int) for label in labels)
        or len(set(labels)) != len(labels)
    ):
        expected = "a JSON list of distinct label names (all strings or all integers)"
        raise ValueError(f"{path}: expected {expected}")
    return labels


# ----- bad rows ----------------------------------------------------------------------------
class _Reading:
    """One file being read: refused rows raise a ValueError naming the file and line, or are
    counted in `skipped` (and described in `bad_rows`)."""

    def __init__(self, path, skip_bad_rows):
        self.path, self.skip_bad_rows = path, skip_bad_rows
        self.skipped, self.bad_rows = Counter(), []

    def keep(self, rows):
        """The (line, example) among (line, example or refusal), the refusals dealt with."""
        kept = []
        for line, item in rows:
            if isinstance(item, SkipRow):
                self.skipped[str(item)] += 1
            elif isinstance(item, BadRow):
                message = f"{self.path}: line {line}: {item}"
                if not self.skip_bad_rows:
                    raise ValueError(message + " (skip_bad_rows=True leaves such rows out)")
                self.skipped["bad rows"] += 1
                self.bad_rows.append(message)
            else:
                kept.append((line, item))
        return kept


def _converted(rows, convert):
    """(line, convert(row)) for each (line, row), or (line, the BadRow or SkipRow it raised)."""
    for line, row in rows:
        try:
            yield line, convert(row)
        except (BadRow, SkipRow) as refusal:
            yield line, refusal


def _with_label_id(example, ids):
    if example["label"] not in ids:
        raise BadRow(f"unknown label {example['label']!r}; the labels are {list(ids)}")
    return {**example, "label": ids[example["label"]]}


# ----- GLUE's TSVs ---------------------------------------------------------------------------
def _tsv_rows(path, encoding, errors, layout):
    """(line, example or refusal) for each row of a TSV file. Quoting is off (an RTE cell opens
    with a bare quote) and a BOM is dropped (MRPC has one)."""
    rows = _csv_rows(path, encoding, errors, delimiter="\t", quoting=csv.QUOTE_NONE)
    first = next(rows, None)
    header = first[1] if first else []
    if layout.width and header[:1] != ["index"]:  # a file without a header (CoLA's test file has one)
        rows, width, positions = itertools.chain([first] if first else [], rows), layout.width, layout.columns
    else:
        width, positions = len(header), _positions(path, header, layout.test_columns or layout.columns)
    yield from _converted(rows, lambda cells: _tsv_example(cells, width, positions))


def _positions(path, header, columns):
    """{field: its column's position} in a header, with the `index` column where there is one. A
    header without the label's (or score's) column is that of a file to predict."""
    missing = [name for field, name in columns.items() if name not in header and field not in TARGETS]
    if missing:
        raise ValueError(f"{path}: line 1: the header has no column {', '.join(map(repr, missing))}")
    columns = {**columns, "index": "index"}
    return {field: header.index(name) for field, name in columns.items() if name in header}


def _tsv_example(cells, width, positions):
    if len(cells) != width:
        raise BadRow(f"expected {width} tab-separated columns, got {len(cells)}")
    example = {field: cells[i].strip() for field, i in positions.items()}
    if "score" in example:
        example["score"] = _finite(example["score"])
    return example


def _finite(score):
    """The score (a number, or a TSV cell's text) as a float, if it is one that training can use (not
    nan, inf, or out of range)."""
    try:
        score = float(score)
    except OverflowError:  # an integer past float's range
        score = math.inf
    except ValueError:  # text that is not a number
        raise BadRow(f"the score {score!r} is not a number") from None
    if not math.isfinite(score):
        raise BadRow(f"the score {score!r} is not a finite number")
    return score


# ----- the Story Cloze CSV -------------------------------------------------------------------
def _story_rows(path, encoding, errors):
    """(line, example or refusal) for each story: the four sentences joined are the context,
    the two endings the choices, and AnswerRightEnding (1 or 2) picks one."""
    rows = _csv_rows(path, encoding, errors)
    _, header = next(rows, (1, []))
    if tuple(name.strip() for name in header) != STORY_COLUMNS:
        raise ValueError(f"{path}: line 1: expected the header {','.join(STORY_COLUMNS)}")
    yield from _converted(rows, _story_example)


def _story_example(cells):
    if len(cells) != len(STORY_COLUMNS):
        raise BadRow(f"expected {len(STORY_COLUMNS)} comma-separated columns, got {len(cells)}")
    cells = [cell.strip() for cell in cells]
    if cells[7] not in ("1", "2"):
        raise BadRow(f"unknown label {cells[7]!r}; AnswerRightEnding is 1 or 2")
    return {"context": " ".join(cells[1:5]), "choices": cells[5:7], "label": int(cells[7]) - 1}


# ----- reading text ---------------------------------------------------------------------------
def _text_lines(path, encoding, errors):
    """The lines of a text file (a BOM dropped), ends kept, cut at \\n, \\r\\n or \\r as
    open(newline="") cuts them for the csv module; a file that does not decode is an
    UndecodableFiles naming its line."""
    try:
        return io.StringIO(read_text(path, encoding, errors), newline="")
    except ValueError as error:
        raise UndecodableFiles([str(error)]) from None


def _csv_rows(path, encoding, errors, **dialect):
    """An iterator of (line, cells) for each row of a CSV (or, with the dialect's arguments, TSV) file,
    whose fields may be of any length: the csv module's limit (131,072 characters) guards memory
    against a stream, and the file is in memory already. What the module cannot read is a ValueError
    naming the line."""
    reader, limit = csv.reader(_text_lines(path, encoding, errors), **dialect), csv.field_size_limit()
    try:
        csv.field_size_limit(2**31 - 1)  # a C long's largest on every platform
        return iter([(reader.line_num, cells) for cells in reader])
    except csv.Error as error:
        raise ValueError(f"{path}: line {reader.line_num}: {error}") from None
    finally:
        csv.field_size_limit(limit)


def _lines(path, encoding, errors):
    """(line, text) for each line that is not blank."""
    lines = enumerate(_text_lines(path, encoding, errors), start=1)
    return ((number, text) for number, text in lines if text.strip())


# ----- JSON lines: SNLI and your own data ------------------------------------------------------
def _json_lines(convert):
    """A reader of JSON lines, each line turned into an example by `convert`."""
    return lambda path, encoding, errors: _converted(_lines(path, encoding, errors), convert)


def _json_object(text):
    try:
        row = json.loads(text)
    except json.JSONDecodeError as error:
        raise BadRow(f"not valid JSON ({error.msg})") from None
    except (ValueError, RecursionError) as error:  # an integer of over 4300 digits; nesting too deep
        raise BadRow(f"not readable JSON ({error})") from None
    if not isinstance(row, dict):
        raise BadRow("expected a JSON object")
    return row


def _pick(row, fields):
    """{field: row[field]} for the fields, all of which the row must have."""
    missing = [field for field in fields if field not in row]
    if missing:
        raise BadRow(f"no field {', '.join(map(repr, missing))}")
    return {field: row[field] for field in fields}


def _snli_example(text):
    line = _json_object(text)
    row = _pick(line, ("sentence1", "sentence2", "gold_label")[: 3 if "gold_label" in line else 2])
    if not all(isinstance(value, str) for value in row.values()):
        raise BadRow("sentence1, sentence2 and gold_label must be strings")
    if row.get("gold_label") == "-":
        raise SkipRow(NO_GOLD_LABEL)
    label = {"label": row["gold_label"]} if "gold_label" in row else {}
    return {"premise": row["sentence1"], "hypothesis": row["sentence2"], **label, **_row_id(line)}


def _jsonl_example(text):
    """One row of your own data: the fields of one task kind, of the right types, and its label
    unless it is a row to predict."""
    row = _json_object(text)
    kind = kind_of(row)
    if kind is None:
        layouts = "; ".join(" + ".join(fields) for fields in KINDS.values())
        raise BadRow(f"fields {sorted(row)} match no task (expected {layouts}, and a label)")
    target = "score" if kind == "similarity" and "score" in row else "label"
    labelled = target in row
    example = _pick(row, (*KINDS[kind], target) if labelled else KINDS[kind])
    value = example.get(target)
    if kind == "multiple_choice":
        choices = example["choices"]
        if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
            raise BadRow("choices must be a non-empty list of strings")
        if labelled and (type(value) is not int or not 0 <= value < len(choices)):
            raise BadRow(f"the label {value!r} is not the index of one of the {len(choices)} choices")
    if not all(isinstance(example[field], str) for field in KINDS[kind] if field != "choices"):
        raise BadRow(f"{' and '.join(KINDS[kind])} must be strings")
    if target == "score" and type(value) not in (int, float):
        raise BadRow(f"the score {value!r} is not a number")
    if target == "score":
        example["score"] = _finite(value)
    if labelled and target == "label" and type(value) not in (str, int):
        raise BadRow(f"the label {value!r} must be a string or an integer")
    return {**example, **_row_id(row)}


def _row_id(row):
    """{"index": the row's "id" or "idx"}, or {} where it has neither."""
    name = next((name for name in ("id", "idx") if name in row), None)
    if name is not None and type(row[name]) not in (str, int):
        raise BadRow(f"the {name} {row[name]!r} must be a string or an integer")
    return {} if name is None else {"index": row[name]}


def _fits(example, layout):
    """The example, if its fields are the training examples' `layout`, or all of them but the label
    or score (a row to predict)."""
    fields = sorted(example.keys() - {"index"})
    if fields not in (layout, [field for field in layout if field not in TARGETS]):
        raise BadRow(f"fields {', '.join(fields)}, not the training examples' {', '.join(layout)}")
    return example


def _same_layout(example, first):
    """The example, if its fields (and number of choices) are those of the file's first row."""

    def layout(e):
        choices = f" with {len(e['choices'])} choices" if "choices" in e else ""
        return ", ".join(sorted(e.keys() - {"index"})) + choices

    if layout(example) != layout(first):
        raise BadRow(f"fields {layout(example)} differ from the first row's {layout(first)}")
    label, first_label = example.get("label"), first.get("label")
    if type(label) is not type(first_label):
        kind = {str: "a string", int: "an integer"}
        raise BadRow(
            f"the label {label!r} is {kind[type(label)]}, the first row's {first_label!r} "
            f"{kind[type(first_label)]}: a file's labels are all strings or all integers"
        )
    return example


# the readers of the files a Task names (train/tasks.py): (path, encoding, errors) -> (line, example or
# refusal) for each row
READERS = {
    "snli": _json_lines(_snli_example),
    "story_cloze": _story_rows,
    "jsonl": _json_lines(_jsonl_example),
}
