"""Byte-level BPE: train on your own text, encode, decode, save and load in GPT-2's file layout.

Text is cut into words by a split regex (GPT-2's by default), each word is turned into its UTF-8
bytes, and learned merges join adjacent pieces, most frequent pair first. Because the 256 bytes
are the base vocabulary, every string can be encoded and decoded back exactly.

Bytes are written as printable characters with GPT-2's byte-to-unicode map (a space is 'Ġ', a
newline 'Ċ'), so `vocab.json` and `merges.txt` have the same layout as GPT-2's and load in other
byte-level BPE tools; special tokens (`_start_`, ...) get the last ids and are also listed in
`special_tokens.json`.

With `normalizer="gpt1"` every text is first prepared as GPT-1's encoder prepared it (unicode
fixed, words split like spaCy, lower case; see text.py) and `tokenizer_config.json` records it.
Decoding then gives that prepared text back, not the original.
"""

import heapq
import json
from array import array
from collections import Counter, defaultdict
from collections.abc import Mapping
from pathlib import Path

import regex

from ..files import read_json, read_text, read_text_files
from .base import MERGES_HEADER, SPECIAL_TOKENS, Tokenizer, check_made_by_merges, ids_after
from .text import GPT1Normalizer, mend_surrogates

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
NORMALIZERS = {"gpt1": GPT1Normalizer}
CONFIG_FILE = "tokenizer_config.json"  # written only when there is a normalizer


def _byte_to_char():
    """GPT-2's map: printable Latin-1 bytes stand for themselves, the other 68 get chr(256 + n)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    others = [byte for byte in range(256) if byte not in printable]
    char_of = {
        **{byte: chr(byte) for byte in printable},
        **{byte: chr(256 + n) for n, byte in enumerate(others)},
    }
    return [char_of[byte] for byte in range(256)]


BYTE_TO_CHAR = _byte_to_char()
CHAR_TO_BYTE = {char: byte for byte, char in enumerate(BYTE_TO_CHAR)}


def bytes_to_token(data):
    """Raw bytes -> the token string that spells them in the byte-to-unicode alphabet."""
    return data.decode("latin-1").translate(BYTE_TO_CHAR)  # Latin-1 turns byte b into chr(b)


def token_to_bytes(token):
    """The inverse of bytes_to_token."""
    return bytes(CHAR_TO_BYTE[char] for char in token)


# -- Training ---------------------------------------------------------------------------------------


def make_normalizer(name):
    """The text -> text function a normalizer's name stands for (None for None)."""
    if name is None:
        return None
    if name not in NORMALIZERS:
        raise ValueError(f"normalizer must be None or one of {sorted(NORMALIZERS)}, got {name!r}")
    return NORMALIZERS[name]()


def count_words(texts, pattern, special_tokens, normalize=None):
    """Split every text into words (mended as encode mends it: text.mend_surrogates; special tokens
    are cut out first and not counted, the rest goes through `normalize` if given) -> Counter."""
    split_regex = regex.compile(pattern)
    special_regex = _special_token_regex(special_tokens)
    counts = Counter()
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(f"training texts must be strings, got {type(text).__name__}")
        text = mend_surrogates(text)
        pieces = special_regex.split(text)[::2] if special_regex else [text]
        for piece in pieces:
            counts.update(split_regex.findall(normalize(piece) if normalize else piece))
    return counts


