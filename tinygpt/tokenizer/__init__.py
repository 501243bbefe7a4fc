"""Tokenizers: a byte-level BPE you train on your own text, and GPT-1's original tokenizer."""

import os

from .base import SPECIAL_TOKENS, Tokenizer
from .bpe import BPETokenizer
from .gpt1 import GPT1Tokenizer

__all__ = ["SPECIAL_TOKENS", "BPETokenizer", "GPT1Tokenizer", "Tokenizer", "load_tokenizer"]


def load_tokenizer(directory):
    """A tokenizer from a folder: GPT-1's original files if they are there, else byte-level BPE."""
    if os.path.isfile(os.path.join(directory, GPT1Tokenizer.FILES[0])):
        return GPT1Tokenizer.from_folder(directory)
    if not os.path.isfile(os.path.join(directory, "vocab.json")):
        expected = f"vocab.json + merges.txt, or {' + '.join(GPT1Tokenizer.FILES)}"
        raise FileNotFoundError(f"{directory}: no tokenizer here (expected {expected})")
    return BPETokenizer.load(directory)
