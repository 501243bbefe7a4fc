"""Tokenizers: a byte-level BPE you train on your own text, and GPT-1's original tokenizer."""

from .base import SPECIAL_TOKENS, Tokenizer
from .bpe import BPETokenizer
from .gpt1 import GPT1Tokenizer

__all__ = ["SPECIAL_TOKENS", "BPETokenizer", "GPT1Tokenizer", "Tokenizer"]
