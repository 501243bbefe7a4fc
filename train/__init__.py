"""The modules a user runs: python -m train.<module> (pretrain, prepare, finetune, evaluate, generate)."""

import signal
import sys

SIGNALS = (signal.SIGINT, signal.SIGTERM)  # those a command handles (lifecycle.Interrupt, prepare's workers)
_interrupted = []  # the Ctrl-Cs that came while the modules imported


def _defer(number, frame):
    """A Ctrl-C while a command's modules import (a second or two), kept for the command to act on as it
    begins: raised in the middle of an import, it may come out as another error (NumPy's C extension then
    says that its install is broken) or be lost."""
    _interrupted.append(number)


def begin_command():
    """Python's own Ctrl-C again (a KeyboardInterrupt), and one now where one came while the modules
    imported: cli.command then ends the command as any Ctrl-C, in one line, status 130."""
    if signal.getsignal(signal.SIGINT) is _defer:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if _interrupted:
        _interrupted.clear()
        raise KeyboardInterrupt


if sys.argv[:1] == ["-m"]:  # python -m train.<module>, while Python looks for the module
    signal.signal(signal.SIGINT, _defer)
