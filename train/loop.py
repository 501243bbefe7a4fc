"""The phases that train.pretrain and train.finetune share: start or resume, one optimizer step,
checkpoint, and stop on Ctrl-C or on a loss that is no longer a number.

Each module writes its own loop from these, nanoGPT-style: its batches, its losses, its log
lines and its evaluation stay in the module; what a run does the same way in both lives here.
"""

import argparse
import json
import math
import os
import signal
import sys
import time

from tqdm import tqdm

from autograd import backend
from autograd.optim import clip_grad_norm

from .checkpoint import checkpoint_steps, find_checkpoint, load_checkpoint, save_checkpoint
from .run import (
    append_metrics,
    read_config,
    read_metrics,
    rewrite_metrics,
    run_folder_of,
    save_tokenizer,
    write_config,
)

NOT_SETTINGS = ("resume", "out", "device", "distributed")  # flags of one invocation, not of the run


class Interrupt:
    """Turns the first Ctrl-C into a request to stop after the current step; a second one kills."""

    def __init__(self):
        self.requested = False
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame):
        self.requested = True
        signal.signal(signal.SIGINT, signal.default_int_handler)


# ----- start or resume ---------------------------------------------------------------------------
def resumed_args(parser, args, keep=("device",)):
    """(args, run folder, model config) of the run that --resume names: the settings it was
    started with, --resume as its checkpoint, and the flags in `keep` as given now where given."""
    try:
        checkpoint = find_checkpoint(args.resume)
        run_dir = run_folder_of(checkpoint)
        config, settings = read_config(run_dir)
    except (ValueError, OSError) as error:
        parser.error(f"--resume: {error}")
    given_now = {name: getattr(args, name) for name in keep if getattr(args, name) is not None}
    resumed = argparse.Namespace(**{**vars(args), **settings, **given_now, "resume": checkpoint})
    return resumed, run_dir, config


def start_job(parser, args, group, parts_per_rank=1):
    """This rank's device, once the ranks agree on the command line and the global batch splits
    into parts_per_rank equal parts on every rank; a problem is a usage error."""
    # ranks started with other flags would wait for each other at different places
    group.check_same("command line", json.dumps(vars(args), sort_keys=True).encode())
    if args.batch_size % (group.size * parts_per_rank):
        parts = f" x --grad-accum {parts_per_rank}" if parts_per_rank > 1 else ""
        parser.error(
            f"--batch-size {args.batch_size} (the global batch) does not split evenly over "
            f"{group.size} ranks{parts}"
        )
    try:
        return group.device(args.device)
    except (ValueError, RuntimeError) as error:
        parser.error(f"--device: {error}")


def settings_of(args):
    """The settings a run's config.json keeps: every flag but those of one invocation."""
    return {name: value for name, value in vars(args).items() if name not in NOT_SETTINGS}


class LossLog:
    """The training losses of the steps since the last log line. They stay on the device until
    `write` brings them all to the host at once, so that a step on a GPU never waits for the host.

    Each rank adds its share of a step's losses, weighted so that the shares of all ranks add up
    to the whole batch's; `write` adds them up over the ranks.
    """

    def __init__(self, run, unit):
        self.run, self.rate_name = run, f"{unit}_per_s"  # unit: what the rate counts, e.g. tokens
        self.pending = []  # (step, {name: this rank's share, an array}, items in the batch, fields)
        self.since = time.perf_counter()

    def add(self, step, losses, items, **fields):
        """One step's losses {name: array or number}, the items (tokens, examples) of its whole
        batch, and the other fields of its line in metrics.jsonl (the learning rate, ...)."""
        self.pending.append((step, losses, items, {**fields, "elapsed": round(self.run.elapsed, 3)}))

    def write(self, progress):
        """Log the pending steps to metrics.jsonl and the progress bar; stop on a NaN or inf."""
        if not self.pending:
            return
        steps, losses, items, fields = zip(*self.pending)
        names = list(losses[0])
        xp = backend.get_array_module(*(value for step_losses in losses for value in step_losses.values()))
        shares = xp.stack(
            [xp.asarray(step_losses[name], dtype=xp.float64) for step_losses in losses for name in names]
        )
        totals = self.run.group.sum(backend.to_host(shares)).reshape(len(steps), len(names))  # the one read
        for step, row in zip(steps, totals):
            for value in row:
                self.run.stop_if_diverged(value, step)
        now = time.perf_counter()
        rate = sum(items) / (now - self.since)
        for step, row, step_fields in zip(steps, totals, fields):
            record = {
                "step": step,
                **dict(zip(names, row.tolist())),
                **step_fields,
                self.rate_name: round(rate, 1),
            }
            if self.run.group.main:
                append_metrics(self.run.dir, record)
        progress.set_postfix(
            loss=f"{record['loss']:.3f}", lr=f"{record['lr']:.2e}", **{self.rate_name: f"{rate:,.0f}"}
        )
        self.pending, self.since = [], now


