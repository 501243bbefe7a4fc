"""python -m train.pretrain: the paper's first stage, a language model on unlabelled text (L1).

With no arguments it trains the `tiny` preset on text that ships with Python, with a byte-level
BPE trained on the same text, in a few minutes on a CPU. See --help for the rest.
"""

import os
import time
from itertools import islice
from pathlib import Path

import autograd as ag
from autograd import functional as F
from autograd.optim import Adam, warmup_cosine
from autograd.precision import use_precision
from autograd.random import MaskStream, use_masks
from tinygpt import GPT, GPTConfig
from tinygpt.generation import generate
from tinygpt.tokenizer import GPT1Tokenizer, load_tokenizer

from . import cli, data, dataset, distributed, lifecycle, prepare
from .cli import add_precision_argument, add_text_arguments, grouped_parser, non_negative_int, positive_int
from .run_folder import append_metrics, plot_metrics, read_metrics, run_folder_of


def parse_args(argv):
    groups = {
        "data and tokenizer": add_data_arguments,
        "model": add_model_arguments,
        "optimization": add_optimizer_arguments,
        "the run": add_run_arguments,
    }
    parser = grouped_parser("python -m train.pretrain", __doc__, groups)
    args = parser.parse_args(argv)
    if args.batch_size % args.grad_accum:
        parser.error(f"--batch-size {args.batch_size} is not a multiple of --grad-accum {args.grad_accum}")
    if args.tokenizer and args.gpt1_tokenizer:
        parser.error("give --tokenizer or --gpt1-tokenizer, not both")
    if args.precision != "fp32" and args.dtype != "float32":
        parser.error(f"--precision {args.precision} is for float32 weights, not --dtype {args.dtype}")
    if args.normalize and (args.tokenizer or args.gpt1_tokenizer):
        parser.error("--normalize is for a tokenizer trained here, not with --tokenizer or --gpt1-tokenizer")
    if "vocab_size" in lifecycle.flags_given(parser, args) and (args.tokenizer or args.gpt1_tokenizer):
        parser.error("--vocab-size is for a tokenizer trained here, not with --tokenizer or --gpt1-tokenizer")
    preset = GPTConfig.preset(args.preset)
    n_embd, n_head = args.n_embd or preset.n_embd, args.n_head or preset.n_head
    if n_embd % n_head:
        parser.error(f"--n-embd {n_embd} does not split into --n-head {n_head} heads of equal width")
    cli.check_model(parser, args)
    if args.out:
        cli.check_writable(parser, "--out", args.out)
    return parser, args


def add_data_arguments(group):
    group.add_argument(
        "--data",
        nargs="+",
        help="a dataset folder (python -m train.prepare), or text files, folders of *.txt or "
        "globs, prepared into the cache (default: pydoc's topics)",
    )
    held = "share of the documents held out (by their hash); of the tokens where that is less than a window"
    group.add_argument("--val-fraction", type=cli.held_out, default=0.05, help=held)
    trained = "(default: the --init-from run's, else one trained on the data)"
    group.add_argument("--tokenizer", help=f"a saved BPE tokenizer folder {trained}")
    gpt1_files = "a folder with GPT-1's encoder_bpe_40000.json, vocab_40000.bpe"
    group.add_argument("--gpt1-tokenizer", help=f"{gpt1_files} (default: see --tokenizer)")
    group.add_argument("--vocab-size", type=cli.vocab_size, default=2048, help="of a tokenizer trained here")
    normalize = "a tokenizer trained here first prepares text as GPT-1 did: lower case, words split like "
    normalize += "spaCy (fits GLUE's sentences; default: the text as it is)"
    group.add_argument("--normalize", choices=["gpt1"], help=normalize)
    add_text_arguments(group)


def add_model_arguments(group):
    group.add_argument("--preset", default="tiny", choices=["tiny", "mini", "gpt1"], help="the model's shape")
    group.add_argument("--n-ctx", type=positive_int, help="context length (default: the preset's)")
    group.add_argument("--n-layer", type=positive_int, help="blocks (default: the preset's)")
    group.add_argument("--n-embd", type=positive_int, help="width (default: the preset's)")
    group.add_argument("--n-head", type=positive_int, help="attention heads (default: the preset's)")
    dropout = "embedding, attention and residual (default: the preset's)"
    group.add_argument("--dropout", type=cli.fraction, help=dropout)
    group.add_argument("--dtype", default="float32", choices=["float32", "float64"], help="of the weights")
    add_precision_argument(group)
    weights = "weights: a run, a checkpoint or an openai-gpt folder (default: random ones)"
    group.add_argument("--init-from", metavar="DIR", help=weights)


