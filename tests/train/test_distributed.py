"""train/distributed.py within one process: the flat buffer that carries the gradients, the
per-rank dropout seeds, the group of one that a run without --distributed gets, and the choice
of GPUs and the NCCL connection, with stand-ins for MPI, CuPy and NCCL."""

import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import autograd as ag
from autograd import backend, nn
from train.distributed import Group, pack, unpack

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
    np.testing.assert_array_equal(backend.to_host(buffer), [0, 1, 2, 3, 4, 5, 7, 8])
    assert pack(arrays[:1], buffer) is not buffer  # 6 numbers, not 8
    assert pack([a.astype(np.float64) for a in arrays], buffer).dtype == np.float64


def test_pack_and_unpack_refuse_what_does_not_fit():
    with pytest.raises(ValueError, match="one dtype"):
        pack([np.zeros(2, np.float32), np.zeros(2, np.float64)])
    with pytest.raises(ValueError, match=r"5 numbers do not make the shapes \[\(2, 2\)\]"):
        unpack(np.zeros(5), [(2, 2)])


@pytest.mark.parametrize("name", ["cpu", "cuda:1"])
def test_a_process_makes_its_device_the_current_one(name, monkeypatch):
    """--device cuda:1 puts the whole run on GPU 1: ids, positions, Adam's moments and every
    temporary are made where CuPy's current device is, so the run makes it GPU 1."""
    made_current = []
    monkeypatch.setattr(backend, "parse_device", lambda device: device)
    monkeypatch.setattr(backend, "use_device", made_current.append)
    assert Group().device(name) == name and made_current == [name]


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


# ----- GPUs and NCCL, with stand-ins ---------------------------------------------------------------
MPI = SimpleNamespace(COMM_TYPE_SHARED="shared")


class FakeComm:
    """An MPI communicator as one rank sees it: `rank` of `size`, `ranks_here` of them on each
    machine. Bcast from the root appends to the list `sent`; another rank takes from it in order,
    so a rank 1 run after rank 0 receives what rank 0 broadcast. `splits` counts the splits into
    machines."""

    def __init__(self, rank, size, ranks_here, sent):
        self.rank, self.size, self.ranks_here, self.sent = rank, size, ranks_here, sent
        self.splits = 0

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def Split_type(self, kind):
        assert kind == MPI.COMM_TYPE_SHARED
        self.splits += 1
        return FakeComm(self.rank % self.ranks_here, self.ranks_here, self.ranks_here, self.sent)

    def Bcast(self, buffer, root):
        if self.rank == root:
            self.sent.append(buffer.copy())
        else:
            buffer[...] = self.sent.pop(0)

    def Free(self):
        pass


def fake_nccl(available=True, unique_id=None):
    """cupy.cuda.nccl as CuPy 14 leaves it: without NCCL only `available`, false; with it an id to
    draw, as bytes, and a communicator that takes the id as bytes, as CuPy 14's typed
    NcclCommunicator(int ndev, bytes commId, int rank) does, and records its arguments in `made`."""
    if not available:
        return SimpleNamespace(available=False)
    made = []

    def communicator(ndev, comm_id, rank):
        if not isinstance(comm_id, bytes):  # Cython's check of a `bytes` argument
            raise TypeError(
                f"Argument 'commId' has incorrect type (expected bytes, got {type(comm_id).__name__})"
            )
        assert len(comm_id) == 128, "NCCL's unique id is 128 bytes"
        made.append((ndev, comm_id, rank))
        return made[-1]

    return SimpleNamespace(
        available=True,
        get_unique_id=lambda: unique_id,
        NcclCommunicator=communicator,
        made=made,
        NCCL_FLOAT32=7,
        NCCL_FLOAT64=8,
        NCCL_SUM=0,
    )


