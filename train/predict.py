"""A task head on a dataset: its predictions, the task's metrics, and the files of predictions; and
`python -m train.evaluate predict`, a fine-tune's predictions on a file with or without labels."""

import json
import os

import numpy as np

import autograd as ag
from autograd import backend
from tinygpt import GPT
from tinygpt.files import write_whole
from tinygpt.heads import make_head
from tinygpt.tokenizer import load_tokenizer
from tinygpt.transformations import encode_examples
from tinygpt.weights import WEIGHTS_FILE

from . import cli, metrics, tasks
from .checkpoint import read_weights
from .cli import add_device_argument, check_tokenizer_fits, positive_int
from .run_folder import read_config, run_folder_of
from .task_files import load_labels
from .tasks import TASKS


@ag.no_grad()
def predict(head, data, batch_size):
    """(predictions in the order of the examples, their logits (N, outputs) on the host, the mean
    task loss or None for examples without labels) of a head on a TaskData, with dropout off; the
    head is left in the mode it was in."""
    was_training = head.training
    head.eval()
    predictions, outputs, total = [], [], 0.0
    for batch in data.batches(batch_size):
        logits, _ = head(batch.ids, batch.clf_positions, lm=False)
        predictions.append(head.predict(logits))
        outputs.append(logits.numpy())
        if batch.labels is not None:
            total += float(head.task_loss(logits, batch.labels).item()) * len(batch.labels)
    head.train(was_training)
    loss = total / len(data) if data.labels is not None else None
    return np.concatenate(predictions), np.concatenate(outputs), loss


def evaluate(head, data, metric_names, batch_size):
    """(predictions, {"loss": mean task loss, metric: value, ...}) of a head on a TaskData; the
    figures are None for examples without labels."""
    predictions, _, loss = predict(head, data, batch_size)
    if data.labels is None:
        return predictions, None
    return predictions, {"loss": loss, **metrics.compute(metric_names, predictions, data.labels)}


def answers(predictions, dataset):
    """The predictions as the dataset writes its labels: label names, scores (floats), or the chosen
    answers, numbered as the task's files number them (Task.first_answer: rocstories' from 1, as its
    AnswerRightEnding column; jsonl's from 0, an index into choices)."""
    if dataset.labels is not None:
        return [dataset.labels[int(value)] for value in predictions]
    if dataset.kind == "multiple_choice":
        return [int(value) + TASKS[dataset.task].first_answer for value in predictions]
    return [float(value) for value in predictions]


def write_predictions(path, predictions, dataset, logits=None, layout="glue"):
    """Write each example's id (dataset.ids) and prediction. layout "glue": a GLUE submission, the
    TSV `index<TAB>prediction` under that header, a score with 3 decimals; "jsonl": one
    {"index", "prediction"} a line, with {label: probability} where `logits` of classes are given."""
    rows = [{"index": i, "prediction": value} for i, value in zip(dataset.ids, answers(predictions, dataset))]
    if logits is not None and dataset.labels is not None:
        shifted = np.exp(logits - logits.max(axis=-1, keepdims=True), dtype=np.float64)
        for row, probabilities in zip(rows, shifted / shifted.sum(axis=-1, keepdims=True)):
            row["probabilities"] = dict(zip(map(str, dataset.labels), probabilities.round(6).tolist()))
    if layout == "jsonl":
        lines = [json.dumps(row) for row in rows]
    else:
        lines = ["index\tprediction"]
        for row in rows:
            value = row["prediction"]
            lines.append(f"{row['index']}\t{f'{value:.3f}' if isinstance(value, float) else value}")
    write_whole(path, "".join(line + "\n" for line in lines).encode())


# ----- python -m train.evaluate predict ----------------------------------------------------------
def fine_tune_of(parser, run):
    """(run folder, weights folder, GPTConfig, settings, label names or None) of --run: a fine-tune's
    folder (its best/ weights) or one weights folder in it (a checkpoint, best/); anything else is a
    usage error."""
    run_dir = run_folder_of(run)
    weights = run if os.path.isfile(os.path.join(run, WEIGHTS_FILE)) else os.path.join(run, "best")
    with cli.reading(parser, "--run"):
        if not os.path.isdir(run):
            raise FileNotFoundError(f"{run}: no such run or checkpoint folder")
        config, settings = read_config(run_dir)
        if not isinstance(settings, dict) or "has_labels" not in settings:
            raise ValueError(f"{run_dir} is not a fine-tuning run (its config.json has no task)")
        if not isinstance(settings.get("task"), str) or settings["task"] not in TASKS:
            raise ValueError(f"{run_dir}/config.json: {tasks.unknown(settings.get('task'))}")
        if not os.path.isdir(weights):
            raise ValueError(f"{run} has no best/ weights (a fine-tune writes them after its first epoch)")
        layout = settings.get("layout", [])  # none in a run of an older tinygpt
        if not isinstance(layout, list) or not all(isinstance(field, str) for field in layout):
            raise ValueError(f"{run_dir}/config.json: the layout {layout!r:.40} is not a list of fields")
        labels = load_labels(os.path.join(run_dir, "labels.json")) if settings["has_labels"] else None
    return run_dir, weights, config, settings, labels


