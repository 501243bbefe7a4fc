"""What both tokenizers share: the vocabulary, the special tokens, the merges and the word cache.

A tokenizer here maps ordinary tokens (BPE pieces, spelled as its files spell them) and special
tokens (task markers such as `_start_`, looked up by name) to ids 0 .. vocab_size - 1. Encoding
cuts text into words and runs BPE on each word; a subclass says how words are cut and merged
(`encode`, `_encode_word`) and how ids become text again (`decode`). Since a text repeats the
same words over and over, each word's ids are worked out once and then remembered.
"""

import numbers
from collections.abc import Iterable
from itertools import chain

from .merges import Merges
from .text import mend_surrogates

SPECIAL_TOKENS = ("_start_", "_delimiter_", "_classify_")  # the paper's task tokens, in id order
CACHE_LIMIT = 200_000  # words remembered by encode (and those of one text) before the cache is emptied
MERGES_HEADER = "#version: 0.2"  # the first line of a merges file


def ids_after(vocab, names):
    """{name: id} giving the special tokens `names` the ids right after the ordinary `vocab`."""
    return {name: len(vocab) + i for i, name in enumerate(names)}


def check_made_by_merges(tokens, merges, is_symbol, merges_path):
    """Each token that is not a base symbol must be what some merge makes; one that is not means
    the merges file is cut short, empty, or another tokenizer's (a ValueError naming it)."""
    made = {left + right for left, right in merges}
    for token in tokens:
        if token not in made and not is_symbol(token):
            raise ValueError(
                f"{merges_path}: no merge makes the token {token!r} of the vocabulary "
                f"({len(merges)} merges; are the two files of one tokenizer?)"
            )


class Tokenizer:
    """A BPE vocabulary with special tokens; subclasses add how text is cut, merged and decoded."""

    def __init__(self, vocab, merges, special_tokens):
        """vocab: {token: id} for ordinary tokens. merges: [(left, right)] in rank order.
        special_tokens: {name: id}. Together the ids must be exactly 0 .. vocab_size - 1."""
        clashes = sorted(set(special_tokens) & set(vocab))
        if clashes:
            raise ValueError(f"special tokens {clashes} are also ordinary tokens")
        self._token_to_id = dict(vocab)
        self._special_tokens = dict(special_tokens)
        self._merges = [tuple(pair) for pair in merges]
        self._apply_merges = Merges(self._merges).apply
        ids = sorted([*self._token_to_id.values(), *self._special_tokens.values()])
        if ids != list(range(len(ids))):
            raise ValueError(f"the token ids (ordinary and special) must be 0 .. {len(ids) - 1}, each once")
        self._id_to_token = [None] * len(ids)
        for token, token_id in [*self._token_to_id.items(), *self._special_tokens.items()]:
            self._id_to_token[token_id] = token
        self._cache = {}  # word -> its ids

    # -- looking things up ---------------------------------------------------------------------

    @property
    def vocab_size(self):
        """Ordinary tokens plus special tokens (40,481 for GPT-1's files)."""
        return len(self._id_to_token)

    @property
    def special_tokens(self):
        """{name: id} of the special tokens."""
        return dict(self._special_tokens)

    @property
    def merges(self):
        """[(left, right)] in rank order."""
        return list(self._merges)

    def token_to_id(self, token):
        """Id of an ordinary token ('Ġthe' in byte-level BPE, 'the</w>' in GPT-1's) or of a
        special token's name; KeyError for anything else."""
        if token in self._special_tokens:
            return self._special_tokens[token]
        return self._token_to_id[token]

    def id_to_token(self, token_id):
        return self._id_to_token[token_id]

    # -- encoding ------------------------------------------------------------------------------

    def encode_ordinary(self, text):
        """Text -> ids, with the names of special tokens in it read as text (tiktoken's
        encode_ordinary): how a corpus's documents are encoded, so that no text forges a task token."""
        return self.encode(text, special_tokens=False)

    def encode_batch(self, texts):
        if isinstance(texts, str):
            raise TypeError("encode_batch: texts must be a list of str, not one str (encode takes one)")
        return [self.encode(text) for text in texts]

    @staticmethod
    def _checked_text(text):
        """`text` as UTF-8 can spell it (a TypeError where it is no str): a string can hold halves of
        UTF-16 surrogate pairs, which UTF-8 cannot; a pair becomes its character and a lone half
        U+FFFD, as GPT-1's unicode fix (ftfy) and tiktoken mend them."""
        if not isinstance(text, str):
            hint = " (decode bytes to str first)" if isinstance(text, (bytes, bytearray)) else ""
            raise TypeError(f"encode: text must be a str, not {type(text).__name__}{hint}")
        return mend_surrogates(text)

    def _encode_words(self, words):
        """The ids of pre-tokenized words, one after the other; each new word goes through
        _encode_word once and is then taken from the cache."""
        if len(self._cache) > CACHE_LIMIT:
            self._cache.clear()
        for word in set(words).difference(self._cache):
            self._cache[word] = self._encode_word(word)
        return list(chain.from_iterable(map(self._cache.__getitem__, words)))

    def _encode_word(self, word):
        """One pre-tokenized word -> its ids (the BPE each subclass does its own way)."""
        raise NotImplementedError

    def _look_up(self, table, ids):
        """[table[id] for id in ids], where table has one entry per id; an id outside the
        vocabulary raises a ValueError (a negative one would otherwise index from the end), and
        anything but a list of integers a TypeError."""
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
            raise TypeError(f"decode: ids must be a list of integer token ids, not {type(ids).__name__}")
        entries = []
        for token_id in ids:
            if isinstance(token_id, bool) or not isinstance(token_id, numbers.Integral):
                raise TypeError(f"decode: token id {token_id!r} is not an integer")
            if not 0 <= token_id < len(table):
                raise ValueError(f"token id {token_id} is outside the vocabulary (size {self.vocab_size})")
            entries.append(table[token_id])
        return entries

    # -- files ---------------------------------------------------------------------------------

    def _write_merges(self, path):
        """Write the merges as `merges.txt` / `vocab_40000.bpe` hold them: a version line, then
        one 'left right' a line."""
        lines = [MERGES_HEADER] + [f"{left} {right}" for left, right in self._merges]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
