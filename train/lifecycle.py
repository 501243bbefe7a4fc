"""A training run's lifecycle, the phases that train.pretrain and train.finetune share: start or
resume, one optimizer step, checkpoint, and stop on Ctrl-C, SIGTERM or a loss that is no longer a number.

Each module writes its own loop from these, nanoGPT-style: its batches, its losses, its log
lines and its evaluation stay in the module; what a run does the same way in both lives here.
"""

import argparse
import contextlib
import json
import math
import os
import signal
import sys
import time

from tqdm import tqdm

from autograd import backend
from autograd.optim import clip_grad_norm
from tinygpt import files
from tinygpt.weights import dependencies, weights_folder

from . import SIGNALS, cli
from .checkpoint import (
    check_checkpoint,
    checkpoint_steps,
    find_checkpoint,
    load_checkpoint,
    remove_partials,
    save_checkpoint,
)
from .run_folder import (
    append_metrics,
    check_free,
    check_new_run_folder,
    empty_run_folder,
    hold_folder,
    new_run_folder,
    plot_metrics,
    read_config,
    read_metrics,
    release_folder,
    rewrite_metrics,
    run_folder_of,
    save_tokenizer,
    set_aside,
    write_config,
)

# flags of one invocation, not of the run
NOT_SETTINGS = ("resume", "out", "device", "distributed", "overwrite", "allow_data_change")
# flags a resumed run may be given anew, besides those a module adds: they change no number of the run
ON_RESUME = ("resume", "device", "distributed", "allow_data_change", "log_every", "save_every")
ON_RESUME += ("keep_checkpoints",)
MAX_LOSS = math.log(sys.float_info.max)  # the largest loss whose perplexity is a float


class Interrupt:
    """Turns the first Ctrl-C (SIGINT) or SIGTERM into a request to stop after the current step, with
    a checkpoint; a second one ends the process at once. `requested`: the signal's number, or 0."""

    def __init__(self):
        self.requested = 0
        for number in SIGNALS:
            signal.signal(number, self._handle)

    def _handle(self, signum, frame):
        self.requested = signum
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def at_once(self):
        """From now on (the closing lines, once the last step is saved) a signal, or one that came since
        the last step's check, ends the command at once, status 128 + its number: nothing is left to save."""
        for number in SIGNALS:
            signal.signal(number, _end_at_once)
        if self.requested:
            _end_at_once(self.requested, None)


def _end_at_once(signum, frame):
    print(f"\ninterrupted ({signal.Signals(signum).name}); the run is complete", file=sys.stderr)
    raise SystemExit(128 + signum)


def perplexity(loss):
    """e ** loss; inf where that is past the largest float (a loss above MAX_LOSS)."""
    return math.inf if loss > MAX_LOSS else math.exp(loss)


@contextlib.contextmanager
def stop_on_os_error(run_dir):
    """Around a run's work: a file that cannot be written (a full disk, a read-only folder) ends it
    with one line naming the file, or the run folder where the error names none."""
    try:
        yield
    except OSError as error:
        sys.exit(f"{error.filename or run_dir}: {error.strerror or error}; the run stopped")


# ----- start or resume ---------------------------------------------------------------------------
def new_run(parser, args, group, name):
    """The folder of a new run, --out or runs/<name>-<date>-<time>: a usage error where a run holds
    it, or it is not empty, unless --overwrite (Training.begin empties it once every other check has
    passed)."""
    run_dir = args.out or new_run_folder(name)
    try:
        if group.main:
            check_free(run_dir)
            check_new_run_folder(run_dir, args.overwrite)
    except ValueError as error:
        parser.error(f"--out: {error}")
    return run_dir


def starting_weights(parser, path):
    """The weights folder that --init-from `path` names, said in one line: path itself where it holds
    weights, else the run's best/, else its newest checkpoint (the rule of GPT.from_pretrained); a
    usage error where there are none, or where the run's files changed since they were written."""
    try:
        folder = weights_folder(path)
    except (ValueError, OSError) as error:
        parser.error(f"--init-from: {error}")
    rule = "" if folder == path else " (of a run: its best/, else its newest checkpoint)"
    print(f"starting from the weights in {folder}{rule}")
    return folder


