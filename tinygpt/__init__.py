"""GPT-1 built from the autograd engine."""

from .config import GPTConfig
from .model import GPT

__all__ = ["GPTConfig", "GPT"]
