"""The base both tokenizers share: id layout, lookups, the word cache, id checks, the merges file,
and the one definition of the special tokens and of the ignored target."""

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from autograd import functional as F
from tests.helpers import join_pair
from tinygpt import transformations
from tinygpt.tokenizer import BPETokenizer, GPT1Tokenizer, base
from tinygpt.tokenizer.base import SPECIAL_TOKENS, Tokenizer, ids_after
from tinygpt.tokenizer.merges import Merges

VOCAB = {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4}
MERGES = [("a", "b"), ("ab", "c")]
START, DELIMITER, CLASSIFY = 5, 6, 7


class CharTokenizer(Tokenizer):
    """Words split on spaces, BPE over their characters; it notes every word it runs BPE on."""

    def __init__(self, special_tokens=None):
        if special_tokens is None:
            special_tokens = ids_after(VOCAB, SPECIAL_TOKENS)
        super().__init__(VOCAB, MERGES, special_tokens)
        self.words_merged = []

    def encode(self, text):
        return self._encode_words(text.split())

    def _encode_word(self, word):
        self.words_merged.append(word)
        return [self._token_to_id[piece] for piece in self._apply_merges(word)]


def test_special_tokens_follow_the_vocabulary():
    tokenizer = CharTokenizer()
    assert tokenizer.vocab_size == 8
    assert tokenizer.special_tokens == {"_start_": START, "_delimiter_": DELIMITER, "_classify_": CLASSIFY}
    assert [tokenizer.id_to_token(i) for i in range(8)] == [*VOCAB, *SPECIAL_TOKENS]
    assert tokenizer.token_to_id("ab") == 3 and tokenizer.token_to_id("_classify_") == CLASSIFY
    assert tokenizer.merges == MERGES
    with pytest.raises(KeyError):
        tokenizer.token_to_id("abcd")


def test_lookups_hand_out_copies():
    tokenizer = CharTokenizer()
    tokenizer.special_tokens["_start_"] = 0
    tokenizer.merges.clear()
    assert tokenizer.token_to_id("_start_") == START and tokenizer.encode("abc") == [4]


def test_a_special_token_may_not_also_be_ordinary():
    with pytest.raises(ValueError, match=r"\['ab'\] are also ordinary"):
        CharTokenizer(special_tokens={"ab": 5})


@pytest.mark.parametrize("special_tokens", [{"_start_": 6}, {"_start_": 4}, {"_start_": 5, "_classify_": 7}])
def test_ids_must_run_from_zero_without_gaps_or_repeats(special_tokens):
    with pytest.raises(ValueError, match="must be 0 .. "):
        CharTokenizer(special_tokens=special_tokens)


def test_each_word_is_merged_once_then_taken_from_the_cache():
    tokenizer = CharTokenizer()
    assert tokenizer.encode("abc ab abc ca abc") == [4, 3, 4, 2, 0, 4]
    assert tokenizer.encode("ab") == [3]
    assert sorted(tokenizer.words_merged) == ["ab", "abc", "ca"]


def test_cache_is_emptied_when_full(monkeypatch):
    monkeypatch.setattr(base, "CACHE_LIMIT", 2)
    tokenizer = CharTokenizer()
    assert tokenizer.encode("a b c a") == [0, 1, 2, 0]  # a text's words are all kept while it is encoded
    assert tokenizer.encode("a b") == [0, 1]  # then the cache, over its limit, is emptied
    assert sorted(tokenizer.words_merged) == ["a", "a", "b", "b", "c"]


def test_encode_batch_is_encode_of_each_text():
    tokenizer = CharTokenizer()
    texts = ["abc a", "", "c b ab"]
    assert tokenizer.encode_batch(texts) == [tokenizer.encode(text) for text in texts]


@pytest.mark.parametrize("bad", [-1, 8, 100])
def test_look_up_refuses_ids_outside_the_vocabulary(bad):
    tokenizer = CharTokenizer()
    assert tokenizer._look_up(tokenizer._id_to_token, [4, 7]) == ["abc", "_classify_"]
    with pytest.raises(ValueError, match=f"token id {bad} is outside the vocabulary \\(size 8\\)"):
        tokenizer._look_up(tokenizer._id_to_token, [4, bad])


