"""Data-parallel training: several processes (ranks), one model each, every rank on its own share
of each batch, their gradients summed before every optimizer step so the models stay equal.

MPI starts the processes and coordinates them (`mpirun -n 4 python -m train.pretrain
--distributed ...`, through mpi4py); between GPUs the gradients travel through NCCL (CuPy's
cupy.cuda.nccl), on the CPU through MPI itself. Only numpy buffers and mpi4py's uppercase,
buffer-based calls are used: nothing is pickled.

A run without --distributed gets a Group of one process, whose collectives return at once, so
the training loops have a single code path, and mpi4py is never imported.
"""

import contextlib
import hashlib
import os
import sys
import time
import traceback

import numpy as np

from autograd import backend
from autograd.backend import get_array_module

MPI_INSTALL_HINT = "pip install 'tinygpt[mpi]' (mpi4py and MPICH), or mpi4py built on your cluster's MPI"
UNIQUE_ID_BYTES = 128  # the size of NCCL's ncclUniqueId
ABORT_GRACE_S = 1.0  # seconds for a failing rank's last words to reach the launcher


def pack(arrays, out=None):
    """The arrays one after another in one flat array, written into `out` when it is given (a
    buffer reused step after step) and fits; they must share a dtype and a device."""
    dtypes = {a.dtype for a in arrays}
    if len(dtypes) != 1:
        raise ValueError(f"pack: the arrays must share one dtype, got {sorted(map(str, dtypes))}")
    xp, size = get_array_module(*arrays), sum(a.size for a in arrays)
    if out is None or out.size != size or out.dtype != arrays[0].dtype or get_array_module(out) is not xp:
        out = xp.empty(size, dtype=arrays[0].dtype)
    offset = 0
    for a in arrays:
        out[offset : offset + a.size] = a.reshape(-1)
        offset += a.size
    return out


def unpack(flat, shapes):
    """Views of the flat array shaped as `shapes`, in order: pack's inverse, without copies."""
    sizes = [int(np.prod(shape, dtype=np.int64)) for shape in shapes]
    if sum(sizes) != flat.size:
        raise ValueError(f"unpack: {flat.size} numbers do not make the shapes {list(shapes)} ({sum(sizes)})")
    ends = np.cumsum(sizes)
    return [flat[end - size : end].reshape(shape) for size, end, shape in zip(sizes, ends, shapes)]


def launch_ranks(parser, args, body):
    """body(parser, args, group) as one rank of --distributed's job (or alone without it); a missing
    MPI is a usage error, and a rank that fails ends the whole job."""
    try:
        group = start(args.distributed)
    except RuntimeError as error:
        parser.error(str(error))
    with group.abort_on_error():
        body(parser, args, group)


def start(distributed):
    """The Group of this process: with `distributed`, every rank of the MPI job it belongs to
    (whose ranks other than 0 then print nothing to stdout); else a group of one."""
    if not distributed:
        return Group()
    try:
        from mpi4py import MPI
    except ImportError:
        raise RuntimeError(f"--distributed needs mpi4py and an MPI library: {MPI_INSTALL_HINT}") from None
    group = Group(MPI.COMM_WORLD, MPI)
    if not group.main:
        sys.stdout = open(os.devnull, "w")  # rank 0 speaks for the job
    return group