def add_optimizer_arguments(group):
    batch = "windows per step (the global batch)"
    group.add_argument("--batch-size", type=positive_int, default=16, help=batch)
    group.add_argument("--grad-accum", type=positive_int, default=1, help="backward passes per batch")
    resumed = "with --resume: where the run now stops, its rate schedule keeping the first total"
    group.add_argument(
        "--steps",
        type=positive_int,
        help=f"optimizer steps (default: --epochs, else 600); {resumed} (see --resume)",
    )
    group.add_argument(
        "--epochs", type=cli.positive_float, help="passes over the training windows (default: see --steps)"
    )
    stall = "the paper: 2.5e-4 for GPT-1; above about 1e-3 the small post-LN presets stall at the "
    stall += "unigram loss"
    group.add_argument("--lr", type=cli.positive_float, default=5e-4, help=f"peak learning rate ({stall})")
    group.add_argument(
        "--warmup-steps",
        type=non_negative_int,
        default=2000,
        help="steps over which the rate rises (the paper's), at most a tenth of the run",
    )
    group.add_argument("--l2", type=cli.non_negative_float, default=0.01, help="L2 penalty, see --l2-mode")
    l2_modes = "decoupled: GPT-1's, applied to the weights beside Adam's step; coupled: added to the gradient"
    group.add_argument("--l2-mode", default="decoupled", choices=["decoupled", "coupled"], help=l2_modes)
    group.add_argument(
        "--grad-clip", type=cli.non_negative_float, default=1.0, help="global gradient-norm limit; 0: none"
    )


def add_run_arguments(group):
    cli.add_device_argument(group)
    group.add_argument("--seed", type=cli.seed, default=0, help="fixes the data, init and dropout")
    group.add_argument("--eval-every", type=positive_int, default=200, help="steps between validation passes")
    group.add_argument("--eval-windows", type=positive_int, default=200, help="validation windows per pass")
    group.add_argument("--log-every", type=positive_int, default=10, help="steps between log lines")
    group.add_argument("--save-every", type=positive_int, default=500, help="steps between checkpoints")
    kept = "the newest checkpoints kept (0: all)"
    group.add_argument("--keep-checkpoints", type=non_negative_int, default=3, help=kept)
    group.add_argument("--out", help="run folder (default: runs/<preset>-<date>-<time>)")
    resume = (
        "continue a run (its folder, or one checkpoint in it) with its own settings: only --device, "
        "--steps, --log-every, --eval-every, --save-every, --keep-checkpoints, --sample-tokens may "
        "differ. Steps past the run's first total go at its schedule's last rate; to train longer on "
        "a new schedule, start a new run with --init-from (default: a new run)"
    )
    group.add_argument("--resume", metavar="PATH", help=resume)
    group.add_argument("--overwrite", action="store_true", help="replace the run in a non-empty --out")
    group.add_argument(
        "--allow-data-change", action="store_true", help="--resume on data that changed since the run began"
    )
    group.add_argument(
        "--sample-tokens", type=non_negative_int, default=60, help="length of the sample printed at the end"
    )
    group.add_argument("--distributed", action="store_true", help="a rank of an mpirun job (see the README)")


def model_config(args, vocab_size):
    overrides = {
        name: getattr(args, name)
        for name in ("n_ctx", "n_layer", "n_embd", "n_head")
        if getattr(args, name) is not None
    }
    if args.dropout is not None:
        overrides.update(embd_pdrop=args.dropout, attn_pdrop=args.dropout, resid_pdrop=args.dropout)
    return GPTConfig.preset(args.preset, vocab_size=vocab_size, **overrides)


def read_tokens(parser, args, run_dir, group):
    """(tokenizer, the prepared Dataset, its hash): --data's dataset folder, or its text (pydoc's
    topics by default) prepared into the cache as train.prepare prepares a folder, with the run's
    tokenizer: a resumed run's own, the one given or --init-from's, else a BPE trained on the text."""
    folder, given = dataset_given(parser, args), None
    if folder is None:
        try:
            if args.resume:
                given = load_tokenizer(os.path.join(run_dir, "tokenizer"))
            elif args.tokenizer or args.gpt1_tokenizer:
                given = given_tokenizer(args.tokenizer, args.gpt1_tokenizer)
            elif args.init_from and os.path.isdir(os.path.join(run_folder_of(args.init_from), "tokenizer")):
                given = load_tokenizer(os.path.join(run_folder_of(args.init_from), "tokenizer"))
        except (ValueError, OSError) as error:
            parser.error(f"{'--resume' if args.resume else 'the tokenizer'}: {error}")
        with cli.reading(parser, "--data"):
            folder = prepare.of_text(args.data or [data.default_corpus_folder()], args, given)
    tokenizer, prepared, digest = read_dataset(parser, args, run_dir, group, folder)
    if not (args.resume or dataset.is_dataset(args.data[0] if args.data else "")) and given is None:
        args.vocab_size = tokenizer.vocab_size  # what config.json records: built, not asked
    return tokenizer, prepared, digest