def load_head(parser, args, weights, config, dataset):
    """(the task head with the weights of the folder `weights`, on --device and in eval mode, the
    run's tokenizer)."""
    device = backend.parse_device(args.device)  # checked by the argument's type
    backend.use_device(device)
    try:
        head = make_head(dataset.kind, GPT(config), dataset.n_classes)
        head.load_state_dict(read_weights(weights, head))
        tokenizer = load_tokenizer(os.path.join(run_folder_of(args.run), "tokenizer"))
    except (OSError, ValueError) as error:
        parser.error(f"--run: {error}")
    check_tokenizer_fits(parser, args.run, config.vocab_size, tokenizer)
    return head.to(device).eval(), tokenizer


def output_path(args, task, layout):
    """--out; where it is a folder (by default the run's), the file in it: named as a GLUE
    submission's (MNLI-mm.tsv for a mismatched set), else predictions.tsv or .jsonl."""
    if args.out and not os.path.isdir(args.out):
        return args.out
    name, submission = f"predictions.{'tsv' if layout == 'glue' else 'jsonl'}", TASKS[task].submission
    if layout == "glue" and submission:
        mismatched = len(submission) > 1 and "mismatched" in os.path.basename(args.data)
        name = submission[mismatched] + ".tsv"
    return os.path.join(args.out or run_folder_of(args.run), name)


def predict_arguments(parser):
    parser.add_argument("--task", choices=TASKS, help="the layout of --data (default: the run's task)")
    parser.add_argument("--data", required=True, metavar="FILE", help="the examples to predict")
    cli.add_task_file_arguments(parser)
    parser.add_argument(
        "--out",
        metavar="PATH",
        help="the file to write, or a folder (default: the run's) for SST-2.tsv, MNLI-m.tsv... as "
        "GLUE's submissions name them, or predictions.tsv / predictions.jsonl",
    )
    parser.add_argument(
        "--format",
        choices=("glue", "jsonl"),
        help="glue: index<TAB>prediction under a header; jsonl: {index, prediction, probabilities} "
        "a line (default: glue for GLUE's tasks, else jsonl)",
    )
    parser.add_argument("--batch-size", type=positive_int, default=32, help="examples per forward pass")
    add_device_argument(parser)


@cli.subcommand(
    "predict",
    predict_arguments,
    help="a fine-tune's predictions on a file, with or without labels (GLUE's test files)",
    description="The predictions of a fine-tune's best epoch (or of one checkpoint of it) on a file, "
    "labelled or not, each with its id (see train/task_files.py); for a labelled file, the task's "
    "metrics too.",
)
def predict_command(parser, args):
    run_dir, weights, config, settings, labels = fine_tune_of(parser, args.run)
    task = args.task or settings["task"]
    if task != settings["task"]:
        parser.error(f"--task: {run_dir} is a fine-tune on {settings['task']}, not {task}")
    layout = args.format or ("glue" if TASKS[task].submission else "jsonl")
    out = output_path(args, task, layout)
    cli.check_output_file(parser, "--out", out, args)
    dataset = cli.read_task_file(parser, "--data", task, args.data, args, labels, settings.get("layout"))
    head, tokenizer = load_head(parser, args, weights, config, dataset)
    as_text = args.special_tokens_as_text or settings.get("special_tokens_as_text") is True
    data = encode_examples(dataset.examples, dataset.kind, tokenizer, config.n_ctx, as_text)
    predictions, logits, loss = predict(head, data, args.batch_size)
    with cli.writing(parser, "--out"):
        write_predictions(out, predictions, dataset, logits, layout)
    print(f"{len(predictions)} predictions of {args.data} ({data.n_cut} cut to fit n_ctx) in {out}")
    if data.labels is None:
        return {"predictions": out}
    figures = {"loss": loss, **metrics.compute(dataset.metrics, predictions, data.labels)}
    print(", ".join(f"{name} {value:.4f}" for name, value in figures.items()))
    return {"predictions": out, **figures}


if __name__ == "__main__":  # here, not above: train.evaluate imports this module
    from train.evaluate import run_alone

    run_alone("predict")
