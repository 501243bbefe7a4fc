"""train/distributed.py within one process: the flat buffer that carries the gradients, the
per-rank dropout seeds, and the group of one that a run without --distributed gets."""

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import autograd as ag
from autograd import backend, nn
from train.distributed import Group, dropout_seed, pack, unpack

from .runs import ROOT

shapes = st.lists(st.lists(st.integers(0, 4), max_size=3).map(tuple), min_size=1, max_size=5)


@given(shapes=shapes, seed=st.integers(0, 2**32 - 1))
def test_pack_then_unpack_gives_back_the_arrays(shapes, seed):
    """Any shapes (empty and 0-d ones too): the flat array is the arrays one after another, and
    unpack's pieces are views of it with the arrays' values."""
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
    flat = pack(arrays)
    assert flat.shape == (sum(a.size for a in arrays),) and flat.dtype == np.float32
    np.testing.assert_array_equal(flat, np.concatenate([a.reshape(-1) for a in arrays]))
    pieces = unpack(flat, shapes)
    for piece, array in zip(pieces, arrays):
        assert piece.shape == array.shape
        np.testing.assert_array_equal(piece, array)
        assert piece.size == 0 or np.shares_memory(piece, flat)


def test_pack_fills_a_given_buffer_and_makes_a_new_one_when_it_does_not_fit(device):
    device = backend.parse_device(device)
    arrays = [
        backend.to_device(np.arange(6, dtype=np.float32).reshape(2, 3), device),
        backend.to_device(np.array([7.0, 8.0], dtype=np.float32), device),
    ]
    buffer = pack(arrays)
    assert backend.device_of(buffer) == backend.device_of(arrays[0])
    assert pack(arrays, buffer) is buffer
    np.testing.assert_array_equal(backend.to_numpy(buffer), [0, 1, 2, 3, 4, 5, 7, 8])
    assert pack(arrays[:1], buffer) is not buffer  # 6 numbers, not 8
    assert pack([a.astype(np.float64) for a in arrays], buffer).dtype == np.float64


def test_pack_and_unpack_refuse_what_does_not_fit():
    with pytest.raises(ValueError, match="one dtype"):
        pack([np.zeros(2, np.float32), np.zeros(2, np.float64)])
    with pytest.raises(ValueError, match=r"5 numbers do not make the shapes \[\(2, 2\)\]"):
        unpack(np.zeros(5), [(2, 2)])


def test_dropout_seeds_rank_0_repeats_one_process_and_the_others_differ():
    assert dropout_seed(7, 12, 0) == 7 * 1_000_003 + 12
    seeds = {dropout_seed(7, step, rank) for step in range(50) for rank in range(4)}
    assert len(seeds) == 200
    assert dropout_seed(7, 12, 3) == dropout_seed(7, 12, 3)


def test_a_group_of_one_leaves_everything_as_it_is():
    group = Group()
    assert (group.rank, group.size, group.main) == (0, 1, True)
    ag.manual_seed(0)
    layer = nn.Linear(3, 2)
    before = [p.data.copy() for p in layer.parameters()]
    layer.weight.grad = np.ones((3, 2), np.float32)
    group.broadcast_parameters(layer.parameters())
    group.reduce_gradients(layer.parameters(), 0.5)
    assert all(np.array_equal(p.data, b) for p, b in zip(layer.parameters(), before))
    np.testing.assert_array_equal(layer.weight.grad, np.ones((3, 2)))
    assert layer.bias.grad is None
    np.testing.assert_array_equal(group.sum([1.5, 2]), [1.5, 2.0])
    assert group.any(True) and not group.any(False)
    group.check_same("anything", b"only one rank")
    with pytest.raises(ZeroDivisionError), group.abort_on_error():
        raise ZeroDivisionError("a failure inside the job")
    with pytest.raises(SystemExit) as stop:
        group.exit_together("a message")
    assert stop.value.code == "a message"


def test_a_run_without_distributed_never_imports_mpi4py(tmp_path):
    """Without --distributed, pretraining runs as before and mpi4py stays out of the process."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The cat sat on the mat and the dog sat on the log. " * 60, encoding="utf-8")
    script = (
        "import sys; from train import pretrain; pretrain.main(sys.argv[1:]); "
        "assert 'mpi4py' not in sys.modules, 'mpi4py was imported'"
    )
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            "--data",
            str(corpus),
            "--out",
            str(tmp_path / "run"),
            "--n-layer",
            "1",
            "--n-embd",
            "16",
            "--n-head",
            "2",
            "--n-ctx",
            "16",
            "--vocab-size",
            "280",
            "--batch-size",
            "2",
            "--steps",
            "2",
            "--sample-tokens",
            "2",
            "--device",
            "cpu",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TINYGPT_CACHE": str(tmp_path / "cache")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
