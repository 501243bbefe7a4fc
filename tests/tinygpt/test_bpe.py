"""The byte-level BPE tokenizer: round trips, special tokens, merge order, training, files, errors."""

import json
import re
from collections import Counter
from pathlib import Path

import pytest
import regex
from hypothesis import assume, example, given
from hypothesis import strategies as st

from tests.helpers import join_pair
from tinygpt.tokenizer import BPETokenizer
from tinygpt.tokenizer.bpe import GPT2_PATTERN
from tinygpt.tokenizer.text import GPT1Normalizer

SPECIALS = ("_start_", "_delimiter_", "_classify_")
CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs!\n",
    "It's 2024 and we've 3,141 reasons: naïve café, Ünïcödé, 日本語のテキスト, emoji 🙂🙃.\n",
    "  indented\tline with   spaces\r\nand a CRLF line ending\r\n",
    "the theory of the thing: there, then, these, those, they, them, their, theirs.\n" * 3,
]
GUTENBERG = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "pretrain" / "gutenberg"


def byte_chars():
    """GPT-2's byte-to-unicode map, rebuilt here from its definition: bytes '!'-'~', '¡'-'¬' and
    '®'-'ÿ' stand for themselves, the remaining 68 bytes take chr(256), chr(257), ... in order."""
    kept = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [byte for byte in range(256) if byte not in kept]
    return {**{byte: chr(byte) for byte in kept}, **{byte: chr(256 + n) for n, byte in enumerate(others)}}


BYTE_CHARS = byte_chars()


@pytest.fixture(scope="module")
def tokenizer():
    return BPETokenizer.train(CORPUS, vocab_size=256 + 3 + 150)


def reference_encode(tokenizer, text):
    """Encoding from the definition, special tokens aside: split with the regex, spell each word's
    bytes, then apply every merge in rank order to every word, each one left to right."""
    ids = []
    for word in regex.findall(GPT2_PATTERN, text):
        pieces = [BYTE_CHARS[byte] for byte in word.encode("utf-8")]
        for left, right in tokenizer.merges:
            pieces = join_pair(pieces, left, right)
        ids += [tokenizer.token_to_id(piece) for piece in pieces]
    return ids


def reference_merges(texts, num_merges):
    """Training from the definition: recount every pair each step, take the most frequent
    (ties: the smallest pair in byte order), merge it everywhere."""
    words = Counter(word for text in texts for word in regex.findall(GPT2_PATTERN, text))
    words = {tuple(bytes([b]) for b in word.encode("utf-8")): count for word, count in words.items()}
    merges = []
    for _ in range(num_merges):
        pairs = Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += count
        if not pairs:
            break
        best = min(pairs, key=lambda pair: (-pairs[pair], pair))
        merges.append(best)
        new_words = {}
        for word, count in words.items():
            merged, i = [], 0
            while i < len(word):
                if word[i : i + 2] == best:
                    merged.append(best[0] + best[1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            new_words[tuple(merged)] = new_words.get(tuple(merged), 0) + count
        words = new_words
    as_chars = lambda data: "".join(BYTE_CHARS[b] for b in data)  # noqa: E731
    return [(as_chars(left), as_chars(right)) for left, right in merges]


# -- encoding ---------------------------------------------------------------------------------


@given(st.text())
@example("")
@example("The quick brown fox, naïve café 🙂\r\n\t ")
def test_decode_inverts_encode(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text)) == text


@given(st.text(max_size=60))
@example("the theory of the thing: there, then")
@example("It's 2024 and we've 3,141 reasons")
def test_merges_apply_in_rank_order(tokenizer, text):
    assume(not any(name in text for name in SPECIALS))
    assert tokenizer.encode(text) == reference_encode(tokenizer, text)


def test_encode_batch_matches_encode(tokenizer):
    assert tokenizer.encode_batch(CORPUS) == [tokenizer.encode(text) for text in CORPUS]


def test_ids_and_vocab_layout(tokenizer):
    assert tokenizer.vocab_size == 256 + 3 + 150
    assert tokenizer.special_tokens == {name: 256 + 150 + i for i, name in enumerate(SPECIALS)}
    assert [tokenizer.token_to_id(BYTE_CHARS[byte]) for byte in range(256)] == list(range(256))
    assert tokenizer.token_to_id("Ġ") == 32 and tokenizer.id_to_token(10) == "Ċ"
    for token_id in range(tokenizer.vocab_size):
        assert tokenizer.token_to_id(tokenizer.id_to_token(token_id)) == token_id


def test_decode_refuses_unknown_ids(tokenizer):
    for bad in (-1, tokenizer.vocab_size):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            tokenizer.decode([1, bad])


# -- special tokens ---------------------------------------------------------------------------

no_underscore = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="_"), max_size=30)


