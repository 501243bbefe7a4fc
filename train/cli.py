"""What the command-line modules share: argument types that say what they expect, the arguments that
name a run and a device, the checks made before any work, the subcommands of train.evaluate, opening
a run, reading a task's file and writing results."""

import argparse
import codecs
import contextlib
import functools
import json
import math
import os
import signal
import sys
import tempfile
import warnings

import numpy as np

from autograd import backend
from autograd.precision import POLICIES
from autograd.serialization import SafetensorsError
from tinygpt import GPTConfig, weights
from tinygpt.files import UndecodableFiles, check_apart, write_whole
from tinygpt.tokenizer import SPECIAL_TOKENS

from . import SIGNALS, begin_command, task_files, tasks
from .distributed import launch_ranks
from .run_folder import RUN_FILES, in_a_run, load_run

_returns = []  # the ExitStack of each command under way, innermost last (see command)
GPT1_VOCAB_SIZE = 40481  # GPT-1's tokenizer: 40,478 tokens and the 3 special ones


class Help(argparse.ArgumentDefaultsHelpFormatter):
    """--help that adds "(default: X)" where there is a default; an option without one (None) says
    in its help what leaving it out does."""

    def _get_help_string(self, action):
        no_default = action.default is None or action.default is False  # 0 is a default, though 0 == False
        return action.help if no_default else super()._get_help_string(action)


class RawDescriptionHelp(argparse.RawDescriptionHelpFormatter, Help):
    """Help that keeps the description's own line breaks."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage error is one line (status 2): a long command's usage block
    would bury it; --help shows the usage."""

    def error(self, message):
        self.exit(2, shown(f"{self.prog}: error: {message}\n"))

    def parse_args(self, args=None, namespace=None):
        self.argv = args  # the command line (None: sys.argv's), for lifecycle.flags_given
        return super().parse_args(args, namespace)


def shown(text):
    """Text to print: a name that is not UTF-8 (a lone surrogate, from undecodable bytes) escaped."""
    return text.encode(errors="backslashreplace").decode()


def grouped_parser(prog, description, groups):
    """A Parser whose --help lists the arguments under titles: `groups` maps each title to a
    function that adds its arguments."""
    parser = Parser(prog=prog, description=description, formatter_class=Help)
    for title, add_arguments in groups.items():
        add_arguments(parser.add_argument_group(title))
    return parser


def add_precision_argument(group):
    """--precision: the policy a run's steps follow (autograd/precision.py)."""
    policies = "bf16: activations and matrix products in bfloat16, weights and statistics in float32; "
    policies += "tf32: a GPU's float32 matrix products on TF32 tensor cores"
    group.add_argument("--precision", default="fp32", choices=POLICIES, help=policies)


def argument_type(convert, holds, requirement):
    """An argparse type: `convert` the text, then check that `holds(value)`; a failure is a usage
    error that says what the argument must be."""

    def parse(text):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not holds(value):
            raise argparse.ArgumentTypeError(f"must be {requirement}, got {text!r}")
        return value

    return parse


non_negative_int = argument_type(int, lambda n: n >= 0, "an integer >= 0")
positive_int = argument_type(int, lambda n: n >= 1, "an integer >= 1")
temperature = argument_type(float, lambda t: 0 <= t < math.inf, "a finite number >= 0 (0 is greedy)")
probability = argument_type(float, lambda p: 0 < p <= 1, "a number in (0, 1]")
positive_float = argument_type(float, lambda x: 0 < x < math.inf, "a finite number > 0")
non_negative_float = argument_type(float, lambda x: 0 <= x < math.inf, "a finite number >= 0")
fraction = argument_type(float, lambda p: 0 <= p < 1, "a number in [0, 1)")
finite_float = argument_type(float, math.isfinite, "a finite number")
seed = argument_type(int, lambda n: 0 <= n < 2**64, "an integer in [0, 2^64)")  # dropout's masks take 64 bits


