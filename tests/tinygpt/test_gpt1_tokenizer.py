"""GPT-1's original tokenizer: its files, the text pipeline (fix_text, text_standardize, word
splitting), BPE ids, decoding, and agreement with ftfy + spaCy where they are installed.

Expected ids are worked out here from the encoder and merge tables for the words each example
should split into, with a plain BPE of the test's own.
"""

import json
import re
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinygpt.tokenizer import BPETokenizer, GPT1Tokenizer
from tinygpt.tokenizer.text import (
    _INFIX,
    _PREFIX,
    _SUFFIX,
    EnglishWordSplitter,
    GPT1Normalizer,
    _fix_segment,
    fix_text,
    text_standardize,
)

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
BPE_DIR = DATA / "gpt1-bpe"
ENCODER, MERGES = BPE_DIR / "encoder_bpe_40000.json", BPE_DIR / "vocab_40000.bpe"
SPACED = set('-~!";?+,)(/*[]}{|_')
SPLITTER = EnglishWordSplitter()


@pytest.fixture(scope="module")
def tables():
    if not BPE_DIR.is_dir():
        pytest.skip(f"{BPE_DIR} is absent (GPT-1's BPE files)")
    encoder = json.loads(ENCODER.read_text(encoding="utf-8"))
    lines = MERGES.read_text(encoding="utf-8").split("\n")[1:-1]
    ranks = {tuple(line.split()): rank for rank, line in enumerate(lines)}
    return encoder, ranks


@pytest.fixture(scope="module")
def tokenizer(tables):
    return GPT1Tokenizer.from_files(ENCODER, MERGES)


def reference_ids(words, tables):
    """Ids for already split, lower-cased words: merge the lowest-ranked pair until none is left."""
    encoder, ranks = tables
    ids = []
    for word in words:
        symbols = list(word[:-1]) + [word[-1] + "</w>"]
        while True:
            pairs = [(ranks[pair], i) for i, pair in enumerate(zip(symbols, symbols[1:])) if pair in ranks]
            if not pairs:
                break
            i = min(pairs)[1]
            symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
        ids += [encoder.get(symbol, 0) for symbol in symbols]
    return ids


EXAMPLES = [
    ("I don't know.", "i do n't know ."),
    (
        "I'm sure they'll say we're right; you've seen it.",
        "i 'm sure they 'll say we 're right ; you 've seen it .",
    ),
    (
        "It's 5pm and she'd gone. Can't stop, won't stop!",
        "it 's 5 pm and she 'd gone . ca n't stop , wo n't stop !",
    ),
    ("Wait!!! What?! Really...", "wait ! ! ! what ? ! really ..."),
    ("Well\u2026 maybe\u2014or not \u2013 ok", "well ... maybe - or not - ok"),
    ("\u201cHello,\u201d she said, \u2018twice\u2019.", "\" hello , \" she said , ' twice ' ."),
    ("It costs 3.14 or 1,000 dollars (roughly).", "it costs 3.14 or 1 , 000 dollars ( roughly ) ."),
    (
        "Mr. Smith and Dr. Brown left the U.S. in Jan. 1990.",
        "mr. smith and dr. brown left the u.s. in jan. 1990 .",
    ),
    ("Visit www.example.com, e.g. today; I cannot.", "visit www.example.com , e.g. today ; i can not ."),
    ("The well-known 'rock' star's fans", "the well - known ' rock ' star 's fans"),
]


@pytest.mark.parametrize("text, words", EXAMPLES)
def test_known_examples(tokenizer, tables, text, words):
    assert tokenizer.words(text) == words.split(" ")
    assert tokenizer.encode(text) == reference_ids(words.split(" "), tables)


def test_a_line_break_is_the_newline_piece(tokenizer, tables):
    encoder, _ = tables
    newline = encoder["\n</w>"]
    assert newline == 40477
    assert tokenizer.encode("one\n\n  two\r\nthree") == [
        encoder["one</w>"],
        newline,
        encoder["two</w>"],
        newline,
        encoder["three</w>"],
    ]


