"""python -m train.finetune: the paper's second stage, a pre-trained GPT adapted to a labelled task.

The task's examples go through the input transformations of the paper's Figure 1 (tinygpt.transformations),
a linear head reads the last block's state at _classify_ (tinygpt.heads), and the objective is
L3 = L2 + lm_coef * L1: the task loss plus the language-model loss on the same inputs. The
defaults are the paper's: batch 32, 3 epochs, warmup over 0.2% of training then linear decay,
classifier dropout 0.1, L2 0.01, and for GPT-1's size lr 6.25e-5 (smaller models take larger
rates, see DEFAULT_LR). The dev set is measured after every epoch and the
best epoch's weights are kept for the test predictions.

The run folder: config.json, tokenizer/, labels.json (the label names in id order), checkpoints/,
best/ (the best epoch's weights), metrics.jsonl, results.json, loss.png and, with --test,
predictions.tsv.
"""

import functools
import hashlib
import json
import math
import os
import shutil
import time

import numpy as np

import autograd as ag
from autograd.optim import Adam, warmup_linear
from autograd.precision import use_precision
from autograd.random import MaskStream, use_masks
from tinygpt import GPT, GPTConfig
from tinygpt.heads import make_head
from tinygpt.tokenizer import load_tokenizer
from tinygpt.transformations import encode_examples

from . import cli, lifecycle, task_files
from .checkpoint import fsync, read_weights, retire, save_weights, write_json
from .cli import add_precision_argument, grouped_parser, non_negative_int, positive_int
from .predict import evaluate, write_predictions
from .run_folder import append_metrics, plot_metrics, read_config, read_metrics
from .tasks import TASKS
from .transfer import load_pretrained, prepare

REQUIRED = ("init_from", "task", "train", "dev")  # unless --resume
# The peak rate a preset's model fine-tunes at by default: gpt1's is the paper's; the small ones,
# measured on SST-2's dev set (docs/performance.md, "The learning rate"), stay near chance at the paper's.
DEFAULT_LR = {"gpt1": 6.25e-5, "mini": 2.5e-4, "tiny": 2.5e-4}
NEEDED = " (required, unless --resume)"
DATA_FLAGS = ("train", "dev", "test", "encoding", "errors")  # may change on --resume with --allow-data-change


def parse_args(argv):
    groups = {
        "the task": add_task_arguments,
        "the pre-trained model": add_model_arguments,
        "optimization": add_optimizer_arguments,
        "the run": add_run_arguments,
    }
    parser = grouped_parser("python -m train.finetune", __doc__.split("\n\n")[0], groups)
    args = parser.parse_args(argv)
    if not args.resume and any(getattr(args, name) is None for name in REQUIRED):
        missing = [f"--{name.replace('_', '-')}" for name in REQUIRED if getattr(args, name) is None]
        parser.error(f"{', '.join(missing)} required (or --resume a fine-tune)")
    if args.tokenizer and args.gpt1_tokenizer:
        parser.error("give --tokenizer or --gpt1-tokenizer, not both")
    if args.from_scratch and args.transfer_layers is not None:
        parser.error("--from-scratch re-initialises every layer: it does not go with --transfer-layers")
    if args.out:
        cli.check_writable(parser, "--out", args.out)
    return parser, args


def add_task_arguments(group):
    layout = "the files' layout (jsonl: your own, see train/task_files.py)"
    group.add_argument("--task", choices=TASKS, help=f"{layout}{NEEDED}")
    group.add_argument("--train", metavar="FILE", help=f"training examples{NEEDED}")
    group.add_argument("--dev", metavar="FILE", help=f"examples measured after every epoch{NEEDED}")
    group.add_argument(
        "--test",
        metavar="FILE",
        help="labelled examples to predict with the best epoch's weights (default: none)",
    )
    cli.add_task_file_arguments(group)
    limit = "train on N examples drawn by --seed (default: all)"
    group.add_argument("--limit-train", type=positive_int, metavar="N", help=limit)