SMALLEST_VOCAB = 256 + 3  # a byte-level BPE's 256 bytes and the paper's three task tokens
vocab_size = argument_type(
    int, lambda n: n >= SMALLEST_VOCAB, f"an integer >= {SMALLEST_VOCAB} (256 bytes + the special tokens)"
)
held_out = argument_type(float, lambda p: 0 < p < 1, "a number in (0, 1)")


def utf8_text(value):
    """value itself, where it is text: a lone surrogate (bytes of argv that did not decode) is not."""
    value.encode()  # a UnicodeEncodeError, a ValueError, for a lone surrogate
    return value


text = argument_type(utf8_text, lambda _: True, "text (bytes that do not decode are not text)")
path = argument_type(str, bool, "a path, not empty (an unset shell variable?)")


def device_name(text):
    """An argparse type for --device: a name autograd.backend.parse_device takes on this machine
    (cuda needs CuPy and a GPU), kept as given: 'auto' and 'cuda' pick each rank's GPU later."""
    try:
        backend.parse_device(text)
    except (ValueError, RuntimeError) as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def command(parse, ranks=False):
    """The decorator that makes every command module's main(argv=None) of body(parser, args), where
    (parser, args) = parse(argv); with `ranks`, body(parser, args, group) runs as one rank of
    --distributed's job (distributed.launch_ranks). See _commanding for how main ends."""

    def decorate(body):
        @functools.wraps(body)
        def main(argv=None):
            with _commanding(body.__module__):
                parser, args = parse(argv)
                return launch_ranks(parser, args, body) if ranks else body(parser, args)

        return main

    return decorate


@contextlib.contextmanager
def _commanding(module):
    """Around a command's work (`module`: the command's): a Ctrl-C that no training loop catches
    (lifecycle.Interrupt) ends it with one line and status 130 (128 + SIGINT, as a shell reports
    it); an OSError (a path that cannot be read or written) or a SafetensorsError (a weights file not
    whole) that no check caught, with one line, status 1 (other errors are bugs). A warning is one
    line too: what and why, not the line of code that gave it. When it ends, SIGNALS' handlers are
    put back and what on_return was given is let go (the run folder held), so that a caller in Python
    (a test, a notebook) gets its process back as it was."""
    try:
        begin_command()
        with warnings.catch_warnings(), names_printed_escaped(), contextlib.ExitStack() as stack:
            warnings.showwarning = lambda message, *where, **_: print(f"warning: {message}", file=sys.stderr)
            for number in SIGNALS:
                previous = signal.getsignal(number)
                if previous is not None:  # None: set outside Python, and not to be put back from it
                    stack.callback(signal.signal, number, previous)
            _returns.append(stack)
            stack.callback(_returns.pop)
            yield
    except (OSError, SafetensorsError) as error:
        prog = getattr(sys.modules[module].__spec__, "name", module)
        sys.exit(shown(f"python -m {prog}: error: {error}"))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(128 + signal.SIGINT)


def on_return(callback, *args):
    """Call callback(*args) when the command under way returns (see command); outside one, never."""
    if _returns:
        _returns[-1].callback(callback, *args)


@contextlib.contextmanager
def reading(parser, flag):
    """Around reading the files that `flag` gives: a file that does not decode, cannot be read or is
    refused (an OSError, a ValueError) is a usage error that names `flag` (an OSError as "path: what
    went wrong") and, where the error names skip_bad_rows=True, the flag --skip-bad-rows."""
    try:
        yield
    except UndecodableFiles as error:
        parser.error(f"{flag}: {error.advice(flags=True)}")
    except ChildProcessError:  # a worker's death: no fault of the files
        raise
    except (OSError, ValueError) as error:
        if isinstance(error, OSError) and error.filename is not None and error.strerror:
            missing = isinstance(error, FileNotFoundError)
            message = f"{error.filename}: {'no such file or folder' if missing else error.strerror}"
        else:
            message = str(error).replace("skip_bad_rows=True", "--skip-bad-rows")
        parser.error(f"{flag}: {message}")