@given(no_underscore, st.sampled_from(SPECIALS), no_underscore)
def test_special_tokens_survive_inside_text(tokenizer, before, name, after):
    # Every special token starts and ends with "_", so text without "_" cannot join into one.
    ids = tokenizer.encode(before + name + after)
    assert ids == tokenizer.encode(before) + [tokenizer.special_tokens[name]] + tokenizer.encode(after)
    assert tokenizer.decode(ids) == before + name + after


@given(st.text(alphabet=st.sampled_from("_startdelimiterclassify x"), max_size=40))
@example("_start _sta rt_ start_ _classify _delimiter")
@example("_start_classify_ __delimiter__")
def test_special_ids_come_only_from_special_names(tokenizer, text):
    expected, i = 0, 0  # count the names by a left-to-right scan, longest name first
    while i < len(text):
        name = next(
            (name for name in sorted(SPECIALS, key=len, reverse=True) if text.startswith(name, i)), None
        )
        expected, i = (expected + 1, i + len(name)) if name else (expected, i + 1)
    special_ids = set(tokenizer.special_tokens.values())
    assert sum(token_id in special_ids for token_id in tokenizer.encode(text)) == expected


def test_longest_special_token_wins():
    tokenizer = BPETokenizer.train(CORPUS, 300, special_tokens=("<s>", "<s><s>"))
    assert tokenizer.encode("<s><s><s>") == [
        tokenizer.special_tokens["<s><s>"],
        tokenizer.special_tokens["<s>"],
    ]


# -- training ---------------------------------------------------------------------------------


def test_first_merges_of_a_tiny_corpus():
    # Words: "hug" x1, " hug" x9, " pug" x5, " pun" x12, " bun" x4, " hugs" x5. Pair counts: (u, g) 20,
    # (Ġ, p) 17, (u, n) 16, (h, u) 15, ... so those three come first.
    text = "hug" + " hug" * 9 + " pug" * 5 + " pun" * 12 + " bun" * 4 + " hugs" * 5
    tokenizer = BPETokenizer.train([text], 256 + 3 + 3)
    assert tokenizer.merges == [("u", "g"), ("Ġ", "p"), ("u", "n")]


@pytest.mark.parametrize("texts", [CORPUS, ["aaabdaaabac " * 3, "abab abba baba aaaa"]])
def test_training_matches_the_definition(texts):
    tokenizer = BPETokenizer.train(texts, 256 + 3 + 60)
    assert tokenizer.merges == reference_merges(texts, 60)


@given(st.lists(st.text(alphabet="aab é\n", max_size=24), min_size=1, max_size=6), st.integers(1, 40))
def test_training_matches_the_definition_on_drawn_texts(texts, num_merges):
    # Few letters: runs like "aaaa" and "abab" put sites side by side and make ties.
    assume("".join(texts).strip())
    assert BPETokenizer.train(texts, 256 + 3 + num_merges).merges == reference_merges(texts, num_merges)


def test_training_is_deterministic():
    first = BPETokenizer.train(CORPUS, 400)
    assert BPETokenizer.train(CORPUS, 400).merges == first.merges
    assert BPETokenizer.train(CORPUS[::-1], 400).merges == first.merges  # ties do not depend on order