def add_model_arguments(group):
    openai_gpt = "an openai-gpt folder (config.json + model.safetensors)"
    start = f"a pretraining run, one checkpoint in it, or {openai_gpt}{NEEDED}"
    group.add_argument("--init-from", metavar="PATH", help=start)
    for_openai_gpt = "for an openai-gpt --init-from (default: none, for a run brings its own)"
    group.add_argument("--tokenizer", metavar="DIR", help=f"a BPE tokenizer folder, {for_openai_gpt}")
    gpt1_files = "GPT-1's encoder_bpe_40000.json + vocab_40000.bpe"
    group.add_argument("--gpt1-tokenizer", metavar="DIR", help=f"{gpt1_files}, {for_openai_gpt}")
    scratch = "re-initialise every weight (no pre-training)"
    group.add_argument("--from-scratch", action="store_true", help=scratch)
    keep = "keep the embeddings and the first K blocks, re-initialise the rest (default: all)"
    group.add_argument("--transfer-layers", type=non_negative_int, metavar="K", help=keep)
    dropout = "dropout on the state the head reads"
    group.add_argument("--clf-dropout", type=cli.fraction, default=0.1, help=dropout)


def add_optimizer_arguments(group):
    group.add_argument("--epochs", type=positive_int, default=3, help="passes over the training examples")
    group.add_argument("--batch-size", type=positive_int, default=32, help="examples per optimizer step")
    by_size = ", ".join(f"{name} {lr:g}" for name, lr in DEFAULT_LR.items())
    lr = f"peak learning rate (default: the preset's nearest the model in width: {by_size}; see DEFAULT_LR)"
    group.add_argument("--lr", type=cli.positive_float, help=lr)
    rise = "share of the steps over which the rate rises"
    group.add_argument("--warmup-ratio", type=cli.fraction, default=0.002, help=rise)
    aux = "lambda, the auxiliary LM loss's weight (0: none)"
    group.add_argument("--lm-coef", type=cli.non_negative_float, default=0.5, help=aux)
    l2 = "GPT-1's decoupled L2 on matrices"
    group.add_argument("--l2", type=cli.non_negative_float, default=0.01, help=l2)
    clip = "global gradient-norm limit; 0 turns it off"
    group.add_argument("--grad-clip", type=cli.non_negative_float, default=1.0, help=clip)
    add_precision_argument(group)


def add_run_arguments(group):
    seed = "fixes the head, new weights, data order, dropout"
    group.add_argument("--seed", type=cli.seed, default=0, help=seed)
    cli.add_device_argument(group)
    group.add_argument("--log-every", type=positive_int, default=10, help="steps between log lines")
    group.add_argument("--out", metavar="DIR", help="run folder (default: runs/<task>-<date>-<time>)")
    resume = "continue a fine-tune (its folder, or a checkpoint in it) with its own settings: only "
    resume += "--device, --log-every, --save-every, --keep-checkpoints may differ (default: a new run)"
    group.add_argument("--resume", metavar="PATH", help=resume)
    group.add_argument("--overwrite", action="store_true", help="replace the run in a non-empty --out")
    changed = "--resume on data that changed since the run began"
    group.add_argument("--allow-data-change", action="store_true", help=changed)
    save_every = "steps between checkpoints besides those at each epoch's end (0: only those)"
    group.add_argument("--save-every", type=non_negative_int, default=500, help=save_every)
    group.add_argument("--keep-checkpoints", type=positive_int, default=2, help="the newest checkpoints kept")
    group.add_argument("--distributed", action="store_true", help="a rank of an mpirun job (see the README)")


