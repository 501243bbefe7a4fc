"""python -m train.pretrain: the paper's first stage, a language model on unlabelled text (L1).

With no arguments it trains the `tiny` preset on text that ships with Python, with a byte-level
BPE trained on the same text, in a few minutes on a CPU. See --help for the rest.
"""
import argparse
import json
import math
import os
import signal
import sys
import time
from itertools import islice

from tqdm import tqdm

import autograd as ag
from autograd import backend
from autograd import functional as F
from autograd.optim import Adam, clip_grad_norm, warmup_cosine
from tinygpt import GPT, GPTConfig
from tinygpt.tokenizer import BPETokenizer, GPT1Tokenizer

from . import data, distributed
from .checkpoint import find_checkpoint, load_checkpoint, save_checkpoint
from .cli import Help
from .run import append_metrics, load_tokenizer, plot_metrics, read_config, read_metrics, rewrite_metrics, \
    save_tokenizer, write_config


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m train.pretrain", description=__doc__,
                                formatter_class=Help)
    p.add_argument("--data", nargs="+", help="text files, folders of *.txt or globs (default: Python's pydoc topics)")
    p.add_argument("--tokenizer", help="a saved BPE tokenizer folder (default: train one on the data)")
    p.add_argument("--gpt1-tokenizer", help="folder with GPT-1's encoder_bpe_40000.json and vocab_40000.bpe")
    p.add_argument("--vocab-size", type=int, default=2048, help="vocabulary of a tokenizer trained here")
    p.add_argument("--normalize", choices=["gpt1"],
                   help="a tokenizer trained here first prepares text as GPT-1 did: lower case, words split "
                        "like spaCy (fits GLUE's lower-cased, tokenized sentences)")
    p.add_argument("--preset", default="tiny", choices=["tiny", "mini", "gpt1"])
    p.add_argument("--n-ctx", type=int, help="context length (default: the preset's)")
    p.add_argument("--n-layer", type=int)
    p.add_argument("--n-embd", type=int)
    p.add_argument("--n-head", type=int)
    p.add_argument("--dropout", type=float, help="embedding, attention and residual dropout (default: the preset's)")
    p.add_argument("--batch-size", type=int, default=16, help="windows per optimizer step (the global batch)")
    p.add_argument("--grad-accum", type=int, default=1, help="split each batch into this many backward passes")
    p.add_argument("--steps", type=int, help="optimizer steps (default: --epochs, else 600)")
    p.add_argument("--epochs", type=float, help="passes over the training windows, if --steps is not given")
    p.add_argument("--lr", type=float, default=5e-4,
                   help="peak learning rate (the paper: 2.5e-4 for GPT-1; above about 1e-3 the small post-LN "
                        "presets stall at the unigram loss)")
    p.add_argument("--warmup", type=int, default=2000, help="warmup steps (the paper: 2000), capped at a tenth of the run")
    p.add_argument("--l2", type=float, default=0.01)
    p.add_argument("--l2-mode", default="decoupled", choices=["decoupled", "coupled"])
    p.add_argument("--grad-clip", type=float, default=1.0, help="global gradient-norm limit; 0 turns it off")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--val-fraction", type=float, default=0.05, help="share of the tokens held out for validation")
    p.add_argument("--eval-every", type=int, default=200, help="steps between validation passes")
    p.add_argument("--eval-windows", type=int, default=200, help="validation windows per pass")
    p.add_argument("--log-every", type=int, default=10, help="steps between log lines")
    p.add_argument("--save-every", type=int, default=500, help="steps between checkpoints")
    p.add_argument("--keep-checkpoints", type=int, default=3)
    p.add_argument("--out", help="run folder (default: runs/<preset>-<date>-<time>)")
    p.add_argument("--resume", metavar="PATH", help="continue a run (its folder, or one checkpoint in it)")
    p.add_argument("--init-from", metavar="DIR", help="start from these weights: a run, a checkpoint, or an openai-gpt folder")
    p.add_argument("--sample-tokens", type=int, default=60, help="length of the sample printed at the end")
    p.add_argument("--distributed", action="store_true",
                   help="one rank of a data-parallel job started by mpirun (see the README)")
    args = p.parse_args(argv)
    for name in ("batch_size", "grad_accum", "eval_every", "log_every", "save_every", "vocab_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.batch_size % args.grad_accum:
        p.error(f"--batch-size {args.batch_size} is not a multiple of --grad-accum {args.grad_accum}")
    if args.tokenizer and args.gpt1_tokenizer:
        p.error("give --tokenizer or --gpt1-tokenizer, not both")
    if args.normalize and (args.tokenizer or args.gpt1_tokenizer):
        p.error("--normalize is for a tokenizer trained here, not with --tokenizer or --gpt1-tokenizer")
    return p, args


def build_tokenizer(args, texts, run_dir):
    if args.tokenizer:
        return load_tokenizer(args.tokenizer)
    if args.gpt1_tokenizer:
        encoder, merges = (os.path.join(args.gpt1_tokenizer, name) for name in GPT1Tokenizer.FILES)
        return GPT1Tokenizer.from_files(encoder, merges)
    if args.init_from and os.path.isdir(os.path.join(run_folder_of(args.init_from), "tokenizer")):
        return load_tokenizer(os.path.join(run_folder_of(args.init_from), "tokenizer"))
    normalized = f", text normalized as GPT-1's ({args.normalize})" if args.normalize else ""
    print(f"training a byte-level BPE tokenizer of {args.vocab_size} tokens on the corpus{normalized} ...")
    return BPETokenizer.train(texts, args.vocab_size, normalizer=args.normalize)


def run_folder_of(path):
    """The run folder of a checkpoint folder; any other folder as it is."""
    parent = os.path.dirname(os.path.abspath(path))
    return os.path.dirname(parent) if os.path.basename(parent) == "checkpoints" else path


def model_config(args, vocab_size):
    overrides = {name: getattr(args, name) for name in ("n_ctx", "n_layer", "n_embd", "n_head")
                 if getattr(args, name) is not None}
    if args.dropout is not None:
        overrides.update(embd_pdrop=args.dropout, attn_pdrop=args.dropout, resid_pdrop=args.dropout)
    return GPTConfig.preset(args.preset, vocab_size=vocab_size, **overrides)


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


class Interrupt:
    """Turns the first Ctrl-C into a request to stop after the current step; a second one kills."""

    def __init__(self):
        self.requested = False
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame):
        self.requested = True
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv=None):
    parser, args = parse_args(argv)
    distributed.run(parser, args, train_model)