def test_vocabulary_and_special_tokens(tokenizer):
    assert tokenizer.vocab_size == 40481
    assert tokenizer.special_tokens == {"_start_": 40478, "_delimiter_": 40479, "_classify_": 40480}
    assert [tokenizer.token_to_id(name) for name in tokenizer.special_tokens] == [40478, 40479, 40480]
    assert tokenizer.id_to_token(40480) == "_classify_"
    assert tokenizer.token_to_id("<unk>") == 0
    assert tokenizer.token_to_id("the</w>") == tokenizer.encode("the")[0]
    assert tokenizer.encode("_start_") != [40478]  # text is never read as a special token


def test_unknown_pieces_become_id_0(tokenizer, tables):
    encoder, _ = tables
    assert "\u65e5</w>" not in encoder and "\u65e5" not in encoder
    assert tokenizer.encode("\u65e5") == [0]
    assert tokenizer.encode("a \u65e5\u672c b") == [encoder["a</w>"], 0, 0, encoder["b</w>"]]


def test_decode_turns_word_ends_into_spaces(tokenizer, tables):
    encoder, _ = tables
    ids = [encoder["hel"], encoder["lo</w>"], encoder["world</w>"], encoder[".</w>"]]
    assert tokenizer.decode(ids) == "hello world ."
    assert tokenizer.decode(tokenizer.encode("Don't SHOUT, please.")) == "do n't shout , please ."
    assert tokenizer.decode([40478, *tokenizer.encode("hi"), 40480]) == "_start_hi _classify_"
    assert tokenizer.decode([]) == ""
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tokenizer.decode([40481])


def test_encode_batch_and_empty_text(tokenizer):
    texts = ["One sentence.", "", "  \n ", "Another, longer one!"]
    assert tokenizer.encode_batch(texts) == [tokenizer.encode(text) for text in texts]
    assert tokenizer.encode("") == [] and tokenizer.encode("  \n ") == []


@given(st.text(max_size=60))
def test_any_text_encodes_to_ids_in_range(tokenizer, text):
    ids = tokenizer.encode(text)
    assert all(type(i) is int and 0 <= i < 40478 for i in ids)


def mended(text):
    """Text with each UTF-16 surrogate pair made its character and each lone half U+FFFD."""
    out, i = [], 0
    while i < len(text):
        high, low = text[i], text[i + 1 : i + 2]
        if "\ud800" <= high <= "\udbff" and "\udc00" <= low <= "\udfff":
            out.append(chr(0x10000 + (ord(high) - 0xD800) * 0x400 + ord(low) - 0xDC00))
            i += 2
        else:
            out.append("\ufffd" if "\ud800" <= high <= "\udfff" else high)
            i += 1
    return "".join(out)


@given(st.lists(st.sampled_from(["a", " b", "\u00e9", "\ud83d", "\ude00", "\udc80"])).map("".join))
def test_both_tokenizers_mend_surrogates_alike(tokenizer, text):
    assert tokenizer.encode(text) == tokenizer.encode(mended(text))
    bpe = BPETokenizer.train(["a b"], 260)
    assert bpe.decode(bpe.encode(text)) == mended(text)
    trained = BPETokenizer.train([text, "a b"], 270)  # training reads the text as encode does
    assert trained.merges == BPETokenizer.train([mended(text), "a b"], 270).merges