def learn_merges(word_counts, num_merges, on_merge=None):
    """Learn up to `num_merges` merges from (word, count) pairs, each word once; returns
    [(left bytes, right bytes)].

    Each step merges the pair with the highest count; ties go to the smallest pair in byte order
    (left bytes first, then right bytes), so the result does not depend on the order of the input.
    Words are counted once, each held as a string of token ids (chr(id); ids 0-255 are the bytes),
    so that a merge is str.replace. After each merge only the words that held the pair are
    rewritten, and only their pair counts change (an index pair -> words finds them). The best
    pair comes from a max-heap: a pair is made only by the merge of one of its halves and its
    count can only fall after that, so an entry's count is never below its pair's, and one popped
    too high is pushed again with the count the pair has now. Stops early when no pair is left
    (every word is a single token). `on_merge(1)`, if given, hears of each merge.
    """
    words, freqs = [], []
    for word, freq in word_counts:
        words.append(word.encode("utf-8").decode("latin-1"))
        freqs.append(freq)
    if not words:
        raise ValueError("the training corpus is empty: no text to learn from")
    token_bytes = [bytes([byte]) for byte in range(256)]

    pair_counts = defaultdict(int)  # "xy" -> count, for the ids x and y side by side
    words_with_pair = defaultdict(lambda: array("I"))  # may list a word twice, or one that lost it
    for index, (word, freq) in enumerate(zip(words, freqs)):
        for pair in map(str.__add__, word, word[1:]):
            pair_counts[pair] += freq
            words_with_pair[pair].append(index)

    def heap_entry(pair):
        return (-pair_counts[pair], token_bytes[ord(pair[0])], token_bytes[ord(pair[1])], pair)

    heap = [heap_entry(pair) for pair in pair_counts]
    heapq.heapify(heap)
    merges = []
    while heap and len(merges) < num_merges:
        negative_count, left_bytes, right_bytes, pair = heapq.heappop(heap)
        count = pair_counts.get(pair, 0)
        if count != -negative_count:  # the pair lost sites since this entry was pushed
            if count > 0:
                heapq.heappush(heap, heap_entry(pair))
            continue
        merges.append((left_bytes, right_bytes))
        if on_merge:
            on_merge(1)
        new = chr(len(token_bytes))
        token_bytes.append(left_bytes + right_bytes)

        made_pairs = set()
        for index in dict.fromkeys(words_with_pair.pop(pair)):  # each word once, in a fixed order
            words[index], lost, made = merge_word(words[index], pair, new)
            for lost_pair in lost:
                pair_counts[lost_pair] -= freqs[index]
                if not pair_counts[lost_pair]:  # no word holds it now
                    del pair_counts[lost_pair], words_with_pair[lost_pair]
            for made_pair in made:
                pair_counts[made_pair] += freqs[index]
                words_with_pair[made_pair].append(index)
            made_pairs.update(made)
        del pair_counts[pair]  # every occurrence merged
        for made_pair in made_pairs:
            if made_pair in pair_counts:  # not lost again at a later site
                heapq.heappush(heap, heap_entry(made_pair))
    return merges


def merge_word(word, pair, new):
    """(word with each `pair`, left to right, made `new`; the pairs lost; the pairs made). Around
    each `new` its neighbours' pairs change: x+left becomes x+new, right+y becomes new+y, and
    between two sites right+left becomes new+new."""
    merged = word.replace(pair, new)
    lost, made = [], []
    site = merged.find(new)
    while site >= 0:
        if site > 0:
            before = merged[site - 1]
            lost.append((pair[1] if before == new else before) + pair[0])
            made.append(before + new)
        if site + 1 < len(merged) and merged[site + 1] != new:
            lost.append(pair[1] + merged[site + 1])
            made.append(new + merged[site + 1])
        site = merged.find(new, site + 1)
    return merged, lost, made


# -- The tokenizer ----------------------------------------------------------------------------------


def _special_token_regex(special_tokens):
    """A regex that finds special tokens (longest first) and keeps them when used to split; or None."""
    if not special_tokens:
        return None
    names = sorted(special_tokens, key=lambda name: (-len(name), name))
    return regex.compile("(" + "|".join(regex.escape(name) for name in names) + ")")


