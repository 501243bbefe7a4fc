"""The windows, the order of batches, the split and the unigram baseline."""

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