def test_bad_files_are_named_with_the_line(tmp_path):
    encoder = tmp_path / "encoder.json"
    encoder.write_text('{"<unk>": 0,\n "a": 1,\n "b": 2,\n "ab</w>": 3,\n}')  # trailing comma
    with pytest.raises(ValueError, match=r"encoder\.json: line 5"):
        GPT1Tokenizer.from_files(encoder, tmp_path / "merges.bpe")
    encoder.write_text('{"<unk>": 0, "a": 1, "b": 5}')
    with pytest.raises(ValueError, match=r"encoder\.json: ids are not exactly 0\.\.2"):
        GPT1Tokenizer.from_files(encoder, tmp_path / "merges.bpe")
    encoder.write_text('{"<unk>": 0, "a": 1, "b</w>": 2, "ab</w>": 3}')
    merges = tmp_path / "merges.bpe"
    merges.write_text("a b</w>\n")
    with pytest.raises(ValueError, match=r"merges\.bpe: line 1: expected a '#version' header"):
        GPT1Tokenizer.from_files(encoder, merges)
    merges.write_text("#version: 0.2\na b</w>\na  b\n")
    with pytest.raises(ValueError, match=r"merges\.bpe: line 3: expected two pieces"):
        GPT1Tokenizer.from_files(encoder, merges)
    merges.write_text("#version: 0.2\nb a\n")
    with pytest.raises(ValueError, match=r"merges\.bpe: line 2: the merged piece 'ba'"):
        GPT1Tokenizer.from_files(encoder, merges)
    merges.write_text("#version: 0.2\na b</w>\n")
    tokenizer = GPT1Tokenizer.from_files(encoder, merges)
    assert tokenizer.encode("ab b x") == [3, 2, 0]
    with pytest.raises(ValueError, match="pretokenizer"):
        GPT1Tokenizer.from_files(encoder, merges, pretokenizer="nltk")


@pytest.mark.parametrize(
    "merges_text, why",
    [
        (b"", "line 1: expected a '#version' header"),
        (b"#version: 0.2\n", "no merge makes the token 'ab</w>'"),
        (b"#version: 0.2\na b</w>\n\xe9 b\n", "line 3: not valid UTF-8"),
    ],
)
def test_merges_that_cannot_make_the_encoders_pieces_are_refused(tmp_path, merges_text, why):
    """An empty or cut-short vocab_40000.bpe leaves pieces of the encoder that no merge makes
    (all but single characters and '<unk>' must be made); a bad byte is named with its line."""
    encoder, merges = tmp_path / "encoder.json", tmp_path / "merges.bpe"
    encoder.write_text('{"<unk>": 0, "a": 1, "b</w>": 2, "ab</w>": 3}')
    merges.write_bytes(merges_text)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(merges))}: {why}"):
        GPT1Tokenizer.from_files(encoder, merges)


def test_an_encoder_that_is_not_utf8_is_named_with_the_line(tmp_path):
    encoder = tmp_path / "encoder.json"
    encoder.write_bytes(b'{"<unk>": 0,\n "\xe9": 1}')
    with pytest.raises(ValueError, match=rf"^{re.escape(str(encoder))}: line 2: not valid UTF-8"):
        GPT1Tokenizer.from_files(encoder, tmp_path / "merges.bpe")


# -- the text pipeline on its own (no files needed) --------------------------------------------


@pytest.mark.parametrize(
    "broken, fixed",
    [
        ("It\u00e2\u20ac\u2122s caf\u00c3\u00a9 time", "It's café time"),  # UTF-8 read as Windows-1252
        ("\u201aÄúQuoted\u201aÄù", '"Quoted"'),  # UTF-8 read as Mac Roman
        ("\u0093curly\u0094 and \u2018single\u2019", "\"curly\" and 'single'"),
        ("fish &amp; chips &eacute;t&#233; &#x2019;", "fish & chips été '"),
        ("a < b &amp; c\nd &amp; e", "a < b &amp; c\nd &amp; e"),  # '<': maybe HTML, entities kept
        ("\ufb01ne \uff2c\uff2f\uff35\uff24\u3000ok", "fine LOUD ok"),
        ("e\u0301\r\nnext\x00\x1b[1mbold\x1b[0m", "\u00e9\nnextbold"),
    ],
)
def test_fix_text_repairs_what_ftfy_repairs(broken, fixed):
    assert fix_text(broken) == fixed


