"""Reading text files: every file that does not decode named at once, the encoding and the handler
of bad bytes chosen by the caller, and line ends read as Python's text mode reads them; writing a
file whole or not at all."""

import errno
import os
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygpt.files import UndecodableFiles, check_apart, find_text_files, read_text_files, write_whole


def books(folder):
    """A folder of two Latin-1 books around a UTF-8 one; returns their texts, in file order."""
    texts = {"a.txt": "Un café noir.\n", "b.txt": "Plain and good.\n", "c.txt": "Line one.\nDéjà vu.\n"}
    for name, text in texts.items():
        (folder / name).write_bytes(text.encode("utf-8" if name == "b.txt" else "latin-1"))
    return list(texts.values())


def test_every_file_that_does_not_decode_is_named_with_its_line_and_byte(tmp_path):
    books(tmp_path)
    with pytest.raises(UndecodableFiles) as refused:
        read_text_files(tmp_path)
    assert refused.value.problems == [
        f"{tmp_path / 'a.txt'}: line 1: not valid UTF-8 at byte 6 (invalid continuation byte)",
        f"{tmp_path / 'c.txt'}: line 2: not valid UTF-8 at byte 11 (invalid continuation byte)",
    ]
    assert str(refused.value).endswith(
        "convert them, or pass errors='replace' (bad bytes become U+FFFD) or encoding='latin-1'"
    )
    assert refused.value.advice(flags=True).endswith(
        "pass --errors replace (bad bytes become U+FFFD) or --encoding latin-1"
    )


def test_the_caller_chooses_the_encoding_or_what_becomes_of_bad_bytes(tmp_path):
    texts = books(tmp_path)
    assert read_text_files(tmp_path, encoding="latin-1") == texts
    assert read_text_files(tmp_path, errors="replace") == [
        text.replace("é", "\ufffd").replace("à", "\ufffd") for text in texts
    ]
    assert read_text_files(tmp_path, errors="ignore")[0] == "Un caf noir.\n"


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from(["a", "é", "\n", "\r", "\r\n", "\ufeff"]), max_size=12))
def test_line_ends_are_those_of_python_text_mode_and_a_bom_is_dropped(tmp_path_factory, pieces):
    path = tmp_path_factory.mktemp("text") / "t.txt"
    path.write_bytes("".join(pieces).encode("utf-8"))
    with open(path, encoding="utf-8-sig") as f:  # text mode: universal newlines
        expected = f.read()
    assert read_text_files(path) == [expected]


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=40))
def test_any_bytes_read_with_replace_and_strict_reads_them_or_names_the_byte(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("bytes") / "b.txt"
    path.write_bytes(data)
    replaced = data.decode("utf-8", "replace").removeprefix("\ufeff")
    assert read_text_files(path, errors="replace") == [re.sub("\r\n?", "\n", replaced)]
    try:
        decoded = data.decode("utf-8")
    except UnicodeDecodeError as error:
        with pytest.raises(
            UndecodableFiles,
            match=rf"^{re.escape(str(path))}: line \d+: not valid UTF-8 at byte {error.start} ",
        ):
            read_text_files(path)
    else:
        assert read_text_files(path) == [re.sub("\r\n?", "\n", decoded.removeprefix("\ufeff"))]


def test_find_text_files_takes_files_folders_and_globs(tmp_path):
    (tmp_path / "sub").mkdir()
    for name in ("a.txt", "sub/b.txt", "c.md"):
        (tmp_path / name).write_text("x")
    assert find_text_files(tmp_path) == [tmp_path / "a.txt", tmp_path / "sub" / "b.txt"]
    assert find_text_files([str(tmp_path / "*.md"), tmp_path / "a.txt"]) == [
        tmp_path / "c.md",
        tmp_path / "a.txt",
    ]


@pytest.mark.parametrize(
    "output, read, how",
    [("run", "run", "is"), ("run", "run/data.txt", "holds"), ("run/out", "run", "lies inside")],
)
def test_an_output_that_is_holds_or_lies_inside_an_input_is_named(tmp_path, output, read, how):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "data.txt").write_text("text")
    (tmp_path / "link").symlink_to(tmp_path / "run")
    for out in (tmp_path / output, tmp_path / output.replace("run", "link")):  # a link is followed
        with pytest.raises(ValueError) as error:
            check_apart(
                str(out), [("--other", str(tmp_path / "elsewhere")), ("--data", str(tmp_path / read))]
            )
        assert str(error.value).startswith(f"{out} {how} --data {tmp_path / read}: ")


def test_an_output_beside_its_inputs_passes_and_a_glob_is_taken_by_its_matches(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("text")
    check_apart(
        str(tmp_path / "run"), [("--data", str(tmp_path / "data")), ("--data", str(tmp_path / "run2"))]
    )
    with pytest.raises(ValueError, match="holds --data .*a.txt"):
        check_apart(str(tmp_path / "data"), [("--data", str(tmp_path / "data" / "*.txt"))])


def test_write_whole_replaces_a_file_at_once_or_leaves_it_as_it_was(tmp_path, monkeypatch):
    path = tmp_path / "out.json"
    path.write_bytes(b"old")
    write_whole(str(path), b"new")
    assert path.read_bytes() == b"new" and os.listdir(tmp_path) == ["out.json"]

    def full_disk(descriptor):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match=re.escape(f"No space left on device: '{path}'")):
        write_whole(str(path), b"newer")
    assert path.read_bytes() == b"new" and os.listdir(tmp_path) == ["out.json"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
def test_write_whole_writes_a_device_as_it_is_and_names_it_when_it_fails():
    write_whole("/dev/null", b"gone")
    with pytest.raises(OSError, match="No space left on device: '/dev/full'"):
        write_whole("/dev/full", b"x" * 10_000)
    assert os.path.exists("/dev/full") and not os.path.isfile("/dev/full")