def dataset_given(parser, args):
    """The dataset folder --data names, or None where it names text; a usage error where it names a
    dataset beside other paths, a file in one, or a dataset with flags that only text takes."""
    paths = args.data or []
    for path in paths:
        for inside in Path(os.path.abspath(path)).parents:
            if dataset.is_dataset(inside):
                parser.error(f"--data: {path} lies in the dataset {inside}: give the folder")
    datasets = [path for path in paths if os.path.isdir(path) and dataset.is_dataset(path)]
    if datasets and len(paths) > 1:
        parser.error(
            f"--data: {datasets[0]} is a dataset: give it alone (a run trains on one dataset or on text)"
        )
    if not datasets:
        return None
    if not args.resume:
        given = lifecycle.flags_given(parser, args)
        for flag in ("vocab_size", "normalize", "encoding", "errors"):
            if flag in given:
                name = f"--{flag.replace('_', '-')}"
                parser.error(f"{name}: {datasets[0]} is prepared already ({name} is for text): leave it out")
    return datasets[0]


def given_tokenizer(folder, gpt1_folder):
    return load_tokenizer(folder) if folder else GPT1Tokenizer.from_folder(gpt1_folder)


def read_dataset(parser, args, run_dir, group, folder):
    """read_tokens of a folder train.prepare wrote: its tokenizer, which must be the run's (a resumed
    run's, --tokenizer's, --gpt1-tokenizer's or --init-from's where given), and its shards, mapped."""
    with cli.reading(parser, "--data"):
        prepared = dataset.Dataset(folder)
        cli.on_return(prepared.close)  # when the run ends, however it ends (a caller may hold the Dataset)
        tokenizer = load_tokenizer(os.path.join(folder, "tokenizer"))
        if data.tokenizer_fingerprint(tokenizer) != prepared.fingerprint:
            parser.error(
                f"--data: {os.path.join(folder, 'tokenizer')} is not the tokenizer that encoded the "
                f"ids of {folder} (the manifest's fingerprint); prepare the dataset again"
            )
        init_from = (
            args.init_from and not args.resume and os.path.join(run_folder_of(args.init_from), "tokenizer")
        )
        named = [("--resume", args.resume and os.path.join(run_dir, "tokenizer")), ("--init-from", init_from)]
        named += [("--tokenizer", args.tokenizer), ("--gpt1-tokenizer", args.gpt1_tokenizer)]
        for flag, path in named:
            if path and os.path.isdir(path):
                other = given_tokenizer(*((None, path) if flag == "--gpt1-tokenizer" else (path, None)))
                if data.tokenizer_fingerprint(other) != prepared.fingerprint:
                    parser.error(
                        f"--data: {folder} was prepared with another tokenizer than {flag}'s ({path}); "
                        f"prepare it with that tokenizer: python -m train.prepare --tokenizer {path} ..."
                    )
    group.check_same("corpus or tokenizer", prepared.digest.encode())
    lifecycle.check_data(parser, args, prepared.digest)
    print(f"{len(prepared.train) + len(prepared.val):,} tokens (prepared in {folder})")
    return tokenizer, prepared, prepared.digest


def cut_windows(parser, args, prepared, n_ctx):
    """(training windows, validation windows) of the dataset's splits. Where its validation split
    holds less than a window (a corpus of few documents), the last --val-fraction of the training
    tokens is held out instead, and one line says so."""
    train_ids, val_ids = prepared.train, prepared.val
    try:
        if len(train_ids) < n_ctx + 1 < len(val_ids):  # a corpus of one document, held out by its hash
            print("every document fell in the validation split (by its hash): the run trains on them")
            train_ids, val_ids = val_ids, train_ids
        if len(val_ids) < n_ctx + 1:
            print(
                f"the validation documents hold {len(val_ids):,} tokens, less than a window of "
                f"n_ctx + 1 = {n_ctx + 1}: the last {args.val_fraction:g} of the training tokens is held out"
            )
            train_ids, val_ids = data.split(train_ids, args.val_fraction, n_ctx)
        train = data.Windows(train_ids, n_ctx, "training data")
        val = data.Windows(val_ids, n_ctx, "validation data")
    except ValueError as error:
        parser.error(str(error))
    if train.count < args.batch_size:
        parser.error(
            f"the training data makes {train.count} windows of {n_ctx + 1} tokens, "
            f"fewer than --batch-size {args.batch_size}"
        )
    return train, val


