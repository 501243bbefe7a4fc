"""The fine-tuning tasks, one Task record each: what every command that takes --task reads
(python -m train.finetune, and python -m train.evaluate predict and zeroshot).

A task's files are read by train/task_files.py: GLUE's TSVs through their layout (a Tsv), the
others by the reader their record names there (task_files.READERS). Adding a task is one entry in
TASKS, and a reader in task_files.READERS where none of those reads its files.
"""

from dataclasses import dataclass
from typing import NamedTuple


class Tsv(NamedTuple):
    """A TSV layout: {example field: column name in the header}, and for a file without a header
    its width (columns are then positions) and the columns of its test file, which has a header."""

    columns: dict
    width: int = None
    test_columns: dict = None


@dataclass(frozen=True)
class Task:
    """What tinygpt knows of one fine-tuning task."""

    name: str
    files: object  # the layout of its files, a Tsv, or the name of their reader in task_files.READERS
    # its input transformation (tinygpt.transformations.KINDS); None: each file's own (jsonl)
    kind: str = None
    # the label names in id order; None for scores and multiple choice, or a file's own (jsonl)
    labels: tuple = None
    # train.metrics' measures it is reported with; None: accuracy, or pearson and spearman for scores
    metrics: tuple = ("accuracy",)
    main: str = None  # the metric that picks a fine-tune's best epoch (default: the first of metrics)
    # the names (.tsv) of its GLUE submission files: for its test file, and where there are two, for a
    # test file whose name says "mismatched" (MNLI's)
    submission: tuple = ()
    zeroshot: str = None  # its heuristic in train/zeroshot.py, or None
    first_answer: int = 0  # the number its files give the first answer of a multiple choice


def unknown(name):
    """Why the task `name` (a run's) is not known: TASKS holds a launcher's own task only under it."""
    return (
        f"the task {name!r:.40} is not one of {', '.join(TASKS)}: a task that a launcher adds to "
        f"train.tasks.TASKS is known where the command runs through that launcher (docs/fine-tuning.md)"
    )


BINARY = ("0", "1")
ENTAILMENT = ("entailment", "not_entailment")
NLI = ("contradiction", "entailment", "neutral")
PAIR = {"premise": "sentence1", "hypothesis": "sentence2"}
TASKS = {
    task.name: task
    for task in (
        Task("sst2", Tsv({"text": "sentence", "label": "label"}), "classification", BINARY,
             submission=("SST-2",), zeroshot="positive_or_negative"),
        # CoLA's train and dev files: source, label, original label, sentence; test.tsv: index, sentence
        Task("cola", Tsv({"text": 3, "label": 1}, width=4, test_columns={"text": "sentence"}),
             "classification", BINARY, ("mcc",), submission=("CoLA",), zeroshot="acceptability_threshold"),
        Task("rte", Tsv({**PAIR, "label": "label"}), "entailment", ENTAILMENT, submission=("RTE",)),
        Task("qnli", Tsv({"premise": "question", "hypothesis": "sentence", "label": "label"}), "entailment",
             ENTAILMENT, submission=("QNLI",)),
        Task("mnli", Tsv({**PAIR, "label": "gold_label"}), "entailment", NLI,
             submission=("MNLI-m", "MNLI-mm")),
        Task("stsb", Tsv({"text_a": "sentence1", "text_b": "sentence2", "score": "score"}), "similarity",
             metrics=("pearson", "spearman"), submission=("STS-B",)),
        # the paper reports MRPC's F1
        Task("mrpc", Tsv({"text_a": "#1 String", "text_b": "#2 String", "label": "Quality"}), "similarity",
             BINARY, ("accuracy", "f1"), main="f1", submission=("MRPC",)),
        Task("snli", "snli", "entailment", NLI),
        # AnswerRightEnding numbers the endings from 1
        Task("rocstories", "story_cloze", "multiple_choice", zeroshot="likeliest_answer", first_answer=1),
        Task("jsonl", "jsonl", metrics=None, zeroshot="likeliest_answer"),
    )
}  # fmt: skip