class Group:
    """The ranks of one training job, as seen from one of them: `rank` of `size`, `main` on rank 0.

    Called by every rank at the same point of the program, in the same order: a rank that skips
    one leaves the others waiting.
    """

    def __init__(self, comm=None, mpi=None):
        self.comm, self.MPI, self.nccl = comm, mpi, None
        self.rank, self.size = (comm.Get_rank(), comm.Get_size()) if comm is not None else (0, 1)
        self.main = self.rank == 0
        self._buffer = None  # the flat gradient buffer, kept from step to step
        self._together = False

    def command(self, module):
        """How to start `module` again with this job's number of ranks (for a resume hint)."""
        if self.size == 1:
            return f"python -m {module}"
        return f"mpirun -n {self.size} python -m {module} --distributed"

    # ----- devices -------------------------------------------------------------------------------
    def device(self, name):
        """This rank's device, from --device: 'auto' or 'cuda' give each rank of a machine a GPU of
        its own (its rank on the machine); 'cuda:N' is that GPU, for one rank per machine. Between
        GPUs the ranks then connect through NCCL."""
        if self.size > 1 and (name in ("auto", "cuda") or str(name).startswith("cuda:")):
            name = self._gpu_of_this_rank(name)
        device = backend.parse_device(name)
        backend.use_device(device)  # where every array of the run goes, GPU N's for cuda:N
        if self.size > 1:
            self.check_same("device kind (cpu or cuda)", device.split(":")[0].encode())
            if device != "cpu":
                self._connect_gpus(backend.gpu_index(device))
        return device

    def _gpu_of_this_rank(self, name):
        """The GPU that --device `name` gives this rank, where two ranks of a machine never share one:
        NCCL refuses that, with an error about a duplicate GPU from deep inside. Every rank takes
        part in the split into machines, with or without GPUs, so that none is left waiting."""
        machine = self.comm.Split_type(self.MPI.COMM_TYPE_SHARED)  # the ranks that share this machine
        rank_here, ranks_here = machine.Get_rank(), machine.Get_size()
        machine.Free()
        if not backend.cuda_available():
            return name  # 'auto' falls back to the CPU; 'cuda' meets parse_device's clear error
        if name not in ("auto", "cuda"):
            if ranks_here > 1:
                raise ValueError(
                    f"{name!r} puts all {ranks_here} ranks of this machine on one GPU, which NCCL "
                    f"refuses: pass --device cuda (one GPU per rank), or start one rank per machine"
                )
            return name
        gpus = backend.device_count()
        if ranks_here > gpus:
            raise ValueError(
                f"{ranks_here} ranks on a machine with {gpus} GPU(s): NCCL needs one GPU per rank, "
                f"so start at most {gpus} ranks per machine (mpirun -n), or pass --device cpu"
            )
        return f"cuda:{rank_here}"

    def _connect_gpus(self, index):
        """Join the ranks' NCCL communicator from GPU `index` (the current device); rank 0 draws
        its id, which the others receive over MPI."""
        try:
            nccl = backend.nccl()
        except ImportError:
            raise RuntimeError(
                "--distributed on GPUs needs NCCL, which CuPy did not find: install it where "
                "CuPy looks (CuPy's installation guide, 'Additional CUDA Libraries'), or use "
                "--device cpu"
            ) from None
        # the id is NCCL's 128 bytes, which CuPy 14 gives and takes as `bytes`: sent as they are
        unique_id = np.zeros(UNIQUE_ID_BYTES, dtype=np.uint8)
        if self.main:
            unique_id[:] = np.frombuffer(nccl.get_unique_id(), dtype=np.uint8)
        self.comm.Bcast(unique_id, root=0)
        self.nccl = nccl.NcclCommunicator(self.size, unique_id.tobytes(), self.rank)
        self._nccl_types = {np.dtype(np.float32): nccl.NCCL_FLOAT32, np.dtype(np.float64): nccl.NCCL_FLOAT64}
        self._nccl_sum = nccl.NCCL_SUM

    # ----- the collectives of training -------------------------------------------------------------
    def broadcast_parameters(self, params):
        """Give every rank rank 0's values of the parameters (one flat broadcast)."""
        if self.size == 1:
            return
        flat = pack([p.data for p in params])
        if self.nccl is not None:
            nccl_type = self._nccl_types[flat.dtype]
            self.nccl.bcast(flat.data.ptr, flat.size, nccl_type, 0, backend.current_stream())
        else:
            self.comm.Bcast(flat, root=0)
        for p, values in zip(params, unpack(flat, [p.shape for p in params])):
            p.data[...] = values

    def reduce_gradients(self, params, weight):
        """Replace every parameter's gradient by the sum over the ranks of `weight` times it, in
        one allreduce over a flat buffer. With weight 1/size that is the mean; a rank whose share of
        the batch holds a fraction w of what counts (examples, tokens) passes w, and the sum is the
        gradient of the whole batch. A parameter without a gradient counts as zero."""
        if self.size == 1:
            return
        grads = [p.grad if p.grad is not None else p.xp.zeros(p.shape, dtype=p.dtype) for p in params]
        flat = self._buffer = pack(grads, self._buffer)
        flat *= weight
        if self.nccl is not None:
            self.nccl.allReduce(
                flat.data.ptr,
                flat.data.ptr,
                flat.size,
                self._nccl_types[flat.dtype],
                self._nccl_sum,
                backend.current_stream(),
            )
        else:
            self.comm.Allreduce(self.MPI.IN_PLACE, flat, op=self.MPI.SUM)
        for p, grad in zip(params, unpack(flat, [p.shape for p in params])):
            p.grad = grad

    def sum(self, values):
        """The sums over the ranks of a few numbers (losses, counts, flags), as float64 numpy."""
        values = np.array(values, dtype=np.float64)
        if self.size > 1:
            self.comm.Allreduce(self.MPI.IN_PLACE, values, op=self.MPI.SUM)
        return values

    def any(self, flag):
        """True on every rank when `flag` is true on any (a Ctrl-C that reached some ranks first)."""
        return bool(self.sum([bool(flag)])[0])

    def barrier(self):
        if self.size > 1:
            self.comm.Barrier()

    def check_same(self, what, data):
        """Raise ValueError on a rank whose bytes `data` differ from rank 0's (a hash is compared):
        the ranks of a job must read the same data, else they would train on different things."""
        if self.size == 1:
            return
        digest = np.frombuffer(hashlib.sha256(data).digest(), dtype=np.uint8)
        first = digest.copy()
        self.comm.Bcast(first, root=0)
        if not np.array_equal(first, digest):
            raise ValueError(
                f"rank {self.rank} has another {what} than rank 0: every rank must be "
                f"started with the same files and settings"
            )

    # ----- ending ----------------------------------------------------------------------------------
    def exit_together(self, status):
        """Leave with `status` (an exit code, or a message for rank 0 to print), called by every
        rank at the same point: once all are there, so none is cut off in the middle of a write."""
        self.barrier()
        self._together = True
        sys.exit(status if self.main or isinstance(status, int) else 1)

    @contextlib.contextmanager
    def abort_on_error(self):
        """Around a rank's work: an error in one rank (an exception, or an exit with a non-zero
        status that the ranks did not take together) prints its message and ends the whole job
        through MPI_Abort, instead of leaving the other ranks waiting for it forever."""
        try:
            yield
        except SystemExit as stop:
            if self.size > 1 and not self._together and stop.code not in (None, 0):
                if not isinstance(stop.code, int):
                    print(f"rank {self.rank}: {stop.code}", file=sys.stderr, flush=True)
                self._abort(stop.code if isinstance(stop.code, int) else 1)
            raise
        except BaseException:
            if self.size > 1:
                print(f"rank {self.rank} of {self.size} failed:", file=sys.stderr)
                traceback.print_exc()
                self._abort(1)
            raise

    def _abort(self, status):
        """End every rank through MPI_Abort. The launcher drops what it has not yet passed on from
        the ranks' output when it ends them, so this rank's message gets a moment to go through
        first; and MPI_Abort may return before the launcher ends this rank, which then leaves at
        once, with nothing more to print or clean up."""
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(ABORT_GRACE_S)
        self.comm.Abort(status)
        os._exit(status)
