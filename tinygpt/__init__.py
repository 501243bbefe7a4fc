"""GPT-1 built from the autograd engine."""

from .config import GPTConfig

__all__ = ["GPTConfig", "GPT"]


def __getattr__(name):
    """GPT, imported where it is first named (PEP 562): the tokenizers load without the engine, in
    the processes that only tokenize (train.prepare's workers: 0.35 s of imports, not 2.5)."""
    if name != "GPT":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .model import GPT

    return GPT


def __dir__():
    return [*globals(), "GPT"]  # named before it is imported, for completion