def progress_bar(total, start, description, group):
    """The run's progress in steps, drawn by rank 0 alone."""
    return tqdm(
        total=total, initial=start, desc=description, unit="step", dynamic_ncols=True, disable=not group.main
    )


# ----- the run ------------------------------------------------------------------------------------
class Run:
    """A training run under way: its folder, the job's ranks, the model and its optimizer, and
    the compute time so far (saved with every checkpoint)."""

    def __init__(self, run_dir, group, model, optimizer, keep_checkpoints, module):
        self.dir, self.group, self.model, self.optimizer = run_dir, group, model, optimizer
        self.keep_checkpoints, self.module = keep_checkpoints, module
        self.elapsed = 0.0
        self.interrupt = Interrupt()

    def restore(self, parser, checkpoint):
        """Load the weights, Adam's state and the compute time of `checkpoint`; drop the metrics
        written after it. Returns its step, where the loop goes on."""
        try:
            state = load_checkpoint(checkpoint, self.model, self.optimizer)
        except (ValueError, OSError) as error:
            parser.error(f"--resume: {error}")
        if state.get("world_size", self.group.size) != self.group.size:
            parser.error(
                f"--resume: {checkpoint} was written by {state['world_size']} ranks; resume it with "
                f"as many (this job has {self.group.size})"
            )
        self.elapsed = state["elapsed"]
        if self.group.main:
            rewrite_metrics(self.dir, [m for m in read_metrics(self.dir) if m["step"] <= state["step"]])
        print(f"resuming {self.dir} at step {state['step']}")
        return state["step"]

    def begin(self, config, tokenizer, args, **settings):
        """Write a new run's folder: its tokenizer, and config.json with the model config, the
        run's flags and `settings` (rank 0 writes). Returns 0, the step where the loop starts."""
        if self.group.main:
            os.makedirs(self.dir, exist_ok=True)
            save_tokenizer(tokenizer, self.dir)
            write_config(self.dir, config, {**settings_of(args), **settings})
        return 0

    def announce(self, config, device):
        """Print the run folder and the model it trains."""
        ranks = f", one of {self.group.size} ranks" if self.group.size > 1 else ""
        shape = f"{config.n_layer} layers, {config.n_embd} wide, {config.n_head} heads, n_ctx {config.n_ctx}"
        size = f"vocab {config.vocab_size}: {self.model.num_parameters():,} parameters"
        print(f"run folder: {self.dir}\nmodel: {shape}, {size} on {device}{ranks}")

    def optimizer_step(self, lr, weight, grad_clip):
        """Sum the ranks' gradients, each rank's times `weight`; clip their global norm to
        grad_clip (0: no clipping); move the weights at rate lr."""
        params = self.optimizer.params
        self.group.reduce_gradients(params, weight)
        if grad_clip > 0:
            clip_grad_norm(params, grad_clip)
        self.optimizer.lr = lr
        self.optimizer.step()

    def save(self, step):
        """Write a checkpoint of `step` (rank 0; the other ranks pass); returns its folder."""
        if not self.group.main:
            return None
        state = {"elapsed": self.elapsed, "world_size": self.group.size}
        try:
            return save_checkpoint(
                self.dir, step, self.model, self.optimizer, state, keep=self.keep_checkpoints
            )
        except OSError as error:
            sys.exit(
                f"could not write a checkpoint in {self.dir}/checkpoints: {error}; the last good one is kept"
            )

    def stop_if_diverged(self, loss, step):
        """End the job, naming the step and the last good checkpoint, when `loss` is NaN or inf."""
        if math.isfinite(loss):
            return
        steps = checkpoint_steps(self.dir)
        good = os.path.join(self.dir, "checkpoints", str(steps[-1])) if steps else "none yet"
        self.group.exit_together(
            f"the loss became {loss} at step {step}: stopping; last good checkpoint: {good}"
        )

    def stop_interrupted(self, step, checkpoint, progress):
        """After a Ctrl-C (which every rank has agreed on) and the checkpoint saved for it: say how
        to resume, and end the job with status 130."""
        progress.close()
        print(
            f"\ninterrupted after step {step}; checkpoint {checkpoint}\n"
            f"resume with: {self.group.command(self.module)} --resume {self.dir}"
        )
        self.group.exit_together(130)
