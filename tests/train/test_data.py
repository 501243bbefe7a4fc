"""The token cache, the windows and the order of batches."""

import builtins
import errno
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinygpt.tokenizer import BPETokenizer
from train import data

TEXTS = ["one two three four five six seven eight nine ten " * 20, "a second text, shorter. " * 10]


@pytest.fixture(scope="module")
def tokenizer():
    return BPETokenizer.train(TEXTS, 300)


def test_the_token_cache_is_written_once_and_reused(tokenizer, tmp_path):
    ids, path, reused = data.tokenize_corpus(TEXTS, tokenizer, cache=tmp_path)
    again, same_path, reused_again = data.tokenize_corpus(TEXTS, tokenizer, cache=tmp_path)
    assert not reused and reused_again and path == same_path
    np.testing.assert_array_equal(np.asarray(again), ids)
    np.testing.assert_array_equal(ids, [i for text in TEXTS for i in tokenizer.encode(text)])


def test_another_corpus_or_tokenizer_gets_another_cache_file(tokenizer, tmp_path):
    _, path, _ = data.tokenize_corpus(TEXTS, tokenizer, cache=tmp_path)
    _, other_text, _ = data.tokenize_corpus(TEXTS[:1], tokenizer, cache=tmp_path)
    _, other_tokenizer, _ = data.tokenize_corpus(TEXTS, BPETokenizer.train(TEXTS, 290), cache=tmp_path)
    assert len({path, other_text, other_tokenizer}) == 3


def damaged(blob, how):
    """A cache file's bytes, damaged in one of the ways a crash, a full disk or a stray write leaves."""
    return {
        "cut short": blob[:-3],
        "cut in its header": blob[:20],
        "empty": b"",
        "an id changed": blob[:-2] + bytes([blob[-2] ^ 1, blob[-1]]),
        "bare ids, no header": blob[data.CACHE_HEADER.size :],
    }[how]


@pytest.mark.parametrize(
    "how", ["cut short", "cut in its header", "empty", "an id changed", "bare ids, no header"]
)
def test_a_damaged_token_cache_is_named_and_written_again(tokenizer, tmp_path, how):
    """A cache file that is not whole is never read as ids: a warning names it, the corpus is
    tokenized again, and the file written afresh is reused by the next run."""
    ids, path, _ = data.tokenize_corpus(TEXTS, tokenizer, cache=tmp_path)
    Path(path).write_bytes(damaged(Path(path).read_bytes(), how))
    with pytest.warns(UserWarning, match=rf"^{re.escape(path)}: not a whole token cache"):
        again, same_path, reused = data.tokenize_corpus(TEXTS, tokenizer, cache=tmp_path)
    assert same_path == path and not reused
    np.testing.assert_array_equal(again, ids)
    third, _, reused = data.tokenize_corpus(TEXTS, tokenizer, cache=tmp_path)
    assert reused
    np.testing.assert_array_equal(third, ids)


def full_disk(path, mode="r", *args, **kwargs):
    """open(), as on a disk that fills up: a cache file takes a few bytes, then no more."""
    f = builtins.open(path, mode, *args, **kwargs)
    if ".partial-" in str(path):
        f.write(b"a few bytes")
        f.write = no_space
    return f


def no_space(data):
    """A write to a full disk."""
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def read_only(path, mode="r", *args, **kwargs):
    """open(), as in a folder that this process may read but not write (root may write anywhere)."""
    if "w" in mode:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
    return builtins.open(path, mode, *args, **kwargs)


@pytest.mark.parametrize("fault", ["full disk", "read-only folder", "TINYGPT_CACHE is a file"])
def test_a_cache_that_cannot_be_written_is_a_warning_and_leaves_nothing(
    tokenizer, tmp_path, monkeypatch, fault
):
    """The ids come back all the same, a one-line warning names the file and the reason, and no
    .partial file is left behind."""
    folder = tmp_path / "tokens"
    folder.mkdir()
    cache, reason = folder, {"full disk": "No space left", "read-only folder": "Permission denied"}.get(fault)
    if fault == "full disk":
        monkeypatch.setattr(data, "open", full_disk, raising=False)
    elif fault == "read-only folder":
        folder.chmod(0o555)
        if os.geteuid() == 0:
            monkeypatch.setattr(data, "open", read_only, raising=False)
    else:
        (tmp_path / "a file").write_text("not a folder")
        monkeypatch.setenv("TINYGPT_CACHE", str(tmp_path / "a file"))
        cache, reason = None, "Not a directory"
    with pytest.warns(
        UserWarning, match=rf": cannot write the token cache \({reason}.*\); going on"
    ) as caught:
        ids, path, reused = data.tokenize_corpus(TEXTS, tokenizer, cache=cache)
    assert [str(w.message).split(": ")[0] for w in caught] == [path] and "\n" not in str(caught[0].message)
    assert not reused and not os.path.exists(path) and os.listdir(folder) == []
    np.testing.assert_array_equal(ids, [i for text in TEXTS for i in tokenizer.encode(text)])