def test_training_stops_when_no_pair_is_left():
    tokenizer = BPETokenizer.train(["ab ab"], 1000, special_tokens=())
    assert tokenizer.merges == [("a", "b"), ("Ġ", "ab")]
    assert tokenizer.vocab_size == 258


def test_special_tokens_in_training_text_are_not_learned():
    tokenizer = BPETokenizer.train(["_start_" * 50 + " a"], 300)
    assert tokenizer.merges == [("Ġ", "a")]


def test_train_files_reads_files_folders_and_globs(tmp_path):
    (tmp_path / "sub").mkdir()
    for name, text in [("a.txt", CORPUS[0]), ("sub/b.txt", CORPUS[1]), ("c.md", CORPUS[2])]:
        (tmp_path / name).write_text(text, encoding="utf-8")
    expected = BPETokenizer.train(CORPUS[:2], 300).merges
    assert BPETokenizer.train_files(tmp_path, 300).merges == expected
    assert BPETokenizer.train_files(str(tmp_path / "**" / "*.txt"), 300).merges == expected
    assert BPETokenizer.train_files([tmp_path / "a.txt", tmp_path / "sub"], 300).merges == expected


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("texts", [[], [""], ["_start_"]])
def test_empty_corpus_is_refused(texts):
    with pytest.raises(ValueError, match="empty"):
        BPETokenizer.train(texts, 300)


def test_too_small_vocab_is_refused():
    with pytest.raises(ValueError, match="vocab_size=258 is too small.*259"):
        BPETokenizer.train(CORPUS, 258)