def test_fix_text_leaves_good_text_alone():
    text = "Plain prose, with ümlauts, Ελληνικά, 日本語, and — dashes … kept.\nA second line."
    assert fix_text(text) == text


ASCII_PIECES = ["a", "B", " ", "\n", "\r", "\t", "\x0c", "\x00", "\x7f", "\x1b[1m", "&amp;", "&#65;", "<"]


@given(st.lists(st.sampled_from(ASCII_PIECES)).map("".join))
def test_fix_text_passes_over_ascii_lines_only_where_no_fix_applies(text):
    unescape_html, lines = True, []
    for line in re.findall(r"[^\n]*\n|[^\n]+", text):
        unescape_html = unescape_html and "<" not in line
        lines.append(_fix_segment(line, unescape_html))  # every fix, until none changes anything
    assert fix_text(text) == "".join(lines)


def test_text_standardize_examples():
    assert text_standardize("  Hi\u2014there\u2026  you!!  ") == "Hi - there... you !!"
    assert text_standardize("a\r\n\n  b\tc") == "a \n b c"
    # the backslash stays put: the original pattern's escaping turned its entry into a second '+'
    assert text_standardize("x\u00b4s (y)[z]{w} a/b c\\d e_f") == "x's ( y ) [ z ] { w } a / b c\\d e _ f"


@given(st.text(alphabet=st.sampled_from(sorted(SPACED) + list("ab .'\\\n\t\u2014\u2026\u00b4")), max_size=40))
def test_text_standardize_properties(text):
    out = text_standardize(text)
    assert text_standardize(out) == out  # idempotent
    assert out == out.strip() and "  " not in out and not re.search(r"[^\S \n]", out)
    assert all(out[i - 1 : i + 2] == " \n " for i, char in enumerate(out) if char == "\n")
    for i, char in enumerate(out):  # a punctuation run is set apart on both sides
        if char in SPACED:
            assert i == 0 or out[i - 1] in (" ", char)
            assert i == len(out) - 1 or out[i + 1] in (" ", char)


def original_text_standardize(text):
    """finetune-transformer-lm's text_standardize step by step. Its punctuation pattern is written
    here as Python read it: the string was not raw, so its '\\\\+' entry came out as a second '\\+'."""
    for char, replacement in zip("\u2014\u2013\u2015\u2026\u00b4", ["-", "-", "-", "...", "'"]):
        text = text.replace(char, replacement)
    text = re.sub(r"""(-+|~+|!+|"+|;+|\?+|\++|,+|\)+|\(+|\++|\/+|\*+|\[+|\]+|}+|{+|\|+|_+)""", r" \1 ", text)
    text = re.sub(r"\s*\n\s*", " \n ", text)
    text = re.sub(r"[^\S\n]+", " ", text)
    return text.strip()


# A character of each case text_standardize treats
STANDARDIZED = [*sorted(SPACED), *"ab.'\\ \n\t\r\x0b\x1c\xa0\u2028\u2014\u2013\u2015\u2026\xb4"]


@given(st.text(alphabet=st.sampled_from(STANDARDIZED)))
def test_text_standardize_is_the_originals(text):
    assert text_standardize(text) == original_text_standardize(text)


@given(st.text(alphabet=st.characters(categories=["Lu", "Ll", "Lt", "Lm", "Lo"]), min_size=1))
def test_no_affix_or_infix_rule_matches_letters_alone(word):
    # The word splitter passes a chunk of letters whole without trying the rules, on this premise.
    assert word.isalpha()
    assert not (_PREFIX.match(word) or _SUFFIX.search(word) or _INFIX.search(word))