def build_model(parser, args, config, weights, device, group):
    """(GPT, Adam): new weights, or those of the folder `weights` (--init-from's); the same on every rank."""
    ag.manual_seed(args.seed)
    model = GPT(config)
    if weights:
        try:
            model.load_state_dict(GPT.read_weights(weights))
        except (ValueError, OSError) as error:
            parser.error(f"--init-from: {error}")
    for p in model.parameters():
        p.data = p.data.astype(args.dtype)
    model.to(device).train()
    group.broadcast_parameters(model.parameters())
    return model, Adam(model.parameters(), lr=args.lr, l2=args.l2, l2_mode=args.l2_mode)


def forward_backward(model, batch, grad_accum, masks):
    """Add the gradient of the batch's mean next-token loss into the weights' .grad, in
    grad_accum backward passes over equal parts; returns the loss, an array left on the device.
    masks = (seed, step, first_example): window i of the batch is example first_example + i of
    the step's dropout masks, however the global batch is cut into ranks and parts."""
    seed, step, first_example = masks
    part_size = len(batch) // grad_accum
    total = 0.0
    for start in range(0, len(batch), part_size):
        part = batch[start : start + part_size]
        with use_masks(MaskStream(seed, step, first_example + start)):
            loss = F.cross_entropy(model(part[:, :-1]), part[:, 1:]) / grad_accum
        loss.backward()
        total = total + loss.data
    return total


@ag.no_grad()
def evaluate(model, windows, batch_size, limit, group=None):
    """Mean next-token loss over up to `limit` windows, in eval mode; the ranks of a `group` take
    every size-th batch each and add up their sums."""
    group = group or distributed.Group()
    model.eval()
    total, count = 0.0, 0
    for batch in islice(windows.in_order(batch_size, limit), group.rank, None, group.size):
        logits = model(batch[:, :-1])
        total += float(F.cross_entropy(logits, batch[:, 1:], reduction="sum").item())
        count += batch[:, 1:].size
    model.train()
    total, count = group.sum([total, count])
    return float(total / count)


def validate(training, val, args, step, progress):
    """Measure the loss on the validation windows; log and print it (stop where it diverged)."""
    loss = evaluate(training.model, val, args.batch_size, args.eval_windows, training.group)
    training.stop_if_diverged({"validation loss": loss}, step)
    record = {"step": step, "val_loss": loss, "val_perplexity": lifecycle.perplexity(loss)}
    if training.group.main:
        append_metrics(training.dir, {**record, "elapsed": round(training.elapsed, 2)})
    progress.write(f"step {step}: validation loss {loss:.4f}, perplexity {record['val_perplexity']:.1f}")


