"""The modules a user runs: python -m train.<module> (pretrain, prepare, finetune, evaluate, generate)."""

import os
import sys

if sys.argv[:1] == ["-m"]:  # python -m train.<module>, while Python looks for the module

    def _interrupted_while_importing(kind, error, traceback, excepthook=sys.excepthook):
        """A Ctrl-C while a command's modules import (a second or two, before cli.command takes over)
        ends as it does later: the line "interrupted" and status 130 (128 + SIGINT), no traceback."""
        if not issubclass(kind, KeyboardInterrupt):
            return excepthook(kind, error, traceback)
        print("interrupted", file=sys.stderr, flush=True)
        os._exit(130)

    sys.excepthook = _interrupted_while_importing
