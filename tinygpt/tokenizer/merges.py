"""Applying learned BPE merges to one word, shared by both tokenizers."""

import sys
from itertools import repeat
from operator import add

_NEVER = sys.maxsize  # the rank of a pair no merge joins


class Merges:
    """Learned merges, applied to a word lowest-ranked pair first until no known pair is left.

    A word is held as the string of its pieces' one-character codes, as training holds it
    (bpe.learn_merges): a pair's rank is looked up by two characters, and a merge is str.replace,
    which joins each occurrence of the pair left to right, as BPE does."""

    def __init__(self, merges):
        """merges: [(left, right)] in rank order, rank 0 merged first."""
        self._code = {}  # piece -> its one-character code
        self._piece = []  # code -> piece
        self._pair = [self._code_of(left) + self._code_of(right) for left, right in merges]  # rank -> pair
        self._rank = {pair: rank for rank, pair in enumerate(self._pair)}
        self._made = [self._code_of(left + right) for left, right in merges]  # rank -> merged piece

    def _code_of(self, piece):
        """A piece's code; a piece seen for the first time (a symbol no merge knows) gets a new one."""
        code = self._code.get(piece)
        if code is None:
            code = self._code[piece] = chr(len(self._piece))
            self._piece.append(piece)
        return code

    def apply(self, symbols):
        """symbols: the strings (characters, or byte characters) a word is made of -> its pieces."""
        word = "".join([self._code.get(symbol) or self._code_of(symbol) for symbol in symbols])
        while len(word) > 1:
            rank = min(map(self._rank.get, map(add, word, word[1:]), repeat(_NEVER)))
            if rank == _NEVER:
                break
            word = word.replace(self._pair[rank], self._made[rank])
        return [self._piece[ord(code)] for code in word]