def train_model(parser, args, group):
    """The run: with a group of several ranks, each trains on its slice of every batch, and only
    rank 0 writes the run folder."""
    if args.resume:
        try:
            checkpoint = find_checkpoint(args.resume)
            run_dir = run_folder_of(checkpoint)
            config, settings = read_config(run_dir)
        except (ValueError, OSError) as error:
            parser.error(f"--resume: {error}")
        steps_asked, device_asked = args.steps, args.device
        args = argparse.Namespace(**{**vars(args), **settings, "resume": checkpoint, "device": device_asked,
                                     "steps": steps_asked or settings["steps"]})
    else:
        run_dir = args.out or os.path.join("runs", f"{args.preset}-{time.strftime('%Y%m%d-%H%M%S')}")
    group.check_same("command line", json.dumps(vars(args), sort_keys=True).encode())  # else a rank could hang
    if args.batch_size % (group.size * args.grad_accum):
        parser.error(f"--batch-size {args.batch_size} (the global batch) does not split evenly over "
                     f"{group.size} ranks x --grad-accum {args.grad_accum}")
    device = group.device(args.device)

    try:
        texts = data.read_corpus(args.data) if args.data else data.default_corpus()
    except (ValueError, FileNotFoundError) as error:
        parser.error(str(error))
    if args.resume:
        tokenizer = load_tokenizer(os.path.join(run_dir, "tokenizer"))
    else:
        tokenizer = build_tokenizer(args, texts, run_dir)  # on every rank: the same text makes the same one
        if group.main:
            os.makedirs(run_dir, exist_ok=True)
            save_tokenizer(tokenizer, run_dir)
        config = model_config(args, tokenizer.vocab_size)
    ids, cache_path, reused = data.tokenize_corpus(texts, tokenizer)
    group.check_same("corpus or tokenizer", os.path.basename(cache_path).encode())  # named by their hash
    print(f"{len(ids):,} tokens ({'reused' if reused else 'written to'} {cache_path})")
    try:
        train_ids, val_ids = data.split(ids, args.val_fraction, config.n_ctx)
        train, val = data.Windows(train_ids, config.n_ctx, "training data"), data.Windows(val_ids, config.n_ctx, "validation data")
        if train.count < args.batch_size:
            raise ValueError(f"the training data makes {train.count} windows of {config.n_ctx + 1} tokens, "
                             f"fewer than --batch-size {args.batch_size}")
    except ValueError as error:
        parser.error(str(error))
    if args.steps is None:
        args.steps = max(1, int(args.epochs * (train.count // args.batch_size))) if args.epochs else 600

    ag.manual_seed(args.seed)
    model = GPT(config)
    if args.init_from and not args.resume:
        try:
            source = find_checkpoint(args.init_from) if os.path.isdir(os.path.join(args.init_from, "checkpoints")) else args.init_from
            model.load_state_dict(GPT.read_weights(source))
        except (ValueError, OSError) as error:
            parser.error(f"--init-from: {error}")
    for p in model.parameters():
        p.data = p.data.astype(args.dtype)
    model.to(device).train()
    group.broadcast_parameters(model.parameters())
    optimizer = Adam(model.parameters(), lr=args.lr, l2=args.l2, l2_mode=args.l2_mode)

    start, elapsed = 0, 0.0
    if args.resume:
        try:
            state = load_checkpoint(args.resume, model, optimizer)
        except (ValueError, OSError) as error:
            parser.error(f"--resume: {error}")
        if state.get("world_size", group.size) != group.size:
            parser.error(f"--resume: {args.resume} was written by {state['world_size']} ranks; resume it with as "
                         f"many (this job has {group.size})")
        start, elapsed = state["step"], state["elapsed"]
        if group.main:
            rewrite_metrics(run_dir, [m for m in read_metrics(run_dir) if m["step"] <= start])
        print(f"resuming {run_dir} at step {start}")
    elif group.main:
        settings = {k: v for k, v in vars(args).items() if k not in ("resume", "out", "device", "distributed")}
        write_config(run_dir, config, settings)
    print(f"run folder: {run_dir}\nmodel: {config.n_layer} layers, {config.n_embd} wide, {config.n_head} heads, "
          f"n_ctx {config.n_ctx}, vocab {config.vocab_size}: {model.num_parameters():,} parameters on {device}"
          + (f", one of {group.size} ranks" if group.size > 1 else ""))

    warmup = min(args.warmup, args.steps // 10)
    micro = args.batch_size // group.size // args.grad_accum  # windows per backward pass on this rank
    tokens_per_step = args.batch_size * config.n_ctx
    interrupt = Interrupt()
    pending = []  # (step, loss array, lr, elapsed) since the last log line: losses stay on the device until then
    last_log = time.perf_counter()

    def log_pending():
        """Bring the pending losses to the host, log them, and stop the run on a NaN or inf."""
        nonlocal last_log
        if not pending:
            return
        losses = backend.to_numpy(model.tokens_embed.weight.xp.stack([record[1] for record in pending]))
        losses = group.sum(losses) / group.size  # the whole batch's: every rank's share has as many tokens
        bad = [record[0] for record, loss in zip(pending, losses) if not math.isfinite(loss)]
        if bad:
            good = find_checkpoint(run_dir) if os.path.isdir(os.path.join(run_dir, "checkpoints")) else "none yet"
            group.exit_together(f"the loss became {losses[len(pending) - len(bad)]} at step {bad[0]}: stopping; "
                                f"last good checkpoint: {good}")
        now = time.perf_counter()
        rate = len(pending) * tokens_per_step / (now - last_log)
        for (step, _, step_lr, step_elapsed), loss in zip(pending, losses):
            if group.main:
                append_metrics(run_dir, {"step": step, "loss": float(loss), "lr": step_lr,
                                         "tokens_per_s": round(rate), "elapsed": round(step_elapsed, 3)})
        progress.set_postfix(loss=f"{losses[-1]:.3f}", lr=f"{pending[-1][2]:.2e}", tok_s=f"{rate:,.0f}")
        pending.clear()
        last_log = now

    def checkpoint(step):
        """Called by every rank; rank 0 writes."""
        log_pending()  # never save weights that a NaN has already reached
        if not group.main:
            return None
        try:
            return save_checkpoint(run_dir, step, model, optimizer, {"elapsed": elapsed, "world_size": group.size},
                                   keep=args.keep_checkpoints)
        except OSError as error:
            sys.exit(f"could not write a checkpoint in {run_dir}/checkpoints: {error}; the last good one is kept")

    progress = tqdm(total=args.steps, initial=start, desc="pretrain", unit="step", dynamic_ncols=True,
                    disable=not group.main)
    with progress:  # closed however the loop ends, so no bar is left half drawn
        for step in range(start, args.steps):
            began = time.perf_counter()
            ag.manual_seed(distributed.dropout_seed(args.seed, step, group.rank))  # the same after a resume
            batch = train.training_batch(step, args.batch_size, args.seed, group.rank, group.size)
            lr = args.lr * warmup_cosine(step / args.steps, warmup / args.steps)
            optimizer.lr = lr
            optimizer.zero_grad()
            step_loss = 0.0
            for part in range(args.grad_accum):
                chunk = batch[part * micro:(part + 1) * micro]
                loss = F.cross_entropy(model(chunk[:, :-1]), chunk[:, 1:]) / args.grad_accum
                loss.backward()
                step_loss = step_loss + loss.data
            group.reduce_gradients(model.parameters(), 1 / group.size)  # the whole batch's mean gradient
            if args.grad_clip > 0:
                clip_grad_norm(model.parameters(), args.grad_clip)
            optimizer.step()
            elapsed += time.perf_counter() - began
            pending.append((step + 1, step_loss, lr, elapsed))
            progress.update(1)
            done = step + 1
            if done % args.log_every == 0 or done == args.steps:
                log_pending()
            if done % args.eval_every == 0 or done == args.steps:
                log_pending()
                val_loss = evaluate(model, val, args.batch_size, args.eval_windows, group)
                if group.main:
                    append_metrics(run_dir, {"step": done, "val_loss": val_loss,
                                             "val_perplexity": math.exp(val_loss), "elapsed": round(elapsed, 2)})
                progress.write(f"step {done}: validation loss {val_loss:.4f}, perplexity {math.exp(val_loss):.1f}")
            if done % args.save_every == 0 or done == args.steps:
                checkpoint(done)
            if group.any(interrupt.requested):  # Ctrl-C may reach the ranks in different steps
                path = checkpoint(done)
                print(f"\ninterrupted after step {done}; checkpoint {path}\n"
                      f"resume with: {group.command('train.pretrain')} --resume {run_dir}")
                group.exit_together(130)
    if group.main:
        report(model, tokenizer, train_ids, val_ids, run_dir, args, elapsed)


def report(model, tokenizer, train_ids, val_ids, run_dir, args, elapsed):
    """The closing lines: validation perplexity beside the unigram baseline, a sample, the files."""
    val = read_metrics(run_dir)
    last = [m for m in val if "val_loss" in m][-1]
    baseline = data.unigram_perplexity(train_ids, val_ids, tokenizer.vocab_size)
    print(f"\ntrained {args.steps} steps in {elapsed / 60:.1f} min of compute")
    print(f"validation perplexity {last['val_perplexity']:.1f} (unigram baseline {baseline:.1f})")
    from tinygpt.generation import generate

    prompt = tokenizer.encode("The ")
    sample = generate(model.eval(), prompt, args.sample_tokens, temperature=0.8, top_k=40, seed=args.seed)
    print(f"sample: {tokenizer.decode(prompt + sample)!r}")
    plot = plot_metrics(run_dir)
    print(f"run folder: {run_dir}" + (f" (loss curve: {plot})" if plot else ""))


if __name__ == "__main__":
    main()