@cli.command(parse_args, ranks=True)
def main(parser, args, group):
    """The run: with a group of several ranks, each trains on its slice of every batch, and only
    rank 0 writes the run folder."""
    # settings: a new run's from the command line, a resumed run's from its config.json
    if args.resume:
        flags = {
            "may_change": ("steps", "eval_every", "sample_tokens"),
            "data": ("data", "encoding", "errors"),
            "resolved": ("steps",),  # worked out before the run saved them
        }
        renamed = {"warmup": "warmup_steps"}  # the name in older runs
        args, run_dir, config, saved = lifecycle.resumed_args(parser, args, **flags, renamed=renamed)
    else:
        run_dir, config = lifecycle.new_run(parser, args, group, args.preset), None
    inputs = ("data",) if args.resume else ("data", "init_from", "tokenizer", "gpt1_tokenizer")
    lifecycle.check_apart(parser, "--resume" if args.resume else "--out", run_dir, args, inputs)
    weights = args.init_from and not args.resume and lifecycle.starting_weights(parser, args.init_from)
    device = lifecycle.start_job(parser, args, group, parts_per_rank=args.grad_accum)

    # data: the corpus in tokens, cut into windows of n_ctx + 1
    tokenizer, ids, data_hash = read_tokens(parser, args, run_dir, group)
    config = config or model_config(args, tokenizer.vocab_size)
    train, val = cut_windows(parser, args, ids, config.n_ctx)
    # the closing report's baseline, now: it reads every shard, and a damaged one stops the run here
    baseline = data.unigram_perplexity(train.ids, val.ids, tokenizer.vocab_size) if group.main else None
    if args.steps is None:
        args.steps = max(1, int(args.epochs * (train.count // args.batch_size))) if args.epochs else 600
    total = saved["steps"] if args.resume else args.steps  # the schedule's, kept by a resume's --steps
    if args.steps > total:
        print(f"steps {total + 1} to {args.steps} go at the last rate of the run's schedule of {total} steps")

    # the model and Adam: from the checkpoint when resuming, else a new run folder
    model, optimizer = build_model(parser, args, config, weights, device, group)
    training = lifecycle.Training(run_dir, group, model, optimizer, args.keep_checkpoints, "train.pretrain")
    with lifecycle.stop_on_os_error(run_dir):
        if args.resume:
            start = training.restore(parser, args.resume, last_step=args.steps)
        else:
            start = training.begin(config, tokenizer, args, data_hash=data_hash)
        training.announce(config, device)
        train_steps(training, args, train, val, start, total)
        training.interrupt.at_once()
        if group.main:
            report(training.model, tokenizer, baseline, run_dir, args, training.elapsed)


def train_steps(training, args, train, val, start, total):
    """Steps start+1 .. args.steps, at the rates of a schedule of `total` steps (its last one
    after it), with log lines, validation, checkpoints, and a stop on Ctrl-C or SIGTERM."""
    group, config = training.group, training.model.config
    warmup = min(args.warmup_steps, total // 10)
    log = lifecycle.LossLog(training, "tokens")
    with (
        use_precision(args.precision),
        lifecycle.progress_bar(args.steps, start, "pretrain", group) as progress,
    ):
        for step in range(start, args.steps):
            began = time.perf_counter()
            # one optimizer step on this rank's share of the batch, in --grad-accum backward passes
            batch = train.training_batch(step, args.batch_size, args.seed, group.rank, group.size)
            # the schedule at the middle of this step's share of the run: no step's rate is 0
            lr = args.lr * warmup_cosine((min(step, total - 1) + 0.5) / total, warmup / total)
            training.optimizer.zero_grad()
            masks = (args.seed, step, group.rank * len(batch))  # this rank's first window of the batch
            loss = forward_backward(training.model, batch, args.grad_accum, masks)
            # the mean gradient of the whole batch
            training.optimizer_step(lr, 1 / group.size, args.grad_clip)
            training.elapsed += time.perf_counter() - began
            # each rank's share of the mean loss: its windows hold as many tokens as any other's
            log.add(step + 1, {"loss": loss / group.size}, args.batch_size * config.n_ctx, lr=lr)
            progress.update(1)

            done = step + 1
            # Ctrl-C may reach the ranks in different steps
            interrupted = group.any(training.interrupt.requested)
            evaluating = done % args.eval_every == 0 or done == args.steps
            saving = done % args.save_every == 0 or done == args.steps or interrupted
            # log: the losses come to the host only here (never save weights a NaN has reached)
            if done % args.log_every == 0 or evaluating or saving:
                log.write(progress)
            # evaluate on the held-out windows
            if evaluating:
                validate(training, val, args, done, progress)
            # checkpoint, and stop after it on Ctrl-C
            if saving:
                checkpoint = training.save(done)
            if interrupted:
                training.stop_interrupted(done, checkpoint, progress)


def report(model, tokenizer, baseline, run_dir, args, elapsed):
    """The closing lines: the last validation perplexity logged beside the unigram baseline, a
    sample, the files. A resume that trains no step may have no validation pass to show: say so."""
    passes = [m for m in read_metrics(run_dir) if "val_loss" in m]
    print(f"\ntrained {args.steps} steps in {elapsed / 60:.1f} min of compute")
    measured = f"no validation pass logged by step {args.steps}"
    if passes:
        measured = f"validation perplexity {passes[-1]['val_perplexity']:.1f} at step {passes[-1]['step']}"
    print(f"{measured} (unigram baseline {baseline:.1f})")
    plot = plot_metrics(run_dir)  # before the sample, which a signal may cut short
    prompt = tokenizer.encode("The ")
    sample = generate(model.eval(), prompt, args.sample_tokens, temperature=0.8, top_k=40, seed=args.seed)
    print(f"sample: {tokenizer.decode(prompt + sample)!r}")
    print(f"run folder: {run_dir}" + (f" (loss curve: {plot})" if plot else ""))


if __name__ == "__main__":
    main()
