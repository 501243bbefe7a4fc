"""GPT-1's original tokenizer: the 40,478-entry BPE of `encoder_bpe_40000.json` + `vocab_40000.bpe`.

Encoding follows the original `TextEncoder` (finetune-transformer-lm's text_utils.py): fix broken
unicode, `text_standardize`, split into words like spaCy's English tokenizer, lower-case each
word, then BPE with `</w>` on the word's last symbol. Pieces missing from the vocabulary become id 0
(`<unk>`), as in the original. The paper's three task tokens follow the vocabulary: `_start_`,
`_delimiter_`, `_classify_` (ids 40478..40480).

The default `pretokenizer="builtin"` needs neither ftfy nor spaCy (see text.py);
`pretokenizer="spacy"` runs the real ftfy and spaCy when they are installed.
"""

import json
from pathlib import Path

from ..files import read_json, read_text
from .base import SPECIAL_TOKENS, Tokenizer, check_made_by_merges, ids_after
from .text import EnglishWordSplitter, fix_text, text_standardize

UNKNOWN_ID = 0
WORD_END = "</w>"


def read_encoder(path):
    """`encoder_bpe_40000.json` -> {piece: id}; ids must be exactly 0 .. n-1, with 0 for '<unk>'."""
    encoder = read_json(path)
    if not isinstance(encoder, dict) or not encoder:
        raise ValueError(f"{path}: expected a JSON object of piece -> id")
    for piece, token_id in encoder.items():
        if not piece or type(token_id) is not int:
            raise ValueError(f"{path}: entry {piece!r}: {token_id!r} is not the integer id of a piece")
    if sorted(encoder.values()) != list(range(len(encoder))):
        raise ValueError(f"{path}: ids are not exactly 0..{len(encoder) - 1}, each once")
    if encoder.get("<unk>", UNKNOWN_ID) != UNKNOWN_ID:
        raise ValueError(f"{path}: '<unk>' has id {encoder['<unk>']}, expected {UNKNOWN_ID}")
    return encoder


def read_merges(path, encoder):
    """`vocab_40000.bpe` -> [(left, right)] in rank order: a '#version' line, then one merge per
    line whose joined pieces must be in the encoder. Every piece of the encoder but the single
    characters (with or without `</w>`) and '<unk>' must be made by a merge."""
    lines = read_text(path).split("\n")
    if not lines[0].startswith("#version"):
        raise ValueError(f"{path}: line 1: expected a '#version' header, got {lines[0][:40]!r}")
    if lines[-1] == "":
        lines.pop()  # the newline that ends the file
    merges = []
    for number, line in enumerate(lines[1:], start=2):
        pair = tuple(line.split(" "))
        if len(pair) != 2 or not all(pair):
            raise ValueError(f"{path}: line {number}: expected two pieces and one space, got {line!r}")
        merged = "".join(pair)
        if merged not in encoder:
            raise ValueError(f"{path}: line {number}: the merged piece {merged!r} is not in the encoder")
        merges.append(pair)
    check_made_by_merges(encoder, merges, _is_symbol, path)
    return merges


def _is_symbol(piece):
    """A piece BPE starts from: one character, or one that ends a word, or '<unk>'."""
    return len(piece.removesuffix(WORD_END)) == 1 or piece == "<unk>"


def _spacy_pipeline():
    """The original's unicode fix and word split, from the real ftfy and spaCy."""
    try:
        import ftfy
        import spacy
    except ImportError as error:
        raise ImportError("pretokenizer='spacy' needs spaCy and ftfy: pip install spacy ftfy") from error
    spacy_tokenizer = spacy.blank("en").tokenizer  # spacy.load('en')'s tokenizer, without a model
    return ftfy.fix_text, lambda text: [token.text for token in spacy_tokenizer(text)]


class GPT1Tokenizer(Tokenizer):
    """Text <-> ids with GPT-1's vocabulary, exactly as the original encoder produced them."""

    def __init__(self, encoder, merges, pretokenizer="builtin"):
        """encoder: {piece: id} (ids 0..n-1); merges: [(left, right)] in rank order.
        pretokenizer: "builtin" (no extra packages) or "spacy" (uses spaCy and ftfy)."""
        if pretokenizer == "builtin":
            self._fix_text, self._split_words = fix_text, EnglishWordSplitter()
        elif pretokenizer == "spacy":
            self._fix_text, self._split_words = _spacy_pipeline()
        else:
            raise ValueError(f"pretokenizer must be 'builtin' or 'spacy', got {pretokenizer!r}")
        self.pretokenizer = pretokenizer
        super().__init__(encoder, merges, ids_after(encoder, SPECIAL_TOKENS))

    @classmethod
    def from_files(cls, encoder_json, merges_bpe, pretokenizer="builtin"):
        """Load `encoder_bpe_40000.json` and `vocab_40000.bpe`; errors name the file and line."""
        encoder = read_encoder(encoder_json)
        return cls(encoder, read_merges(merges_bpe, encoder), pretokenizer)

    FILES = ("encoder_bpe_40000.json", "vocab_40000.bpe")

    @classmethod
    def from_folder(cls, directory, pretokenizer="builtin"):
        """Load the two FILES from one folder (the original release's, or one that save() wrote)."""
        return cls.from_files(*(Path(directory) / name for name in cls.FILES), pretokenizer=pretokenizer)

    def save(self, directory):
        """Write the two files of the original release into `directory` (from_files reads them)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / self.FILES[0]).write_text(json.dumps(self._token_to_id), encoding="utf-8")
        self._write_merges(directory / self.FILES[1])

    # -- encoding and decoding -----------------------------------------------------------------

    def words(self, text):
        """The lower-cased words the original encoder would pass to BPE."""
        text = text_standardize(self._fix_text(self._checked_text(text)))
        return list(map(str.lower, self._split_words(text)))

    def encode(self, text):
        """Text -> ids (special tokens are not parsed out of text; add their ids yourself)."""
        return self._encode_words(self.words(text))

    encode_ordinary = encode  # it never reads special tokens in text

    def _encode_word(self, word):
        """BPE of one word, `</w>` on its last symbol."""
        pieces = self._apply_merges((*word[:-1], word[-1] + WORD_END))
        if " " in word:
            # The original joined the pieces with spaces and split them again; spaCy's newline
            # token "\n " comes out as "\n  </w>" that way, which it mapped to the piece "\n</w>".
            joined = " ".join(pieces)
            pieces = ["\n</w>"] if joined == "\n  </w>" else joined.split(" ")
        return [self._token_to_id.get(piece, UNKNOWN_ID) for piece in pieces]

    def decode(self, ids):
        """Ids -> text: the pieces joined, each `</w>` a space (lower case, spaced punctuation)."""
        return "".join(self._look_up(self._id_to_token, ids)).replace(WORD_END, " ").strip()