def read_datasets(parser, args, labels=None):
    """{split: train.task_files.Dataset} for train, dev and (if given) test; dev and test read with the
    train set's label map (or `labels`, those a resumed run saved). A bad file is a usage error."""
    datasets = {}
    for split in ("train", "dev", "test"):
        path = getattr(args, split)
        if path is None:
            continue
        layout = datasets["train"].layout if datasets else None  # the train set's, for dev and test
        with cli.reading(parser, f"--{split}"):
            datasets[split] = task_files.read(
                args.task, path, labels, args.skip_bad_rows, args.encoding, args.errors, layout
            )
        if not datasets[split].examples:
            parser.error(f"--{split}: {path} holds no usable examples")
        if split != "test" and not datasets[split].labelled:
            parser.error(f"--{split}: {path} has no labels (only --test may go without)")
        bad_rows = datasets[split].bad_rows
        for message in bad_rows[:3]:
            print(f"skipped {message}")
        if len(bad_rows) > 3:
            print(f"skipped {len(bad_rows) - 3} more bad rows of {path}")
        labels = datasets["train"].labels  # dev and test take the train set's label ids
    if args.limit_train and args.limit_train < len(datasets["train"].examples):
        examples = datasets["train"].examples
        keep = np.sort(np.random.default_rng(args.seed).permutation(len(examples))[: args.limit_train])
        datasets["train"].examples = [examples[i] for i in keep]
    return datasets


@functools.lru_cache(maxsize=1)  # drawn once an epoch, not every step
def epoch_order(seed, epoch, n):
    """The order of the training examples in one epoch: a function of (seed, epoch) alone, so a
    resumed run draws the same batches."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def saved_labels(parser, args, run_dir):
    """The label names a resumed fine-tune saved in labels.json (None for a task without labels)."""
    if not hasattr(args, "has_labels"):
        parser.error(f"--resume: {run_dir} is not a fine-tuning run (its config.json has no has_labels)")
    try:
        return task_files.load_labels(os.path.join(run_dir, "labels.json")) if args.has_labels else None
    except (OSError, ValueError) as error:
        parser.error(f"--resume: {error}")


def start_model(parser, args, run_dir, dataset):
    """(task head, tokenizer, a line on where the weights came from): from --init-from for a new
    run, else the run's own config and tokenizer (the weights then come from its checkpoint)."""
    try:
        if args.resume:
            transformer, note = GPT(read_config(run_dir)[0]), "resumed"
            tokenizer = load_tokenizer(os.path.join(run_dir, "tokenizer"))
        else:
            weights = lifecycle.starting_weights(parser, args.init_from)
            transformer, tokenizer = load_pretrained(weights, args.tokenizer, args.gpt1_tokenizer)
            note = prepare(transformer, tokenizer, args.seed, args.from_scratch, args.transfer_layers)
    except (OSError, ValueError) as error:
        parser.error(f"{'--resume' if args.resume else '--init-from'}: {error}")
    ag.manual_seed(args.seed)
    head = make_head(dataset.kind, transformer, dataset.n_classes, args.clf_dropout)
    return head, tokenizer, note


def build_task(parser, args, run_dir, labels, device, group):
    """(datasets, encoded examples, task head, tokenizer): every split read and put through the
    paper's input transformations, and the head around the GPT on `device`, the same on every rank."""
    datasets = read_datasets(parser, args, labels)
    head, tokenizer, note = start_model(parser, args, run_dir, datasets["train"])
    n_ctx = head.transformer.config.n_ctx
    as_text = args.special_tokens_as_text
    encoded = {s: encode_examples(d.examples, d.kind, tokenizer, n_ctx, as_text) for s, d in datasets.items()}
    train, dev = encoded["train"], encoded["dev"]
    examples = [train.sequences, train.labels.tolist(), dev.sequences, dev.labels.tolist()]
    data_hash = hashlib.sha256(json.dumps(examples).encode()).hexdigest()
    group.check_same("training and dev examples", data_hash.encode())
    lifecycle.check_data(parser, args, data_hash)
    head.to(device).train()
    group.broadcast_parameters(head.parameters())
    cut = ", ".join(f"{split} {data.n_cut}" for split, data in encoded.items())
    print(
        f"{args.task}: {len(train)} training, {len(encoded['dev'])} dev examples (cut to fit n_ctx={n_ctx}: "
        f"{cut}); {note}"
    )
    return datasets, encoded, head, tokenizer, data_hash