def resumed_args(parser, args, may_change=(), data=(), resolved=(), renamed=None):
    """(args, run folder, model config, saved settings) of the run that --resume names: the settings
    it was started with (`renamed` {old name: name}), --resume as its checkpoint, and the flags of
    ON_RESUME and `may_change` as given now. Any other flag given with another value than the run's
    is a usage error that names it; so are the `data` flags, unless --allow-data-change. A saved
    setting that the command line could not have given, or that is missing, is a usage error too
    (`resolved`: see cli.check_settings)."""
    try:
        checkpoint = find_checkpoint(args.resume)
        run_dir = run_folder_of(checkpoint)
        config, settings = read_config(run_dir)
    except (ValueError, OSError) as error:
        parser.error(f"--resume: {error}")
    cli.check_settings(parser, args.resume, settings, resolved)
    settings = {(renamed or {}).get(name, name): value for name, value in settings.items()}
    missing = sorted({*vars(args), "data_hash"} - {*NOT_SETTINGS, *ON_RESUME, *settings})
    if missing:
        path = os.path.join(run_dir, "config.json")
        parser.error(f"--resume: {path}: the setting {missing[0]} is missing (a resume takes no default)")
    try:
        check_checkpoint(checkpoint)
    except (ValueError, OSError) as error:
        parser.error(f"--resume: {error}")
    if args.overwrite:
        parser.error("--overwrite starts a new run: it does not go with --resume")
    given = flags_given(parser, args)
    free = {*ON_RESUME, *may_change, *(data if args.allow_data_change else ())}
    saved = {**settings, "out": run_dir}
    changed = [name for name in sorted(given - free) if getattr(args, name) != saved.get(name)]
    if changed:
        flags = ", ".join(
            f"--{n.replace('_', '-')} {show(getattr(args, n))} (the run's: {show(saved.get(n))})"
            for n in changed
        )
        advice = "leave them out, or start a new run"
        parser.error(f"--resume: {flags} would change the run in {run_dir}; {advice}")
    now = {name: getattr(args, name) for name in given & free}
    resumed = argparse.Namespace(**{**vars(args), **settings, **now, "resume": checkpoint})
    return resumed, run_dir, config, settings


def check_apart(parser, flag, output, args, names):
    """A usage error where `output` (what `flag` writes) is, holds or lies inside a path that one of
    the flags `names` of args gives, an input of the command (see tinygpt.files.check_apart)."""
    given = [(name, getattr(args, name, None)) for name in names]
    inputs = [(f"--{name.replace('_', '-')}", path) for name, paths in given for path in listed(paths)]
    try:
        files.check_apart(output, inputs)
    except ValueError as error:
        parser.error(f"{flag}: {error}")


def listed(value):
    """A flag's value as a list of its paths: none for None, the one path, or those of nargs."""
    return [] if value is None else value if isinstance(value, list) else [value]


def flags_given(parser, args):
    """The names of the flags the command line gives, whatever their values: it is parsed again
    onto a namespace that holds a marker for every name, which argparse keeps where no flag is given."""
    unset = object()
    probe = parser.parse_args(parser.argv, argparse.Namespace(**dict.fromkeys(vars(args), unset)))
    return {name for name, value in vars(probe).items() if value is not unset}


def show(value):
    """A flag's value as it is written on the command line."""
    return " ".join(map(str, value)) if isinstance(value, list) else "none" if value is None else value


def check_data(parser, args, digest):
    """A usage error where a resumed run's data, `digest` (a hash of it), is not what the run began
    on (settings' data_hash), unless --allow-data-change."""
    began_on = getattr(args, "data_hash", None)
    if args.resume and began_on not in (None, digest) and not args.allow_data_change:
        parser.error(
            f"--resume: the data is not what the run began on (its hash {digest[:12]}, the run's "
            f"{str(began_on)[:12]}): pass --allow-data-change to go on with it"  # str: a damaged config's
        )