@pytest.fixture
def gpus(monkeypatch):
    """A machine with `gpus.count` GPUs (2 unless a test changes it) and CuPy, whose
    cupy.cuda.nccl is `gpus.cuda.nccl` (at first one without NCCL), reached through the real
    backend.nccl(); `gpus.used` lists the GPUs made current."""
    machine = SimpleNamespace(count=2, cuda=SimpleNamespace(nccl=fake_nccl(available=False)), used=[])
    monkeypatch.setattr(backend, "cupy", SimpleNamespace(cuda=machine.cuda))
    monkeypatch.setitem(sys.modules, "cupy", backend.cupy)
    monkeypatch.setitem(sys.modules, "cupy.cuda", machine.cuda)
    monkeypatch.setattr(backend, "device_count", lambda: machine.count)
    monkeypatch.setattr(backend, "cuda_available", lambda: machine.count > 0)
    monkeypatch.setattr(backend, "parse_device", lambda name: "cpu" if name == "auto" else name)
    monkeypatch.setattr(backend, "use_device", machine.used.append)
    return machine


def test_gpus_without_nccl_give_the_install_hint(gpus):
    """CuPy without NCCL: cupy.cuda.nccl imports with `available` false and no functions."""
    group = Group(FakeComm(0, 2, 2, []), MPI)
    with pytest.raises(RuntimeError, match="needs NCCL, which CuPy did not find: install it"):
        group.device("cuda")
    assert group.nccl is None


@pytest.mark.parametrize("name", ["auto", "cuda"])
def test_more_ranks_on_a_machine_than_gpus_are_refused_before_nccl(gpus, name):
    gpus.cuda.nccl = fake_nccl(unique_id=bytes(128))
    group = Group(FakeComm(1, 6, 3, []), MPI)  # two machines of 3 ranks, 2 GPUs each
    message = r"3 ranks on a machine with 2 GPU\(s\): .* start at most 2 ranks per machine"
    with pytest.raises(ValueError, match=message):
        group.device(name)
    assert gpus.used == [] and gpus.cuda.nccl.made == []


def test_one_gpu_for_several_ranks_of_a_machine_is_refused_before_nccl(gpus):
    gpus.cuda.nccl = fake_nccl(unique_id=bytes(128))
    group = Group(FakeComm(0, 4, 2, []), MPI)
    with pytest.raises(ValueError, match="'cuda:1' puts all 2 ranks of this machine on one GPU"):
        group.device("cuda:1")
    assert gpus.used == [] and gpus.cuda.nccl.made == []
    one_rank_per_machine = Group(FakeComm(0, 2, 1, []), MPI)
    assert one_rank_per_machine.device("cuda:1") == "cuda:1" and gpus.used == ["cuda:1"]


def test_without_gpus_every_rank_still_joins_the_split_and_auto_is_the_cpu(gpus):
    gpus.count = 0
    group = Group(FakeComm(0, 2, 2, []), MPI)
    assert group.device("auto") == "cpu" and group.comm.splits == 1 and group.nccl is None


@given(unique_id=st.binary(min_size=128, max_size=128))
def test_every_rank_gets_its_own_gpu_and_rank_0s_exact_nccl_id(gpus, unique_id):
    """Rank 0's id, any 128 bytes (NUL bytes and bytes over 127 among them), reaches rank 1
    unchanged, and each rank hands NCCL the id as bytes."""
    gpus.cuda.nccl, gpus.used[:] = fake_nccl(unique_id=unique_id), []
    sent = []  # what rank 0 broadcasts, for rank 1 to receive
    devices = [Group(FakeComm(rank, 2, 2, sent), MPI).device("cuda") for rank in (0, 1)]
    assert devices == ["cuda:0", "cuda:1"] and gpus.used == ["cuda:0", "cuda:1"]
    assert gpus.cuda.nccl.made == [(2, unique_id, 0), (2, unique_id, 1)]


@pytest.mark.gpu
def test_a_real_nccl_communicator_of_one_rank_sums_on_the_gpu():
    """CuPy's own NCCL: the id drawn and passed as the group does, then an allreduce over one rank."""
    try:
        backend.nccl()
    except ImportError as missing:
        pytest.skip(str(missing))
    group = Group(FakeComm(0, 1, 1, []), MPI)
    group._connect_gpus(0)
    flat = backend.to_device(np.arange(5, dtype=np.float32), "cuda:0")
    kind, stream = group._nccl_types[flat.dtype], backend.current_stream()
    group.nccl.allReduce(flat.data.ptr, flat.data.ptr, flat.size, kind, group._nccl_sum, stream)
    np.testing.assert_array_equal(backend.to_host(flat), np.arange(5))
