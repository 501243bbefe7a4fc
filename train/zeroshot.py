"""python -m train.evaluate zeroshot: the paper's zero-shot heuristics (section 5, Figure 2 right).

A language model that was never fine-tuned answers a task through its next-token probabilities:

    sst2         the text + " very"; positive when the model finds " positive" likelier than
                 " negative" to come next (each word's probability is that of all its tokens)
    cola         the mean log-probability of the sentence's tokens, each given those before it;
                 acceptable above a threshold (--threshold, or the one that fits the data best)
    rocstories   (and jsonl files of multiple choice) the answer whose tokens have the highest
                 mean log-probability given the context

The text goes in as it is, `_start_` or `_classify_` in it as plain text: no special token, which
the language model never saw.
"""

import numpy as np
from tqdm import tqdm

from autograd import functional as F
from autograd.functional import IGNORE_INDEX
from autograd.tensor import no_grad
from tinygpt.transformations import text_encoder

from . import cli, metrics
from .cli import add_figure_arguments, check_json_folder, open_run, positive_int, write_results
from .data import next_token_batch
from .tasks import TASKS


@no_grad()
def continuation_log_probs(model, pairs, batch_size=16):
    """(summed log-probability, number of tokens) of each continuation given its context, for
    pairs of (context ids, continuation ids). A pair longer than n_ctx + 1 tokens loses tokens of
    its context from the left first; a continuation's first token needs one token before it. A
    progress bar goes to stderr where it is a terminal."""
    n_ctx = model.config.n_ctx
    totals, counts = np.zeros(len(pairs)), np.zeros(len(pairs), dtype=np.int64)
    with tqdm(total=len(pairs), unit="sequence", disable=None) as progress:
        for start in range(0, len(pairs), batch_size):
            rows = []  # (ids, how many of the last ones are scored)
            for context, continuation in pairs[start : start + batch_size]:
                ids = (context + continuation)[-(n_ctx + 1) :]
                rows.append((ids, max(min(len(continuation), len(ids) - 1), 0)))
            inputs, targets = next_token_batch(rows)
            nll = F.cross_entropy(model(inputs), targets, ignore_index=IGNORE_INDEX, reduction="none")
            totals[start : start + len(rows)] = -nll.numpy().sum(axis=-1)
            counts[start : start + len(rows)] = [n for _, n in rows]
            progress.update(len(rows))
    return totals, counts


def sst2_predictions(model, encode, examples, batch_size):
    """1 (positive) where P(" positive" | text + " very") > P(" negative" | the same), else 0;
    `encode` turns text into token ids."""
    words = [encode(" positive"), encode(" negative")]
    contexts = [encode(example["text"] + " very") for example in examples]
    pairs = [(context, word) for word in words for context in contexts]  # one pass, one progress bar
    positive, negative = continuation_log_probs(model, pairs, batch_size)[0].reshape(2, len(contexts))
    return (positive > negative).astype(np.int64)


def mean_log_probs(model, encode, examples, batch_size):
    """Each sentence's mean token log-probability, its first token given (0 for a one-token text)."""
    ids = [encode(example["text"]) for example in examples]
    totals, counts = continuation_log_probs(model, [(i[:1], i[1:]) for i in ids], batch_size)
    return totals / np.maximum(counts, 1)


def best_threshold(scores, labels):
    """The threshold (midway between two scores) above which predicting 1 gives the highest MCC."""
    values = np.unique(scores)
    candidates = np.concatenate([[values[0] - 1], (values[:-1] + values[1:]) / 2])
    mcc = [metrics.matthews_corrcoef((scores > t).astype(np.int64), labels) for t in candidates]
    return float(candidates[int(np.argmax(mcc))])


def choice_predictions(model, encode, examples, batch_size):
    """The index of the answer with the highest mean token log-probability given the context."""
    pairs = [
        (encode(example["context"]), encode(" " + choice))
        for example in examples
        for choice in example["choices"]
    ]
    totals, counts = continuation_log_probs(model, pairs, batch_size)
    means = (totals / np.maximum(counts, 1)).reshape(len(examples), -1)
    return means.argmax(axis=1)


def zeroshot_arguments(parser):
    parser.add_argument(
        "--task",
        required=True,
        choices=[name for name, task in TASKS.items() if task.zeroshot],
        help="the heuristic, and the layout of --data",
    )
    parser.add_argument("--data", required=True, metavar="FILE", help="labelled examples (a dev set)")
    cli.add_text_arguments(parser)
    parser.add_argument("--skip-bad-rows", action="store_true", help="count and leave out malformed rows")
    parser.add_argument(
        "--threshold",
        type=cli.finite_float,
        help="cola: the mean log-probability above which a sentence is acceptable "
        "(default: the best for --data)",
    )
    first = "only the first N examples (default: all)"
    parser.add_argument("--limit", type=positive_int, metavar="N", help=first)
    add_figure_arguments(parser, batch_size=16, batched="sequences")


@cli.subcommand(
    "zeroshot",
    zeroshot_arguments,
    help="the paper's zero-shot heuristics on a labelled file",
    description=__doc__.split("\n\n", 1)[1],  # this module's, laid out as it is
    formatter_class=cli.RawDescriptionHelp,
)
def zeroshot_command(parser, args):
    rule = TASKS[args.task].zeroshot
    if args.threshold is not None and rule != "acceptability_threshold":
        thresholded = [name for name, task in TASKS.items() if task.zeroshot == "acceptability_threshold"]
        parser.error(f"--threshold is for --task {' or '.join(thresholded)}")
    check_json_folder(parser, args)
    dataset = cli.read_task_file(parser, "--data", args.task, args.data, args)
    if rule == "likeliest_answer" and dataset.kind != "multiple_choice":
        parser.error(
            f"--data: {args.data} holds {dataset.kind} examples; zero-shot on {args.task} is for multiple "
            f'choice ({{"context", "choices", "label"}})'
        )
    if not dataset.labelled:
        parser.error(f"--data: {args.data} has no labels to measure the heuristic against")
    examples = dataset.examples[: args.limit]
    model, tokenizer = open_run(parser, args.run, args.device)
    encode = text_encoder(tokenizer, special_tokens_as_text=True)
    labels = np.array([example["label"] for example in examples])
    results = {"task": args.task, "examples": len(examples)}
    if rule == "positive_or_negative":  # the heuristics, by Task.zeroshot
        predictions = sst2_predictions(model, encode, examples, args.batch_size)
        how = 'P(" positive") against P(" negative") after the text + " very"'
    elif rule == "acceptability_threshold":
        scores = mean_log_probs(model, encode, examples, args.batch_size)
        chosen = args.threshold is None
        results["threshold"] = best_threshold(scores, labels) if chosen else args.threshold
        predictions = (scores > results["threshold"]).astype(np.int64)
        how = f"mean token log-probability above {results['threshold']:.4f}" + (
            " (the threshold that fits this data best: an optimistic figure)" if chosen else ""
        )
    else:
        predictions = choice_predictions(model, encode, examples, args.batch_size)
        how = "the answer with the highest mean token log-probability given the context"
    results.update(metrics.compute(dataset.metrics, predictions, labels))
    print(f"zero-shot {args.task} on {len(examples)} examples of {args.data}: {how}")
    for name in dataset.metrics:
        print(f"{name:10} {results[name]:.4f}")
    write_results(parser, args, results)
    return results


if __name__ == "__main__":  # here, not above: train.evaluate imports this module
    from train.evaluate import run_alone

    run_alone("zeroshot")