@pytest.mark.parametrize(
    "text, words",
    [
        (
            "hello'' (Mr.) a.m. 5pm 10km $5 5% USA. U.S. end.'",
            "hello '' ( Mr. ) a.m. 5 pm 10 km $ 5 5 % USA . U.S. end . '",
        ),
        (
            "gonna cannot dont Its its y'all 'em ol' c'mon",
            "gon na can not do nt Its its y' all 'em ol' c'm on",
        ),
        ("x--y foo.Bar foo.bar a,b 3-4 B...a.", "x -- y foo . Bar foo.bar a , b 3 - 4 B ... a."),
        ("a \n b", "a|\n |b"),
        ("and' 'left ''", "and ' ' left ''"),  # the two quotes spell '' only without a space between
    ],
)
def test_word_splitter_examples(text, words):
    assert SPLITTER(text) == words.split("|" if "|" in words else " ")


@given(st.text(alphabet=st.sampled_from("ab'. \n\t\u00a0"), max_size=30))
def test_word_splitter_cuts_chunks_at_spaces_as_spacy_does(text):
    # The runs of non-space and of space characters; one ' ' after a word only ends the word.
    chunks, after_word = [], False
    for run in re.findall(r"\S+|\s+", text):
        if after_word and run[0] == " ":
            run = run[1:]
        if run:
            chunks.append(run)
        after_word = not run.isspace()
    splitter = EnglishWordSplitter()
    assert splitter(text) == [token for chunk in chunks for token in splitter(chunk)]


@pytest.mark.parametrize(
    "text, normalized",
    [
        ("It's a CHARMING film -- isn't it?", "it 's a charming film -- is n't it ?"),
        ("Mr. Knightley\u2019s\r\n\tcaf\u00c3\u00a9 \u2026", "mr. knightley 's \n  caf\u00e9 ..."),
    ],
)
def test_normalizer_examples(text, normalized):
    assert GPT1Normalizer()(text) == normalized


@given(st.text(max_size=60))
def test_normalizer_gives_the_words_gpt1_encodes(tokenizer, text):
    """The normalized text holds exactly the words GPT-1's encoder passes to its BPE."""
    assert GPT1Normalizer()(text) == " ".join(tokenizer.words(text))


# -- agreement with the original pipeline, where spaCy and ftfy are installed ------------------


def sample_paragraphs():
    books = sorted((DATA / "pretrain" / "gutenberg").glob("*.txt"))
    paragraphs = []
    for path in books:
        text = path.read_bytes().decode("latin-1").replace("\r\n", "\n")  # ASCII, or Latin-1
        paragraphs += [part for part in re.split(r"\n\s*\n", text) if part.strip()][200:260]
    wikitext = DATA / "pretrain" / "wikitext-2" / "valid.txt"
    if wikitext.is_file():
        lines = wikitext.read_text(encoding="utf-8").split("\n")
        paragraphs += [line for line in lines if line.strip()][:300]
    return paragraphs


def test_builtin_pipeline_equals_spacy_and_ftfy(tokenizer):
    pytest.importorskip("spacy")
    pytest.importorskip("ftfy")
    paragraphs = sample_paragraphs()
    if not paragraphs:
        pytest.skip("no paragraphs under ../shared/data/pretrain")
    original = GPT1Tokenizer.from_files(ENCODER, MERGES, pretokenizer="spacy")
    assert tokenizer.encode_batch(paragraphs) == original.encode_batch(paragraphs)


@pytest.fixture(scope="module")
def spacy_tokenizer():
    return pytest.importorskip("spacy").blank("en").tokenizer


@given(
    st.text(
        alphabet=st.sampled_from(list("aAsStTmMdDlLvnIx.'’,:;-—!?\"“()<>/=+*&%$#@_°😀 \n0123éΩд")),
        max_size=20,
    )
)
def test_word_splitter_equals_spacy_on_raw_text(spacy_tokenizer, text):
    assert SPLITTER(text) == [token.text for token in spacy_tokenizer(text)]


def test_spacy_pretokenizer_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "spacy", None)  # as if it were not installed
    with pytest.raises(ImportError, match="pip install spacy ftfy"):
        GPT1Tokenizer({"<unk>": 0, "a</w>": 1}, [], pretokenizer="spacy")