def start_job(parser, args, group, parts_per_rank=1):
    """This rank's device, once the ranks agree on the command line and the global batch splits
    into parts_per_rank equal parts on every rank, and no other run holds the folder --resume names;
    a problem is a usage error."""
    try:
        if args.resume and group.main:
            check_free(run_folder_of(args.resume))
    except ValueError as error:
        parser.error(f"--resume: {error}")
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

    def __init__(self, training, unit):
        self.training, self.rate_name = training, f"{unit}_per_s"  # unit: what the rate counts, e.g. tokens
        self.pending = []  # (step, {name: this rank's share, an array}, items in the batch, fields)
        self.since = time.perf_counter()

    def add(self, step, losses, items, **fields):
        """One step's losses {name: array or number}, the items (tokens, examples) of its whole
        batch, and the other fields of its line in metrics.jsonl (the learning rate, ...)."""
        self.pending.append((step, losses, items, {**fields, "elapsed": round(self.training.elapsed, 3)}))

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
        totals = self.training.group.sum(backend.to_host(shares))  # the one read
        rows = [dict(zip(names, row)) for row in totals.reshape(len(steps), len(names)).tolist()]
        for step, row in zip(steps, rows):
            self.training.stop_if_diverged(row, step)
        now = time.perf_counter()
        rate = sum(items) / (now - self.since)
        for step, row, step_fields in zip(steps, rows, fields):
            record = {"step": step, **row, **step_fields, self.rate_name: round(rate, 1)}
            if self.training.group.main:
                append_metrics(self.training.dir, record)
        postfix = {"loss": f"{record['loss']:.3f}", "lr": f"{record['lr']:.2e}"}
        postfix[self.rate_name] = f"{rate:,.0f}"
        progress.set_postfix(postfix)
        if progress.lines:  # off a terminal: a plain line, with the time left at the rate since the last
            left = tqdm.format_interval((progress.total - steps[-1]) * (now - self.since) / len(steps))
            shown = ", ".join(f"{name.replace('_per_s', '/s')} {value}" for name, value in postfix.items())
            print(f"{progress.lines} step {steps[-1]}/{progress.total}: {shown}, ETA {left}", flush=True)
        self.pending, self.since = [], now


def progress_bar(total, start, description, group):
    """The run's progress in steps, shown by rank 0 alone: a tqdm bar on a terminal. Off one (a batch
    job's log, where the bar's redraws would pile up) its `lines` tell LossLog.write to print a plain
    line each time it logs, as nanoGPT does. TQDM_DISABLE turns both off."""
    shown, terminal = group.main and not os.environ.get("TQDM_DISABLE"), sys.stderr.isatty()
    disable = not (shown and terminal)
    bar = tqdm(total=total, initial=start, desc=description, unit="step", dynamic_ncols=True, disable=disable)
    bar.lines = description if shown and not terminal else None
    return bar