def test_merges_file_has_a_version_line_then_one_pair_a_line(tmp_path):
    CharTokenizer()._write_merges(tmp_path / "merges.txt")
    assert (tmp_path / "merges.txt").read_text(encoding="utf-8") == "#version: 0.2\na b\nab c\n"


def test_the_task_tokens_and_the_ignored_target_are_defined_once():
    assert transformations.SPECIAL_TOKENS is SPECIAL_TOKENS == ("_start_", "_delimiter_", "_classify_")
    assert transformations.IGNORE is F.IGNORE_INDEX
    assert issubclass(BPETokenizer, Tokenizer) and issubclass(GPT1Tokenizer, Tokenizer)
    trained = BPETokenizer.train(["a tiny corpus"], vocab_size=256 + 3)
    assert list(trained.special_tokens.items()) == [(name, 256 + i) for i, name in enumerate(SPECIAL_TOKENS)]
    gpt1 = GPT1Tokenizer({"<unk>": 0, "a</w>": 1}, [])
    assert gpt1.special_tokens == {name: 2 + i for i, name in enumerate(SPECIAL_TOKENS)}


def both_tokenizers():
    return [
        BPETokenizer.train(["a tiny corpus"], vocab_size=256 + 3),
        GPT1Tokenizer({"<unk>": 0, "a</w>": 1}, []),
    ]


@pytest.mark.parametrize(
    "text", [None, b"a tiny corpus", 3, ["a", "tiny"]], ids=["None", "bytes", "int", "list"]
)
def test_encode_refuses_what_is_not_text(text):
    for tokenizer in both_tokenizers():
        with pytest.raises(TypeError, match=r"^encode: text must be a str, not "):
            tokenizer.encode(text)


def test_encode_batch_refuses_one_text_for_the_list():
    for tokenizer in both_tokenizers():
        with pytest.raises(TypeError, match=r"^encode_batch: texts must be a list of str, not one str"):
            tokenizer.encode_batch("a tiny corpus")


@pytest.mark.parametrize(
    "ids, message",
    [
        (None, "ids must be a list"),
        ("ab", "ids must be a list"),
        ([1, "a"], "token id 'a' is not"),
        ([1.0], "1.0"),
    ],
    ids=["None", "text", "a text id", "a float id"],
)
def test_decode_refuses_what_is_not_a_list_of_integer_ids(ids, message):
    for tokenizer in both_tokenizers():
        with pytest.raises(TypeError, match=f"^decode: .*{message}"):
            tokenizer.decode(ids)


def merged_by_definition(word, merges):
    """BPE as it is defined: join the lowest-ranked adjacent pair, each occurrence left to right."""
    ranks, symbols = {pair: rank for rank, pair in enumerate(merges)}, list(word)
    while True:
        pairs = [pair for pair in zip(symbols, symbols[1:]) if pair in ranks]
        if not pairs:
            return symbols
        symbols = join_pair(symbols, *min(pairs, key=ranks.get))


@st.composite
def learned_merges(draw):
    """Merges as training makes them: each joins two pieces there are already."""
    pieces, merges = ["a", "b"], []
    for _ in range(draw(st.integers(0, 12))):
        pair = (draw(st.sampled_from(pieces)), draw(st.sampled_from(pieces)))
        if pair not in merges:
            merges.append(pair)
            pieces.append(pair[0] + pair[1])
    return merges


@given(learned_merges(), st.lists(st.text(alphabet="abc", min_size=1, max_size=12), max_size=8))
@example(merges=[("aa", "a"), ("a", "a")], words=["aaaa"])  # each "aa", left to right, before "aaa"
def test_merges_join_the_lowest_ranked_pair_first(merges, words):  # "c" is in no merge
    apply = Merges(merges).apply
    for word in words:
        assert apply(word) == merged_by_definition(word, merges)