def default_lr(config):
    """DEFAULT_LR of the preset whose width is nearest the model's (on a log scale)."""
    widths = {name: GPTConfig.preset(name).n_embd for name in DEFAULT_LR}
    nearest = min(widths, key=lambda name: abs(math.log(widths[name] / config.n_embd)))
    return DEFAULT_LR[nearest]


def batch_of(step, steps_per_epoch, n_examples, args, group):
    """(the step's batch, this rank's slice of it, the slice's place in the batch), as example
    indices; the last batch of an epoch may be short, and a rank's slice empty."""
    epoch, position = divmod(step, steps_per_epoch)
    order = epoch_order(args.seed, epoch, n_examples)
    batch = order[position * args.batch_size : (position + 1) * args.batch_size]
    slices = np.array_split(batch, group.size)
    return batch, slices[group.rank], sum(len(s) for s in slices[: group.rank])


def forward_backward(head, train, mine, lm_coef, weight, masks):
    """Add the gradient of L3 = L2 + lm_coef * L1 over this rank's examples into the weights'
    .grad; returns this rank's share of the batch's losses, each times `weight` (its share of the
    examples), left on the device: {"loss": L2, "objective": L3, "lm_loss": L1 (when lm_coef)}.
    masks = (seed, step, the place of mine[0] in the step's batch), for the dropout masks."""
    names = ["loss", "objective"] + (["lm_loss"] if lm_coef != 0 else [])
    if not len(mine):
        return dict.fromkeys(names, 0.0)
    with use_masks(MaskStream(*masks)):
        objective, task_loss, lm_loss = head.loss(train.batch(mine), lm_coef)
    objective.backward()
    losses = {"loss": task_loss, "objective": objective, "lm_loss": lm_loss}
    return {name: weight * losses[name].data for name in names}


def measure_dev(training, dev, names, results, step, epoch, batch_size):
    """Measure the metrics `names` on the dev set after an epoch, and keep the weights if the main
    metric is the best so far; returns the line to print."""
    main = results["main_metric"]
    _, figures = evaluate(training.model, dev, names, batch_size)
    training.stop_if_diverged({f"dev {name}": value for name, value in figures.items()}, step, together=False)
    best_before = max((e[main] for e in results["epochs"]), default=-math.inf)
    results["epochs"].append({"step": step, "epoch": epoch, "val_loss": figures.pop("loss"), **figures})
    append_metrics(training.dir, results["epochs"][-1])
    if figures[main] > best_before:
        save_best(training.dir, training.model, training.dependencies())
    results["best"] = max(results["epochs"], key=lambda e: e[main])  # the first of equals: the one saved
    write_json(os.path.join(training.dir, "results.json"), results)
    return f"epoch {epoch}: dev loss {results['epochs'][-1]['val_loss']:.4f}, " + ", ".join(
        f"{name} {figures[name]:.4f}" for name in names
    )


def save_best(run_dir, head, digests):
    """Write the head's weights and `digests` (see save_weights) to best/: to .best-partial/ first,
    then renamed into place, the old best/ moved aside to .best-old/ just before and retired only
    after, someone else's files in it moved into the new one (checkpoint.remove_partials puts it
    back where a killed process left no best/)."""
    final, partial, old = (os.path.join(run_dir, name) for name in ("best", ".best-partial", ".best-old"))
    shutil.rmtree(partial, ignore_errors=True)
    save_weights(head, partial, digests)
    for name in os.listdir(partial):
        fsync(os.path.join(partial, name))
    if os.path.isdir(final):
        os.replace(final, old)
    os.replace(partial, final)
    fsync(run_dir)
    if os.path.isdir(old):
        retire(old, final)