def test_latin1_file_names_file_and_offset(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("un café noir".encode("latin-1"))
    with pytest.raises(
        ValueError, match=r"latin1\.txt: line 1: not valid UTF-8 at byte 6 .*errors='replace'"
    ):
        BPETokenizer.train_files(path, 300)
    replaced = BPETokenizer.train_files(path, 300, errors="replace")  # U+FFFD is the bytes EF BF BD
    assert replaced.id_to_token(replaced.token_to_id("ï¿½")) == "ï¿½"
    as_latin1 = BPETokenizer.train_files(path, 300, encoding="latin-1")  # é is the bytes C3 A9
    assert as_latin1.merges == BPETokenizer.train(["un café noir"], 300).merges


def test_missing_path_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        BPETokenizer.train_files(tmp_path / "nothing", 300)
    with pytest.raises(ValueError, match="matches no file"):
        BPETokenizer.train_files(str(tmp_path / "*.txt"), 300)


# -- files ------------------------------------------------------------------------------------


def test_save_load_gives_identical_ids(tokenizer, tmp_path):
    tokenizer.save(tmp_path)
    assert (tmp_path / "merges.txt").read_text(encoding="utf-8").splitlines()[0] == "#version: 0.2"
    loaded = BPETokenizer.load(tmp_path)
    assert loaded.merges == tokenizer.merges and loaded.special_tokens == tokenizer.special_tokens
    text = "".join(CORPUS) + "_start_ new words, _delimiter_ zebra _classify_"
    assert loaded.encode(text) == tokenizer.encode(text)


def write_gpt2_files(directory, merges_text, extra_tokens=("Ġt", "he", "Ġthe", "<|endoftext|>")):
    """GPT-2's layout by hand: byte tokens ordered by their character, as in GPT-2's encoder.json."""
    tokens = sorted(BYTE_CHARS.values()) + list(extra_tokens)
    vocab = {token: token_id for token_id, token in enumerate(tokens)}
    (directory / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (directory / "merges.txt").write_text(merges_text, encoding="utf-8")
    return vocab


def test_loads_files_in_the_gpt2_layout(tmp_path):
    vocab = write_gpt2_files(tmp_path, "#version: 0.2\nĠ t\nh e\nĠt he\n")
    tokenizer = BPETokenizer.load(tmp_path, special_tokens=["<|endoftext|>"])
    assert tokenizer.merges == [("Ġ", "t"), ("h", "e"), ("Ġt", "he")]
    ids = tokenizer.encode(" the<|endoftext|>he!")
    assert ids == [vocab["Ġthe"], vocab["<|endoftext|>"], vocab["he"], vocab["!"]]
    assert tokenizer.decode(ids) == " the<|endoftext|>he!"


@pytest.mark.parametrize(
    "merges_text, line, message",
    [
        ("#version: 0.2\nĠ t\nh e x\n", 3, "expected 'left right'"),
        ("#version: 0.2\nĠ t\n\nh\n", 4, "expected 'left right'"),
        ("Ġ t\nh q\n", 2, "'hq' is not in vocab.json"),
        ("#version: 0.2\nĠ t\nĠ t\n", 3, "the merge 'Ġ t' appears twice"),
    ],
)
def test_malformed_merges_name_file_and_line(tmp_path, merges_text, line, message):
    write_gpt2_files(tmp_path, merges_text)
    with pytest.raises(ValueError, match=rf"merges\.txt, line {line}: {message}"):
        BPETokenizer.load(tmp_path)


@pytest.mark.parametrize(
    "vocab_text, message",
    [
        ('{"a": 0,\n "b": }', r"vocab\.json: line 2 column"),
        ('["a"]', r"vocab\.json: expected a JSON object"),
        ('{"a": 0, "b": 0}', r"vocab\.json: entries 'a' and 'b' share id 0"),
        ('{"a": 0, "b": 2}', r"vocab\.json: ids must run 0 \.\. 1 without gaps; id 1 is missing"),
        ('{"a": 0, "b": 1}', r"vocab\.json: byte tokens"),
        (
            json.dumps({**{c: i for i, c in enumerate(BYTE_CHARS.values())}, "a b": 256}),
            r"vocab\.json: entry 'a b' is neither spelled in the byte-to-unicode alphabet",
        ),
    ],
)
def test_malformed_vocab_names_file_and_entry(tmp_path, vocab_text, message):
    (tmp_path / "vocab.json").write_text(vocab_text, encoding="utf-8")
    (tmp_path / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        BPETokenizer.load(tmp_path)


@pytest.mark.parametrize("kept", [None, 0, 75])
def test_a_merges_file_that_does_not_make_the_vocabulary_is_refused(tokenizer, tmp_path, kept):
    """An empty merges.txt, or one cut short (just its version line, or half its merges), would load
    as a tokenizer that never makes most of its tokens: refused, naming the file and a token."""
    tokenizer.save(tmp_path)
    lines = (tmp_path / "merges.txt").read_text(encoding="utf-8").splitlines()
    (tmp_path / "merges.txt").write_text("" if kept is None else "\n".join(lines[: 1 + kept]) + "\n")
    why = "the file is empty" if kept is None else "no merge makes the token"
    with pytest.raises(ValueError, match=rf"^{re.escape(str(tmp_path / 'merges.txt'))}: {why}"):
        BPETokenizer.load(tmp_path)


@pytest.mark.parametrize(
    "name, text, why",
    [
        ("vocab.json", None, "an entry is the empty string"),
        ("vocab.json", b'{"a": 0,\n "\xff": 1}', "line 2: not valid UTF-8"),
        ("vocab.json", b"[" * 100_000, "not readable JSON"),
        ("tokenizer_config.json", b'{"normalizer": ["gpt1"]}', "expected"),
        ("special_tokens.json", b'{"_start_": "x"}', "'_start_' has id 'x' here"),
    ],
)
def test_tokenizer_files_of_the_wrong_shape_are_named(tokenizer, tmp_path, name, text, why):
    """Each file of a saved tokenizer is checked: a bad one is a ValueError naming it."""
    tokenizer.save(tmp_path)
    if text is None:  # an empty token in place of the last special token's name
        vocab = json.loads((tmp_path / "vocab.json").read_text(encoding="utf-8"))
        vocab[""] = vocab.pop("_classify_")
        (tmp_path / "special_tokens.json").unlink()
        text = json.dumps(vocab).encode()
    (tmp_path / name).write_bytes(text)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(tmp_path / name))}:? .*{why}"):
        BPETokenizer.load(tmp_path)


def test_special_tokens_file_must_agree_with_vocab(tokenizer, tmp_path):
    tokenizer.save(tmp_path)
    (tmp_path / "special_tokens.json").write_text('{"_start_": 3}', encoding="utf-8")
    with pytest.raises(ValueError, match=r"special_tokens\.json: '_start_' has id 3"):
        BPETokenizer.load(tmp_path)


def test_hugging_face_tokenizers_read_our_files(tokenizer, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer.save(tmp_path)
    theirs = tokenizers.ByteLevelBPETokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"))
    for text in CORPUS + ["Unseen words: zebra, quixotic, Ωμέγα 🙂"]:
        assert theirs.encode(text).ids == tokenizer.encode(text)


# -- GPT-1's normalization ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def normalized():
    return BPETokenizer.train(CORPUS, vocab_size=256 + 3 + 150, normalizer="gpt1")


def test_normalized_training_learns_from_the_normalized_text(normalized):
    plain = BPETokenizer.train([GPT1Normalizer()(text) for text in CORPUS], vocab_size=256 + 3 + 150)
    assert normalized.merges == plain.merges


@given(
    st.lists(
        st.sampled_from(["It's", "DON'T", " ", "a", "B", ",", ".", "?", "\n", "--", "_start_", "_classify_"]),
        max_size=12,
    ).map("".join)
)
def test_normalized_encoding_is_plain_encoding_of_the_normalized_pieces(normalized, text):
    """Special tokens are cut out first; the text between them is normalized, then split."""
    ordinary = {
        normalized.id_to_token(i): i
        for i in range(normalized.vocab_size)
        if i not in normalized.special_tokens.values()
    }
    normalize, plain = GPT1Normalizer(), BPETokenizer(ordinary, normalized.merges, normalized.special_tokens)
    pieces = regex.split("(_start_|_classify_)", text)
    expected = [
        i
        for n, piece in enumerate(pieces)
        for i in (plain.encode(piece) if n % 2 else plain.encode(normalize(piece)))
    ]
    assert normalized.encode(text) == expected


def test_normalized_text_decodes_lower_cased_and_split(normalized):
    assert normalized.decode(normalized.encode("It's THE fox, isn't it?")) == "it 's the fox , is n't it ?"


def test_normalizer_survives_save_and_load(normalized, tokenizer, tmp_path):
    normalized.save(tmp_path / "normalized")
    tokenizer.save(tmp_path / "plain")
    assert json.loads((tmp_path / "normalized" / "tokenizer_config.json").read_text()) == {
        "normalizer": "gpt1"
    }
    assert not (tmp_path / "plain" / "tokenizer_config.json").exists()
    loaded = BPETokenizer.load(tmp_path / "normalized")
    assert loaded.normalizer == "gpt1" and BPETokenizer.load(tmp_path / "plain").normalizer is None
    assert loaded.encode("The FOX's den.") == normalized.encode("The FOX's den.")


def test_unknown_normalizer_is_refused(normalized, tmp_path):
    with pytest.raises(ValueError, match="normalizer must be None or one of"):
        BPETokenizer.train(CORPUS, 300, normalizer="nfkc")
    normalized.save(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"normalizer": "nfkc"}', encoding="utf-8")
    with pytest.raises(ValueError, match=r"tokenizer_config\.json: expected"):
        BPETokenizer.load(tmp_path)


@pytest.mark.skipif(not GUTENBERG.is_dir(), reason="../shared/data is absent")
def test_real_book_round_trip():
    text = (GUTENBERG / "blake-poems.txt").read_text(encoding="utf-8")
    tokenizer = BPETokenizer.train([text], 1000)
    ids = tokenizer.encode(text)
    assert len(ids) < len(text.encode("utf-8")) / 2.5
    assert tokenizer.decode(ids) == text


def test_training_on_one_string_rather_than_a_list_of_them_is_refused():
    with pytest.raises(TypeError, match="an iterable of strings, not one string"):
        BPETokenizer.train("hello world", 270)
