"""train.corpus: where a corpus's bytes are cut into chunks and its text into pieces, and that no cut
changes a document's ids (the property test of that is test_prepare's)."""

import io
import re
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygpt.tokenizer import BPETokenizer, GPT1Tokenizer
from train import corpus

BPE = BPETokenizer.train(["the cat sat on the mat"], 270)


def chunks_of(data, kind="words", cuts="words", chunk_bytes=1, block=4):
    """The chunks a Planner cuts `data` into, fed `block` bytes at a time."""
    with mock.patch.object(corpus, "CHUNK_BYTES", chunk_bytes):
        planner = corpus.Planner(kind, cuts, "utf-8", "strict", chunk_bytes)
        stream = io.BytesIO(data)
        while piece := stream.read(block):
            planner.feed(piece)
        return planner.finish()


def test_every_line_end_cuts_a_file_lf_crlf_and_cr_alike():
    for end in (b"\n", b"\r\n", b"\r"):
        data = end.join([b"ab", b"cd", b"ef", b"gh"])
        starts = [chunk.start for chunk in chunks_of(data, "lines", "lines", chunk_bytes=3)]
        assert starts == [0, 4 + len(end), 6 + 2 * len(end)]
        assert [chunk.line for chunk in chunks_of(data, "lines", "lines", 3)][1] == 1 + (end != b"\r")


def test_a_stretch_without_line_ends_is_cut_at_white_space_then_at_a_bound():
    words = b"alpha beta gamma delta"
    assert [c.start for c in chunks_of(words, chunk_bytes=4)] == [0, 5, 10, 16]
    assert [c.start for c in chunks_of(words, "lines", "lines", chunk_bytes=4)] == [0]  # GPT-1's fix: a line
    minified = b"abc,def,ghi" * 3
    with mock.patch.object(corpus, "CHUNK_BYTES", 2):  # bounds after 2 chunks' worth without white space
        cuts = [c.start for c in chunks_of(minified, chunk_bytes=2)]
    assert len(cuts) > 1 and all(
        minified[i - 1 : i].isalnum() and minified[i : i + 1] == b"," for i in cuts[1:]
    )
    nbsp = "a\u00a0 b".encode()  # no cut after a white space that is not ASCII
    assert [c.start for c in chunks_of(nbsp, chunk_bytes=1)] == [0]


def test_paragraphs_end_chunks_at_blank_lines_and_records_at_line_ends():
    text = b"one two\r\n\r\nthree four\n\nfive"
    chunks = chunks_of(text, "paragraphs", "lines", chunk_bytes=1)
    assert [(c.start, c.begins) for c in chunks] == [(0, True), (7, True), (21, True)]
    records = chunks_of(b'{"text": "a"}\n{"text": "b"}\n{"text": "c"}\n', "records", "words", chunk_bytes=5)
    assert [c.start for c in records] == [0, 14, 28]


def test_a_chunk_records_the_html_tag_before_it_and_a_byte_that_does_not_decode():
    chunks = chunks_of(b"a <b>\nc d\ne f", "lines", "lines", chunk_bytes=2)
    assert [c.angle for c in chunks] == [False, True, True]
    planner = corpus.Planner("words", "words", "utf-8", "strict")
    for block in (b"fine\nline two \xc3", b"\x28 here\n"):
        planner.feed(block)
    planner.finish()
    assert planner.problem == "line 2: not valid ENCODING at byte 14 (invalid continuation byte)"


@settings(max_examples=60, deadline=None)
@given(
    words=st.lists(
        st.sampled_from(["a", "bb", "ccc,", "d.e", " ", "  ", "\n", "é", "&", "<x>"]), max_size=200
    ),
    piece=st.integers(1, 12),
    cuts=st.sampled_from(["words", "lines"]),
)
def test_no_piece_held_exceeds_the_piece_size_by_more_than_a_word(words, piece, cuts):
    text = "".join(words)
    with mock.patch.object(corpus, "PIECE", piece):
        pieces = list(corpus.read_pieces(text.encode(), 0, cuts))
    assert "".join(pieces) == text.replace("\r\n", "\n")
    words = re.findall(r"\s+|\S+", text)  # a piece is white space and a word, or (with "lines") a line
    line = max(map(len, text.split("\n"))) if cuts == "lines" else 0
    limit = 2 * piece + sum(sorted(map(len, words))[-2:]) + line
    assert all(len(p) <= limit for p in pieces)


def test_a_line_of_a_file_with_no_line_end_is_read_in_pieces_of_about_the_piece_size():
    line = b"lorem ipsum dolor sit amet, consectetur " * 20_000  # 800 KB on one line
    with mock.patch.object(corpus, "PIECE", 1 << 14):
        for cuts in ("words", "lines"):  # ASCII without "&": GPT-1's fix has nothing to do in it
            pieces = list(corpus.read_pieces(line, 0, cuts))
            assert max(map(len, pieces)) <= (1 << 15) and "".join(pieces).encode() == line
        assert len(list(corpus.read_pieces(line + "é".encode(), 0, "lines"))) == 1  # held whole


def test_a_json_record_without_its_text_is_an_error_naming_the_file_and_line():
    def read(data, key="text"):
        return list(corpus.records(data, key, "words", "utf-8", "strict", ("f.jsonl", 7)))

    assert read(b'{"text": "a _start_"}\n\n{"text": null}\n{"text": "b"}\n') == [
        ("a _start_", True),
        ("b", True),
    ]
    for data, why in [
        (b'{"body": "a"}\n', "f.jsonl: line 7: no 'text' in it (--json-key names the text's field)"),
        (b'{"text": 3}\n', "f.jsonl: line 7: its 'text' is a JSON number, not text"),
        (b'{"text": "a"}\n[1]\n', "f.jsonl: line 8: a JSON array, not a record"),
        (b"null\n", "f.jsonl: line 7: a JSON null, not a record"),
        (b"{not json\n", "f.jsonl: line 7: not a JSON record"),
    ]:
        with pytest.raises(ValueError, match=why.replace("(", r"\(").replace(")", r"\)")):
            read(data)


def test_the_tokenizer_says_where_its_text_may_be_cut():
    assert corpus.cuts_of(BPE) == "words"
    assert corpus.cuts_of(BPETokenizer.train(["the cat"], 270, normalizer="gpt1")) == "lines"
    assert corpus.cuts_of(GPT1Tokenizer({"<unk>": 0, "a</w>": 1}, [])) == "lines"