@contextlib.contextmanager
def names_printed_escaped():
    """Within it a path that is not UTF-8 (a lone surrogate, from undecodable bytes) prints escaped,
    as stderr prints it anyway, rather than stopping the command when it says what it wrote."""
    stdout = sys.stdout
    before = stdout.errors if hasattr(stdout, "reconfigure") else None  # a StringIO takes any text
    if before:
        stdout.reconfigure(errors="backslashreplace")
    try:
        yield
    finally:
        if before:
            stdout.reconfigure(errors=before)


@contextlib.contextmanager
def writing(parser, flag):
    """Around writing the file `flag` names (tinygpt.files.write_whole: whole or not at all): one that
    cannot be written (a full disk) ends the command in one line naming the flag and the file, status 1."""
    try:
        yield
    except OSError as error:
        why = f"{error.filename}: {error.strerror}" if error.filename and error.strerror else error
        parser.exit(1, shown(f"{parser.prog}: error: {flag}: {why}; nothing was written\n"))


def check_writable(parser, flag, path):
    """A usage error before any work where `path` (to write) cannot be: a name too long, a file above
    it, or the nearest of it and its folders read-only."""
    try:
        os.stat(path)
    except FileNotFoundError:
        pass
    except OSError as error:
        parser.error(f"{flag}: {error}")
    there = os.path.abspath(path)
    while not os.path.exists(there):
        there = os.path.dirname(there)
    if not os.access(there, os.W_OK):
        parser.error(f"{flag}: {path} cannot be written ({there} is read-only)")
    folder = there if os.path.isdir(there) else os.path.dirname(there)
    try:  # a folder that refuses new entries all the same (/proc, a full disk, a read-only mount)
        os.rmdir(tempfile.mkdtemp(prefix=".tinygpt-probe-", dir=folder))
    except OSError as error:
        parser.error(f"{flag}: {path} cannot be written (in {folder}: {error.strerror})")


def check_model(parser, args):
    """A usage error before any work where pretrain's model flags ask for a model GPTConfig refuses,
    or one whose training (weights, gradients, Adam's two moments) would not fit in this machine's
    memory, or where --init-from names nothing."""
    if args.init_from and not os.path.exists(args.init_from):
        parser.error(f"--init-from: {args.init_from}: no such run, checkpoint or folder")
    given = {name: getattr(args, name) for name in ("n_ctx", "n_layer", "n_embd", "n_head")}
    given = {name: value for name, value in given.items() if value is not None}
    flags = " ".join(f"--{name.replace('_', '-')} {value}" for name, value in given.items())
    flags = f"--preset {args.preset} {flags}".strip()
    # a BPE trained here may come out smaller than --vocab-size: the model is counted with its bytes alone
    vocab_size = GPT1_VOCAB_SIZE if args.gpt1_tokenizer else 256 + len(SPECIAL_TOKENS)
    try:
        config = GPTConfig.preset(args.preset, vocab_size=vocab_size, **given)
    except ValueError as error:
        parser.error(f"{flags}: {str(error).removeprefix('GPTConfig: ').split('; check ')[0]}")
    needed = 4 * config.n_parameters * np.dtype(args.dtype).itemsize
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if needed > memory:
        parser.error(
            f"{flags}: training {config.n_parameters:,} parameters takes {needed / 2**30:,.1f} GiB, "
            f"more than this machine's {memory / 2**30:,.1f} GiB of memory"
        )