def test_partial_files_of_writers_that_are_gone_are_removed(tokenizer, tmp_path):
    """Writing the cache removes the .partial-<pid> files of processes that no longer run, and those
    untouched for ten minutes; a live process's fresh one stays."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    names = {"dead": f"a.uint16.partial-{int(gone.stdout)}", "old": f"b.uint16.partial-{os.getppid()}"}
    names["live"] = f"c.uint16.partial-{os.getppid()}"
    for name in names.values():
        (tmp_path / name).write_bytes(b"half a cache")
    os.utime(tmp_path / names["old"], (time.time() - 3600,) * 2)
    _, path, _ = data.tokenize_corpus(TEXTS, tokenizer, cache=tmp_path)
    assert sorted(os.listdir(tmp_path)) == sorted([Path(path).name, names["live"]])


@given(st.integers(2, 200), st.integers(1, 8))
def test_windows_are_contiguous_and_cover_every_target_once(length, n_ctx):
    ids = np.arange(length)
    if length - 1 < n_ctx:
        with pytest.raises(ValueError, match="fewer than one window"):
            data.Windows(ids, n_ctx)
        return
    windows = data.Windows(ids, n_ctx)
    targets = np.concatenate([windows.window(i)[1:] for i in range(windows.count)])
    assert all(len(windows.window(i)) == n_ctx + 1 for i in range(windows.count))
    np.testing.assert_array_equal(targets, np.arange(1, windows.count * n_ctx + 1))


@given(st.integers(0, 50), st.integers(0, 3))
def test_the_batch_of_a_step_depends_only_on_step_and_seed(step, seed):
    windows = data.Windows(np.arange(401), 10)
    np.testing.assert_array_equal(
        windows.training_batch(step, 4, seed), windows.training_batch(step, 4, seed)
    )
    per_epoch = windows.count // 4
    epoch = np.concatenate([windows.training_batch(s, 4, seed)[:, 0] for s in range(per_epoch)])
    assert len(set(epoch.tolist())) == per_epoch * 4  # no window twice within an epoch


def test_another_epoch_or_seed_gives_another_order():
    """One Windows object asked for epochs and seeds in turn: each (seed, epoch) has an order of its
    own, the one a fresh object gives, however the asks before it went; the batches of the same
    place in two epochs differ."""
    windows = data.Windows(np.arange(401), 10)
    pairs = [(0, 0), (0, 1), (1, 1), (1, 0), (0, 0), (1, 0), (0, 1), (0, 0)]
    orders = {}
    for seed, epoch in pairs:
        order = windows.order(seed, epoch).tolist()
        assert order == data.Windows(np.arange(401), 10).order(seed, epoch).tolist(), (seed, epoch)
        assert orders.setdefault((seed, epoch), order) == order
    assert len({tuple(order) for order in orders.values()}) == len(orders) == 4
    per_epoch = windows.count // 4
    for step in range(per_epoch):
        assert not np.array_equal(
            windows.training_batch(step, 4, 0), windows.training_batch(step + per_epoch, 4, 0)
        )
        assert not np.array_equal(windows.training_batch(step, 4, 0), windows.training_batch(step, 4, 1))


def test_split_holds_out_the_end_and_refuses_a_tiny_corpus():
    train, val = data.split(np.arange(1000), 0.1, 8)
    assert len(val) == 100 and val[0] == 900 and len(train) == 900
    with pytest.raises(ValueError, match="too few"):
        data.split(np.arange(20), 0.1, 16)


def test_unigram_baseline_is_the_perplexity_of_the_training_frequencies():
    train, val = np.array([0, 0, 0, 1]), np.array([0, 1])
    p0, p1 = 4 / 7, 2 / 7  # add-one smoothing over a vocabulary of 3
    assert data.unigram_perplexity(train, val, 3) == pytest.approx(np.exp(-(np.log(p0) + np.log(p1)) / 2))


def test_read_corpus_reads_crlf_as_lf_and_decodes_as_asked(tmp_path):
    """Line ends become "\\n" (Moby Dick's Gutenberg file has "\\r\\n"); a Latin-1 file is named,
    and read with encoding="latin-1"."""
    (tmp_path / "a.txt").write_bytes(b"Call me Ishmael.\r\nSome years ago\r\rnever mind.\r\n")
    (tmp_path / "b.txt").write_bytes("Caf\xe9 au lait.\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"b\.txt: line 1: not valid UTF-8 at byte 3 .*encoding='latin-1'"):
        data.read_corpus([tmp_path])
    texts = data.read_corpus([tmp_path], encoding="latin-1")
    assert texts == ["Call me Ishmael.\nSome years ago\n\nnever mind.\n", "Café au lait.\n"]
