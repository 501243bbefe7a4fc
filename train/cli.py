"""What the command-line modules share: argument types that say what they expect, and opening a run."""
import argparse
import json
import math

from autograd import backend

from .run import load_run


class Help(argparse.ArgumentDefaultsHelpFormatter):
    """--help that shows a default only where there is one."""

    def _get_help_string(self, action):
        return action.help if action.default in (None, False) else super()._get_help_string(action)


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


def open_run(parser, run, device):
    """(model, tokenizer) of a run on a device; a problem with either is a usage error naming it."""
    try:
        device = backend.parse_device(device)
    except (ValueError, RuntimeError) as error:
        parser.error(f"--device: {error}")
    try:
        return load_run(run, device)
    except (OSError, ValueError) as error:
        parser.error(f"--run: {error}")


def write_results(args, results):
    """Write an evaluation's results, with the run and data they came from, to --json if given."""
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"run": args.run, "data": args.data, **results}, f, indent=2)