@cli.command(parse_args, ranks=True)
def main(parser, args, group):
    """The run: with a group of several ranks, each takes its slice of every batch, and only rank 0
    writes the run folder and measures the dev and test sets."""
    # settings: a new run's from the command line, a resumed run's from its config.json
    if args.resume:
        renamed = {"warmup": "warmup_ratio"}  # the name in older runs
        args, run_dir, _, _ = lifecycle.resumed_args(parser, args, data=DATA_FLAGS, renamed=renamed)
        labels = saved_labels(parser, args, run_dir)
    else:
        run_dir, labels = lifecycle.new_run(parser, args, group, args.task), None
    inputs = (*(() if args.resume else ("init_from", "tokenizer", "gpt1_tokenizer")), "train", "dev", "test")
    lifecycle.check_apart(parser, "--resume" if args.resume else "--out", run_dir, args, inputs)
    device = lifecycle.start_job(parser, args, group)

    # data: the task's examples through the paper's input transformations; the head around the GPT
    datasets, encoded, head, tokenizer, data_hash = build_task(parser, args, run_dir, labels, device, group)

    # Adam, and its state from the checkpoint when resuming, else a new run folder
    args.lr = default_lr(head.transformer.config) if args.lr is None else args.lr
    optimizer = Adam(head.parameters(), lr=args.lr, l2=args.l2)
    training = lifecycle.Training(run_dir, group, head, optimizer, args.keep_checkpoints, "train.finetune")
    with lifecycle.stop_on_os_error(run_dir):
        if args.resume:
            start = training.restore(parser, args.resume)
        else:
            start = begin(training, args, tokenizer, datasets, data_hash)
        training.announce(head.transformer.config, device)
        print(f"peak learning rate {args.lr:g}")
        results = results_so_far(run_dir, args.task, datasets, encoded)
        tune_steps(training, args, encoded, datasets["dev"].metrics, results, start)
        if group.main:
            finish(training, args, datasets, encoded, results)


def tune_steps(training, args, encoded, names, results, start):
    """The steps from `start` to the end of the last epoch: log lines, the dev set measured after
    each epoch (results), checkpoints, and a stop on Ctrl-C or SIGTERM."""
    group, head, train, dev = training.group, training.model, encoded["train"], encoded["dev"]
    steps_per_epoch = math.ceil(len(train) / args.batch_size)
    total = args.epochs * steps_per_epoch
    log = lifecycle.LossLog(training, "examples")
    with use_precision(args.precision), lifecycle.progress_bar(total, start, args.task, group) as progress:
        for step in range(start, total):
            began = time.perf_counter()
            # one optimizer step on this rank's slice of the batch
            batch, mine, first = batch_of(step, steps_per_epoch, len(train), args, group)
            # L2 and L1 are means over examples (L1 over each sequence's tokens first): weighted by its
            # share of the examples, a rank's gradient and losses add up over the ranks to the whole batch's
            weight = len(mine) / len(batch)
            # the schedule at the middle of this step's share of the run: no step's rate is 0
            lr = args.lr * warmup_linear((step + 0.5) / total, args.warmup_ratio)
            training.optimizer.zero_grad()
            losses = forward_backward(head, train, mine, args.lm_coef, weight, (args.seed, step, first))
            training.optimizer_step(lr, weight, args.grad_clip)
            training.elapsed += time.perf_counter() - began
            log.add(step + 1, losses, len(batch), lr=lr)
            progress.update(1)

            done = step + 1
            # Ctrl-C may reach the ranks in different steps
            interrupted = group.any(training.interrupt.requested)
            epoch, steps_into_epoch = divmod(done, steps_per_epoch)
            saving = steps_into_epoch == 0 or (args.save_every and done % args.save_every == 0) or interrupted
            # log: the losses come to the host only here (never save or measure weights a NaN has reached)
            if done % args.log_every == 0 or steps_into_epoch == 0 or saving:
                log.write(progress)
            # measure the dev set at the end of each epoch, keeping the best epoch's weights
            if steps_into_epoch == 0 and group.main:
                progress.write(measure_dev(training, dev, names, results, done, epoch, args.batch_size))
            # checkpoint at each epoch's end and every --save-every steps, and stop after one on Ctrl-C
            if saving:
                checkpoint = training.save(done)
            if interrupted:
                training.stop_interrupted(done, checkpoint, progress)