def check_settings(parser, resume, settings, resolved=()):
    """A usage error where the settings in config.json of the run --resume names are not what the
    command line could have given: not an object, or a value its argument's type refuses. `resolved`:
    settings that a run saves once worked out, so never None."""
    if not isinstance(settings, dict):
        parser.error(f"--resume: the settings in the config.json of {resume} are not an object")
    for action in [a for a in parser._actions if a.dest in settings and a.dest != "device"]:  # may differ
        saved = settings[action.dest]
        if saved is None and action.default is None and action.dest not in resolved:
            continue  # an option left out
        several = action.nargs in ("*", "+")  # an option of several values saves a list
        for value in saved if several and isinstance(saved, list) else [saved]:
            if not setting_fits(action, value):
                why = f"the run's config.json has {action.dest} {value!r:.40}, not valid"
                parser.error(f"--resume: {tasks.unknown(value) if action.choices is tasks.TASKS else why}")


def setting_fits(action, value):
    """Whether a saved setting is a value its option could have given: its type's, among its choices."""
    kind = str if action.default is None or isinstance(action.default, list) else type(action.default)
    try:
        typed = action.type(str(value)) == value if action.type else type(value) is kind
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        return False
    return typed and value in (action.choices or [value])


def add_run_argument(parser):
    """--run, the run whose model a command loads (see open_run)."""
    parser.add_argument("--run", required=True, help="a run folder or one checkpoint folder in it")


def add_device_argument(parser):
    """--device, where the model runs (see open_run)."""
    where = "auto (a GPU if there is one), cpu, cuda or cuda:N"
    parser.add_argument("--device", type=device_name, default="auto", help=where)


def subcommand(name, add_arguments, **parser_options):
    """The decorator that makes body(parser, args) the command `name` of python -m train.evaluate: its
    parser starts with --run, add_arguments(parser) adds the rest (parser_options: help, description).
    The body gains add_to(commands), which evaluate's parser calls for each of its commands."""

    def decorate(body):
        def add_to(commands):
            parser = commands.add_parser(name, **{"formatter_class": Help, **parser_options})
            add_run_argument(parser)
            add_arguments(parser)
            parser.set_defaults(_subcommand=functools.partial(body, parser))  # a name no flag takes

        body.add_to = add_to
        return body

    return decorate


def add_figure_arguments(parser, batch_size, batched):
    """The arguments that close a command which runs a model over data and reports figures:
    --batch-size (`batch_size` of what is `batched` per forward pass), --device and --json."""
    per_pass = f"{batched} per forward pass"
    parser.add_argument("--batch-size", type=positive_int, default=batch_size, help=per_pass)
    add_device_argument(parser)
    json_help = "also write the figures to this JSON file (default: print them only)"
    parser.add_argument("--json", metavar="PATH", help=json_help)


def add_text_arguments(group):
    """--encoding and --errors: how a command decodes the text files it reads."""

    def encoding(name):
        try:
            b"a".decode(name, "ignore")  # a text encoding: base64 is a codec but not one
            return codecs.lookup(name).name  # one spelling for each: utf8 and UTF-8 are utf-8
        except LookupError:
            raise argparse.ArgumentTypeError(f"must be a Python text encoding, got {name!r}") from None

    group.add_argument("--encoding", type=encoding, default="utf-8", help="of the text files, e.g. latin-1")
    group.add_argument(
        "--errors",
        default="strict",
        choices=("strict", "replace", "ignore"),
        help="for bytes that do not decode: stop and name every such file, read them as U+FFFD, or drop them",
    )


def open_run(parser, run, device):
    """(model, tokenizer) of a run on a device, which becomes the current one (where the arrays
    that no input places go); a problem with either is a usage error naming it."""
    try:
        device = backend.parse_device(device)
    except (ValueError, RuntimeError) as error:
        parser.error(f"--device: {error}")
    backend.use_device(device)
    with reading(parser, "--run"):
        model, tokenizer = load_run(run, device)
    check_tokenizer_fits(parser, run, model.config.vocab_size, tokenizer)
    return model, tokenizer