# ----- the training under way ---------------------------------------------------------------------
class Training:
    """A training run under way: its folder, the job's ranks, the model and its optimizer, and
    the compute time so far (saved with every checkpoint)."""

    def __init__(self, run_dir, group, model, optimizer, keep_checkpoints, module):
        self.dir, self.group, self.model, self.optimizer = run_dir, group, model, optimizer
        self.keep_checkpoints, self.module = keep_checkpoints, module
        self.elapsed, self.digests = 0.0, None
        self.interrupt = Interrupt()

    def restore(self, parser, checkpoint, last_step=None):
        """Load the weights, Adam's state and the compute time of `checkpoint` (a usage error where
        it is past last_step); remove what a killed process left half-written and the metrics after
        it, and set the checkpoints after it aside (run_folder.set_aside). Returns its step, where the loop
        goes on."""
        try:
            state = load_checkpoint(checkpoint, self.model, self.optimizer)
        except (ValueError, OSError) as error:
            parser.error(f"--resume: {error}")
        step = state["step"]
        if state.get("world_size", self.group.size) != self.group.size:
            parser.error(
                f"--resume: {checkpoint} was written by {state['world_size']} ranks; resume it with "
                f"as many (this job has {self.group.size})"
            )
        if last_step is not None and step > last_step:
            parser.error(f"--steps {last_step}: the run in {self.dir} is at step {step} already")
        self.elapsed = state.get("elapsed", 0.0)
        self.hold()
        if self.group.main:
            try:
                metrics = read_metrics(self.dir)
            except ValueError as error:
                parser.error(f"--resume: {error}")
            remove_partials(self.dir)
            set_aside(self.dir, step, [m for m in metrics if m["step"] > step])
            rewrite_metrics(self.dir, [m for m in metrics if m["step"] <= step])
        print(f"resuming {self.dir} at step {step}")
        return step

    def begin(self, config, tokenizer, args, **settings):
        """Write a new run's folder (emptied first with --overwrite): its tokenizer, and config.json
        with the model config, the run's flags and `settings` (rank 0 writes). Returns 0, the step
        where the loop starts."""
        self.hold(args.overwrite)
        if self.group.main:
            kept = empty_run_folder(self.dir) if args.overwrite else []
            if kept:
                more = f" and {len(kept) - 10} more" if len(kept) > 10 else ""
                print(f"--overwrite kept what no run writes in {self.dir}: {', '.join(kept[:10])}{more}")
            save_tokenizer(tokenizer, self.dir)
            write_config(self.dir, config, {**settings_of(args), **settings})
        return 0

    def hold(self, overwrite=None):
        """Hold the run folder until the command returns (rank 0, which alone writes it; see
        run_folder.hold_folder) and, for a new run (`overwrite` given), check again that it may go there: a
        run may have filled it since new_run. Where it may not, every rank ends with a usage error."""
        refused = None
        if self.group.main:
            os.makedirs(self.dir, exist_ok=True)
            try:
                descriptor = hold_folder(self.dir)
                cli.on_return(release_folder, self.dir, descriptor)
                if overwrite is not None:
                    check_new_run_folder(self.dir, overwrite)
            except ValueError as error:
                refused = f"python -m {self.module}: error: {error}"
        if self.group.any(refused):
            if refused:
                print(refused, file=sys.stderr)
            self.group.exit_together(2)

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
        """Write a checkpoint of `step` (rank 0; the other ranks pass); returns its folder. Weights
        that hold a NaN or an inf are not written: the run stops."""
        params = self.optimizer.params
        xp = backend.get_array_module(params[0].data)
        finite = backend.to_host(xp.stack([xp.isfinite(p.data).all() for p in params]).all())
        self.stop_if_diverged({"weights": 0.0 if finite else math.nan}, step)
        if not self.group.main:
            return None
        state = {"elapsed": self.elapsed, "world_size": self.group.size}
        try:
            keep, digests = self.keep_checkpoints, self.dependencies()
            return save_checkpoint(self.dir, step, self.model, self.optimizer, state, keep, digests)
        except OSError as error:
            where = f"{self.dir}/checkpoints"
            sys.exit(f"could not write a checkpoint in {where}: {error}; the last good one is kept")

    def dependencies(self):
        """The digests of the run's files its weights depend on (tinygpt.weights.dependencies),
        taken once, at its first checkpoint, and written with every checkpoint and best/."""
        if self.digests is None:
            self.digests = dependencies(self.dir)
        return self.digests

    def stop_if_diverged(self, values, step, together=True):
        """End the job, naming the step and the last good checkpoint, when a loss or metric of
        `values` {name: value} is NaN, infinite or past MAX_LOSS (its perplexity overflows), before
        anything of the step is saved. `together`: every rank calls this at this point, else the
        calling rank ends the job alone."""
        bad = [(name, value) for name, value in values.items() if not abs(value) <= MAX_LOSS]
        if not bad:
            return
        steps = checkpoint_steps(self.dir)
        good = os.path.join(self.dir, "checkpoints", str(steps[-1])) if steps else "none yet"
        (name, value), stop = bad[0], self.group.exit_together if together else sys.exit
        stop(f"the {name} became {value:.6g} at step {step}: stopping; last good checkpoint: {good}")

    def stop_interrupted(self, step, checkpoint, progress):
        """After a Ctrl-C or SIGTERM (which every rank has agreed on) and the checkpoint saved for
        it: say how to resume, and end the job with status 128 + the signal's number (130, 143)."""
        progress.close()
        if self.group.main:
            plot_metrics(self.dir)  # the loss curve of what is logged, as a finished run has it
        number = self.interrupt.requested or signal.SIGINT  # a rank the signal did not reach
        print(
            f"\ninterrupted after step {step} ({signal.Signals(number).name}); checkpoint {checkpoint}\n"
            f"resume with: {self.group.command(self.module)} --resume {self.dir}"
        )
        self.group.exit_together(128 + number)