def begin(training, args, tokenizer, datasets, data_hash):
    """Write a new fine-tune's folder: tokenizer, config.json (with the hash of the examples) and
    the label names. Returns 0."""
    train_set = datasets["train"]
    has_labels = train_set.labels is not None
    settings = {"has_labels": has_labels, "layout": train_set.layout, "data_hash": data_hash}
    training.begin(training.model.transformer.config, tokenizer, args, **settings)
    if has_labels and training.group.main:
        task_files.save_labels(train_set.labels, os.path.join(training.dir, "labels.json"))
    return 0


def results_so_far(run_dir, task, datasets, encoded):
    """results.json's content: the dev figures of the epochs done (after a resume), the best of
    them, and the examples cut to fit n_ctx or left out of each split."""
    main = datasets["dev"].main_metric
    epochs = [m for m in read_metrics(run_dir) if "epoch" in m]
    return {
        "task": task,
        "main_metric": main,
        "epochs": epochs,
        "best": max(epochs, key=lambda e: e[main]) if epochs else None,
        "n_cut": {split: data.n_cut for split, data in encoded.items()},
        "skipped": {split: d.skipped for split, d in datasets.items()},
    }


def finish(training, args, datasets, encoded, results):
    """After the last step: the test set's predictions and, where it has labels, figures (with the
    best epoch's weights), and the report."""
    training.interrupt.at_once()
    plot = plot_metrics(training.dir)  # before the test set, which a signal may cut short
    names = datasets["dev"].metrics
    if "test" in encoded:
        results["test"] = predict_test(
            training.dir, training.model, datasets["test"], encoded["test"], names, args.batch_size
        )
        write_json(os.path.join(training.dir, "results.json"), results)
    report(training.dir, results, names, training.elapsed, plot)


def predict_test(run_dir, head, dataset, data, metric_names, batch_size):
    """The test set's metrics with the best epoch's weights (None where it has no labels); its
    predictions go to predictions.tsv."""
    head.load_state_dict(read_weights(os.path.join(run_dir, "best"), head))
    predictions, figures = evaluate(head, data, metric_names, batch_size)
    write_predictions(os.path.join(run_dir, "predictions.tsv"), predictions, dataset)
    return figures


def report(run_dir, results, metric_names, elapsed, plot):
    """The closing lines: dev figures per epoch, the best, cut and skipped examples, test, files
    (`plot`: the loss curve drawn, or None)."""

    def figures(record):
        return ", ".join(f"{name} {record[name]:.4f}" for name in metric_names)

    print(f"\nfine-tuned {results['task']} in {elapsed / 60:.1f} min of compute")
    for record in results["epochs"]:
        print(f"  epoch {record['epoch']}: dev {figures(record)}")
    best = results["best"]  # None where metrics.jsonl lost the epochs (the run resumed after its last)
    if best:
        print(f"best dev (epoch {best['epoch']}, by {results['main_metric']}): {figures(best)}")
    else:
        print("no dev epoch logged")
    print("examples cut to fit n_ctx: " + ", ".join(f"{split} {n}" for split, n in results["n_cut"].items()))
    skipped = [
        f"{split}: " + ", ".join(f"{n} {why}" for why, n in counts.items())
        for split, counts in results["skipped"].items()
        if counts
    ]
    if skipped:
        print(f"rows left out: {'; '.join(skipped)}")
    if "test" in results:
        test = figures(results["test"]) if results["test"] else "no labels to measure"
        print(f"test (best epoch's weights): {test}; predictions in {run_dir}/predictions.tsv")
    print(f"run folder: {run_dir}" + (f" (loss curve: {plot})" if plot else ""))


if __name__ == "__main__":
    main()