def check_tokenizer_fits(parser, run, vocab_size, tokenizer):
    """A usage error where the run's model and its tokenizer do not go together: a checkpoint of
    another run, whose ids would read as other tokens (or past the table)."""
    if vocab_size != tokenizer.vocab_size:
        parser.error(
            f"--run: {run}: the model has {vocab_size:,} tokens and the run's tokenizer "
            f"{tokenizer.vocab_size:,}: the checkpoint is not of this run's tokenizer"
        )


def check_output_file(parser, flag, path, args):
    """A usage error before any work where the file `path` that `flag` names could not be written
    (its folder is missing, or see check_writable) or lands on an input (check_apart_from_inputs)."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.exists(folder) and not os.path.isdir(folder):
        parser.error(f"{flag}: {folder} is a file, not a folder")
    if not os.path.isdir(folder):
        parser.error(f"{flag}: the folder of {path} does not exist")
    check_writable(parser, flag, path)
    check_apart_from_inputs(parser, flag, path, args)


def add_task_file_arguments(parser):
    """--encoding, --errors, --skip-bad-rows and --special-tokens-as-text: how a command reads a
    task's file (train/task_files.py) and its text (tinygpt/transformations.py)."""
    add_text_arguments(parser)
    parser.add_argument("--skip-bad-rows", action="store_true", help="count and leave out malformed rows")
    add_special_tokens_argument(parser)


def add_special_tokens_argument(group):
    """--special-tokens-as-text (tinygpt/transformations.py)."""
    group.add_argument(
        "--special-tokens-as-text",
        action="store_true",
        help="read _start_, _delimiter_ and _classify_ in the examples as plain text (default: as the "
        "task's tokens that frame them; predict: as the run read them)",
    )


def read_task_file(parser, flag, task, path, args, labels=None, layout=None):
    """task_files.read of a file of `task` with --encoding, --errors and --skip-bad-rows (and the run's
    `labels` and `layout`); a file it refuses, or one without usable examples, is a usage error of
    `flag`."""
    with reading(parser, flag):
        dataset = task_files.read(task, path, labels, args.skip_bad_rows, args.encoding, args.errors, layout)
    if not dataset.examples:
        parser.error(f"{flag}: {path} holds no usable examples")
    if dataset.bad_rows:
        print(f"skipped {len(dataset.bad_rows)} bad rows, the first: {dataset.bad_rows[0]}")
    return dataset


def check_json_folder(parser, args):
    """A usage error before any work where --json, if given, could not be written or lands on an input."""
    if args.json:
        check_output_file(parser, "--json", args.json, args)


def check_apart_from_inputs(parser, flag, output, args):
    """A usage error where `output` is, holds or lies inside what an evaluation reads: --data, and of
    --run the weights, the files they depend on and the run's records (its folder may take new
    outputs, and predictions again)."""
    data = getattr(args, "data", None) or []
    inputs = [("--data", path) for path in (data if isinstance(data, list) else [data])]
    try:
        found = weights.weights_folder(args.run) if getattr(args, "run", None) else None
    except (OSError, ValueError):
        found = None  # loading the run names what is wrong with it
    if found:
        run = weights.run_of(found) or found
        records = [n for n in (*RUN_FILES, "tokenizer", "checkpoints", "best") if n != "predictions.tsv"]
        inputs += [("--run", os.path.join(run, name)) for name in (*weights.DEPENDENCIES, *records)]
        inputs.append(("--run", found))
    try:
        check_apart(output, inputs)
    except ValueError as error:
        parser.error(f"{flag}: {error}")
    if why := in_a_run(output):  # nor in another run's own folders
        parser.error(f"{flag}: {why}")


def write_results(parser, args, results):
    """Write an evaluation's results, with the run and data they came from, to --json if given."""
    if args.json:
        record = {"run": args.run, "data": args.data, **results}
        with writing(parser, "--json"):
            write_whole(args.json, json.dumps(record, indent=2).encode())