class BPETokenizer(Tokenizer):
    """A byte-level BPE tokenizer: ids 0.. for ordinary tokens, then the special tokens."""

    def __init__(self, vocab, merges, special_tokens=None, pattern=GPT2_PATTERN, normalizer=None):
        """vocab: {token string: id} for ordinary tokens, in the byte-to-unicode alphabet.
        merges: [(left, right)] token strings in rank order. special_tokens: {name: id}.
        Together the ids must be exactly 0 .. vocab_size - 1 (a ValueError says when not).
        normalizer: None, or "gpt1" to prepare text as GPT-1 did before splitting it.
        """
        super().__init__(vocab, merges, special_tokens or {})
        self.normalizer = normalizer
        self._normalize = make_normalizer(normalizer)
        self.pattern = pattern
        self._split_regex = regex.compile(pattern)
        self._special_regex = _special_token_regex(self._special_tokens)
        self._id_to_bytes = [  # what decode writes for each id; a special token writes its name
            token.encode("utf-8") if token in self._special_tokens else token_to_bytes(token)
            for token in self._id_to_token
        ]

    @classmethod
    def train(cls, texts, vocab_size, special_tokens=SPECIAL_TOKENS, pattern=GPT2_PATTERN, normalizer=None):
        """Learn a vocabulary of `vocab_size` ids from an iterable of strings.

        Ids 0-255 are the bytes, then one id per merge in the order learned, then the special
        tokens. Special tokens found in the texts are cut out before counting. If the corpus runs
        out of pairs first, the vocabulary comes out smaller than asked.
        """
        if isinstance(texts, (str, bytes)):
            raise TypeError("BPETokenizer.train: texts must be an iterable of strings, not one string")
        special_tokens = list(special_tokens)
        if len(set(special_tokens)) != len(special_tokens) or not all(special_tokens):
            raise ValueError(f"special tokens must be distinct non-empty strings, got {special_tokens}")
        smallest = 256 + len(special_tokens)
        if vocab_size < smallest:
            raise ValueError(
                f"vocab_size={vocab_size} is too small: the 256 bytes and "
                f"{len(special_tokens)} special tokens alone need {smallest}"
            )
        word_counts = count_words(texts, pattern, special_tokens, make_normalizer(normalizer))
        return cls.train_from_counts(word_counts, vocab_size, special_tokens, pattern, normalizer)

    @classmethod
    def train_from_counts(
        cls,
        word_counts,
        vocab_size,
        special_tokens=SPECIAL_TOKENS,
        pattern=GPT2_PATTERN,
        normalizer=None,
        on_merge=None,
    ):
        """train() from {word: count}, or (word, count) pairs, the words as `pattern` cut them
        (count_words); a corpus counted in parts is the sum of the parts' counts. `on_merge(1)`
        hears of each merge."""
        special_tokens = list(special_tokens)
        smallest = 256 + len(special_tokens)
        pairs = word_counts.items() if isinstance(word_counts, Mapping) else word_counts
        merges = [
            (bytes_to_token(left), bytes_to_token(right))
            for left, right in learn_merges(pairs, vocab_size - smallest, on_merge)
        ]
        vocab = {char: byte for byte, char in enumerate(BYTE_TO_CHAR)}
        for left, right in merges:
            vocab[left + right] = len(vocab)
        return cls(vocab, merges, ids_after(vocab, special_tokens), pattern, normalizer)

    @classmethod
    def train_files(
        cls,
        paths,
        vocab_size,
        special_tokens=SPECIAL_TOKENS,
        pattern=GPT2_PATTERN,
        errors="strict",
        normalizer=None,
        encoding="utf-8",
    ):
        """train() on files: paths may be files, folders (all *.txt below) and globs, read as
        tinygpt.files.read_text_files reads them (all named at once where some do not decode)."""
        texts = read_text_files(paths, encoding, errors)
        return cls.train(texts, vocab_size, special_tokens, pattern, normalizer)

    # -- encoding and decoding -----------------------------------------------------------------

    def encode(self, text, special_tokens=True):
        """Text -> ids. Special tokens' names are matched whole (longest first) before the text
        between them is normalized and split; with special_tokens=False they are plain text.
        Surrogates are mended first, as by every tokenizer here (a lone one becomes U+FFFD).
        """
        ids = []
        text = self._checked_text(text)
        pieces = self._special_regex.split(text) if self._special_regex and special_tokens else [text]
        for position, piece in enumerate(pieces):
            if position % 2:  # split() puts the matched special tokens at odd positions
                ids.append(self._special_tokens[piece])
                continue
            if self._normalize:
                piece = self._normalize(piece)
            ids += self._encode_words(self._split_regex.findall(piece))
        return ids

    def _encode_word(self, word):
        """One pre-tokenized word -> ids: its UTF-8 bytes, merged."""
        symbols = tuple(bytes_to_token(word.encode("utf-8")))
        return [self._token_to_id[piece] for piece in self._apply_merges(symbols)]

    def decode(self, ids, errors="replace"):
        """Ids -> text. A cut through a multi-byte character decodes as U+FFFD (errors="replace")."""
        return b"".join(self._look_up(self._id_to_bytes, ids)).decode("utf-8", errors)

    # -- files ---------------------------------------------------------------------------------

    def save(self, directory):
        """Write vocab.json, merges.txt (GPT-2 layout), special_tokens.json and, with a
        normalizer, tokenizer_config.json into `directory`."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        vocab = {token: token_id for token_id, token in enumerate(self._id_to_token)}
        (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        self._write_merges(directory / "merges.txt")
        special_tokens = json.dumps(self._special_tokens, indent=1)
        (directory / "special_tokens.json").write_text(special_tokens, encoding="utf-8")
        if self.normalizer:
            config = json.dumps({"normalizer": self.normalizer})
            (directory / CONFIG_FILE).write_text(config, encoding="utf-8")

    @classmethod
    def load(cls, directory, special_tokens=None, pattern=GPT2_PATTERN):
        """Read a tokenizer saved by save(), or GPT-2's vocab.json + merges.txt.

        special_tokens: names (entries of vocab.json) to treat as special; by default those in
        special_tokens.json, or none if that file is absent. The split pattern is not stored in
        these files: pass the one used in training if it was not GPT-2's. A malformed file raises
        a ValueError that names the file and the line or entry.
        """
        directory = Path(directory)
        vocab = _read_vocab(directory / "vocab.json")
        merges = _read_merges(directory / "merges.txt", vocab)
        if special_tokens is None:
            special_path = directory / "special_tokens.json"
            specials = _read_special_tokens(special_path, vocab) if special_path.exists() else {}
        else:
            missing = [name for name in special_tokens if name not in vocab]
            if missing:
                raise ValueError(f"{directory / 'vocab.json'}: has no entry for special tokens {missing}")
            specials = {name: vocab[name] for name in special_tokens}
        normalizer = _read_normalizer(directory / CONFIG_FILE) if (directory / CONFIG_FILE).exists() else None
        ordinary = {token: token_id for token, token_id in vocab.items() if token not in specials}
        for token in ordinary:
            if not set(token) <= CHAR_TO_BYTE.keys():
                raise ValueError(
                    f"{directory / 'vocab.json'}: entry {token!r} is neither spelled in the "
                    "byte-to-unicode alphabet nor a special token"
                )
        missing_bytes = [char for char in BYTE_TO_CHAR if char not in ordinary]
        if missing_bytes:
            raise ValueError(
                f"{directory / 'vocab.json'}: byte tokens {missing_bytes[:5]} (of {len(missing_bytes)}) "
                "are missing or special"
            )
        check_made_by_merges(ordinary, merges, lambda token: len(token) == 1, directory / "merges.txt")
        return cls(ordinary, merges, specials, pattern, normalizer)


def _read_vocab(path):
    """vocab.json -> {token: id}, checking tokens are not empty and ids are 0 .. n-1."""
    vocab = read_json(path)
    if not isinstance(vocab, dict):
        raise ValueError(f"{path}: expected a JSON object {{token: id}}, got {type(vocab).__name__}")
    token_of_id = {}
    for token, token_id in vocab.items():
        if not token:
            raise ValueError(f"{path}: an entry is the empty string, which is no token")
        if type(token_id) is not int or token_id < 0:
            raise ValueError(f"{path}: entry {token!r} has id {token_id!r}, not a non-negative integer")
        if token_id in token_of_id:
            raise ValueError(f"{path}: entries {token_of_id[token_id]!r} and {token!r} share id {token_id}")
        token_of_id[token_id] = token
    if len(vocab) and max(token_of_id) != len(vocab) - 1:
        missing = min(set(range(len(vocab))) - set(token_of_id))
        raise ValueError(f"{path}: ids must run 0 .. {len(vocab) - 1} without gaps; id {missing} is missing")
    return vocab


def _read_merges(path, vocab):
    """merges.txt -> [(left, right)]: a '#version' line (GPT-2's files have one), then one merge a
    line; every piece and every merged result must be in vocab. An empty file is refused: even a
    tokenizer without merges writes the version line."""
    lines = read_text(path).splitlines()
    if not lines:
        raise ValueError(f"{path}: the file is empty (expected {MERGES_HEADER!r}, then one merge a line)")
    merges, seen = [], set()
    for line_number, line in enumerate(lines, start=1):
        if not line.strip() or (line_number == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"{path}, line {line_number}: expected 'left right', got {line!r}")
        for token in (*parts, parts[0] + parts[1]):
            if token not in vocab:
                raise ValueError(f"{path}, line {line_number}: {token!r} is not in vocab.json")
        pair = tuple(parts)
        if pair in seen:
            raise ValueError(f"{path}, line {line_number}: the merge {line!r} appears twice")
        seen.add(pair)
        merges.append(pair)
    return merges


def _read_special_tokens(path, vocab):
    """special_tokens.json -> {name: id}; each must match its entry in vocab.json."""
    specials = read_json(path)
    if not isinstance(specials, dict):
        raise ValueError(f"{path}: expected a JSON object {{name: id}}")
    for name, token_id in specials.items():
        if vocab.get(name) != token_id:
            raise ValueError(
                f"{path}: {name!r} has id {token_id!r} here but {vocab.get(name)!r} in vocab.json"
            )
    return specials


def _read_normalizer(path):
    """tokenizer_config.json -> the normalizer's name, which must be one tinygpt knows."""
    config = read_json(path)
    name = config.get("normalizer") if isinstance(config, dict) else None
    if not isinstance(name, str) or name not in NORMALIZERS:
        raise ValueError(f'{path}: expected {{"normalizer": one of {sorted(NORMALIZERS)}}}, got {config!r}')
    return name
