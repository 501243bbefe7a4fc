"""The emulated CUDA device's kernels: the CUDA sources of autograd/kernels/cuda, unchanged, compiled by
g++ for the CPU against autograd/emulator/cuda.h, and run there with a GPU's semantics (threads
as fibers, barriers, warp shuffles, shared memory that starts as NaN: see cuda.h and cuda.cpp).

    k = emulator_kernels.kernel("gelu", "gelu_forward", np.float32)   # as sources.kernel, same names
    args = (x, np.uintp(0), out, np.int64(1), np.int64(x.size), np.int32(32))  # no bias: x one row
    k((1, blocks), (256,), args)                               # as CuPy's RawKernel; `out` written in place

A launch takes NumPy arrays (any subclass, strided views included: the kernel gets the address of the
first element), NumPy scalars, and np.uintp(0) for a null pointer. What a GPU would refuse, or get wrong
silently or at random, is an EmulatorError here, naming the kernel:
  - an argument that does not fit its parameter (count, pointer or value, width, integer or floating,
    a Python number, whose width CuPy would guess), or in an op of the device a host NumPy array;
  - a write into a read-only array (a broadcast view; the gradient a backward is given);
  - a launch over a GPU's limits (threads per block, the kernel's __launch_bounds__, grid and block
    dimensions, 48 KB of static shared memory), or asking for dynamic shared memory;
  - a read or write outside an array argument: each array's memory is copied for the launch between
    two PROT_NONE pages (the first byte past its end faults), with NaN before its start (checked after);
  - a barrier or a warp shuffle that some thread of the block never reaches;
  - with thread_orders(...), a result that depends on the order of the threads between barriers. In the
    orders "written", "reversed" and "shuffled" all warps go through their shuffles in step; "warps" and
    "reversed warps" run one warp at a time (the written or reversed order, each warp alone up to its next
    barrier), so that a warp may write shared memory again before another has read it: a missing barrier.
    The blocks run one at a time, in the grid's order, reversed ("reversed", "reversed warps") or shuffled:
    blocks that count on each other's order (a counter of arrivals) show too.

Each source is built once into a shared library, kept in ~/.cache/autograd/emulator (or
$XDG_CACHE_HOME/autograd/emulator) under a hash of the source, the emulator, the flags and the
compiler. AUTOGRAD_EMULATOR_DEBUG=1 builds with -O0 -g, so that gdb can stop inside a kernel
(`break attention_forward_d64_f32 if threadIdx.x == 9`, then `print threadIdx`, `print sk[0][0]`);
it shows the file of autograd/kernels/cuda itself, which compiling.headed names in #line directives.
"""

import contextlib
import ctypes
import functools
import hashlib
import json
import math
import mmap
import os
import re
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

from .. import emulator
from ..kernels import compiling
from ..precision import bfloat16

EMULATOR = Path(__file__).parent  # cuda.h and cuda.cpp
# -ffp-contract=off: no a * b + c fused into an FMA (CUDA's __fmul_rn, __fadd_rn are never fused either);
# -U_FORTIFY_SOURCE: the fortified longjmp refuses to switch stacks (cuda.cpp's fibers)
FLAGS = ("-std=c++17", "-shared", "-fPIC", "-pthread", "-ffp-contract=off", "-U_FORTIFY_SOURCE")
FLAGS += ("-fvisibility=hidden",)  # only the launchers are exported
OPTIMISED, DEBUG = ("-O2",), ("-O0", "-g")  # -g: no macros (gdb finds none in a file named by #line)
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "autograd" / "emulator"
ORDERS = {"written": 0, "reversed": 1, "shuffled": 2, "warps": 3, "reversed warps": 4}  # cuda.cpp's Order
GRID_LIMITS, BLOCK_LIMITS = (2**31 - 1, 65535, 65535), (1024, 1024, 64)  # CUDA's, on every GPU since 2012
MAX_THREADS, MAX_SHARED = 1024, 48 * 1024  # per block; static shared memory
NAN_WORDS = np.full(mmap.PAGESIZE // 4, 0x7FC00000, np.uint32).tobytes()  # what lies before an array's start
C_NAMES = {"f4": "float", "f8": "double", "i4": "int", "i8": "long long", "b1": "bool", "u1": "unsigned char"}
C_NAMES |= {"u2": "unsigned short", "u4": "unsigned int", "u8": "unsigned long long"}

HOST_ARRAY = "a host NumPy array, which CuPy refuses for a GPU's kernel: pass the device's (xp.asarray)"
_orders, _seed = ("written",), 0
_lock = threading.Lock()  # one launch at a time: the fibers, the shared memory and the signals are global


class EmulatorError(RuntimeError):
    """A kernel did, or was asked to do, what a GPU does not allow or would do at random."""


@contextlib.contextmanager
def thread_orders(*orders, seed=0):
    """Inside the block, every launch runs once per order (of ORDERS; "shuffled": a shuffle seeded by
    `seed`, new at each barrier) on fresh copies of its arrays, and the results must agree
    bit for bit: a race between two barriers shows as a difference. (Memory that a kernel reaches through
    pointers stored in an array, as Adam's tables, is not copied: each order writes it in turn.)"""
    global _orders, _seed
    unknown = set(orders) - ORDERS.keys()
    if unknown or not orders:
        raise ValueError(f"thread orders are some of {list(ORDERS)}, not {orders}")
    before = _orders, _seed
    _orders, _seed = orders, seed
    try:
        yield
    finally:
        _orders, _seed = before


def kernel(name, function, dtype):
    """The kernel `function` of autograd/kernels/cuda/<name>.cu for arrays of `dtype`, as sources.kernel
    names it (compiling.exported), built for the emulated device."""
    return build(compiling.text(name), name).kernel(compiling.exported(name, function, dtype))


def build(text, name="source"):
    """The Library of a CUDA source's text (a sources.CudaSource's), built once per process and kept on
    disk; `name` names its files and its errors."""
    return _build(text, name, os.environ.get("AUTOGRAD_EMULATOR_DEBUG", "0") not in ("", "0"))


@functools.cache
def _build(text, name, debug):
    flags = FLAGS + (DEBUG if debug else OPTIMISED)
    emulator_files = [(EMULATOR / f).read_text() for f in ("cuda.h", "cuda.cpp")]
    key = repr((text, emulator_files, flags, _compiler())).encode()
    folder = _writable(CACHE) or Path(tempfile.mkdtemp(prefix="autograd-emulator-"))
    stem = folder / f"{name}-{hashlib.sha256(key).hexdigest()[:24]}"
    library, about = stem.with_suffix(".so"), stem.with_suffix(".json")
    if not (library.is_file() and about.is_file()):
        kernels = list(kernel_declarations(text))
        launchers = "".join(
            f"EMU_EXPORT int emu_launch_{k}(EmuLaunch* l, void** a) {{ return emu::launch(&{k}, l, a); }}\n"
            f"EMU_EXPORT void emu_params_{k}(char* out, size_t n) {{ emu::params(&{k}, out, n); }}\n"
            for k in kernels
        )
        unit = f'#include "cuda.h"\n#include "{stem.name}.cu"\n{launchers}'
        # the .cu is what gdb shows where no #line names a file; both are named by their content, so
        # one already there is kept (gdb warns of a .cu rewritten after its .so was built)
        for path, content in ((stem.with_suffix(".cu"), text), (stem.with_suffix(".cpp"), unit)):
            if not path.is_file():
                compiling.write_whole(path, content)
        partial = f"{library}.partial-{os.getpid()}"
        core = EMULATOR / "cuda.cpp"
        command = ["g++", *flags, "-I", str(EMULATOR), "-o", partial, f"{stem}.cpp", str(core)]
        with subprocess.Popen(command, stderr=subprocess.PIPE, text=True) as gxx:
            try:
                limits = ptx_limits(text, name)  # NVRTC, while g++ runs
            except BaseException:
                gxx.kill()
                raise
            errors = gxx.communicate()[1]
        if gxx.returncode:
            raise EmulatorError(f"{name}: g++ does not compile it for the emulator:\n{errors}")
        compiling.write_whole(about, json.dumps({"kernels": kernels, "limits": limits}))
        os.replace(partial, library)  # whole or not at all: another process may load it meanwhile
    return Library(name, library, **json.loads(about.read_text()))


@functools.cache
def _compiler():
    return subprocess.run(["g++", "--version"], capture_output=True, text=True, check=True).stdout


def _writable(folder):
    """`folder`, made if needed, or None where it cannot be written (then the build goes elsewhere)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return folder if os.access(folder, os.W_OK) else None
    except OSError:
        return None


def kernel_declarations(text):
    """{name: its parameter list} of the extern "C" __global__ functions of a source, found once the
    preprocessor has expanded it."""
    command = ["g++", "-E", "-P", "-x", "c++", "-std=c++17", "-"]
    done = subprocess.run(command, input=text, capture_output=True, text=True)
    if done.returncode:
        raise EmulatorError(f"g++ does not preprocess the source:\n{done.stderr}")
    pattern = r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(([^)]*)\)'
    return dict(re.findall(pattern, done.stdout))


def ptx_limits(text, name):
    """{kernel: [its __launch_bounds__ (0: none), its bytes of static shared memory]} from the PTX that
    NVRTC makes of the source (compiling.compiled), or None where NVRTC is not installed."""
    try:
        ptx = compiling.compiled(text, name, "compute_90").decode()
    except ImportError:
        return None
    except RuntimeError as error:
        raise EmulatorError(f"{name}: NVRTC: {error}") from error
    declared = r"\.shared\s+(?:\.align\s+\d+\s+)?\.[a-z](\d+)\s+(\w+)(?:\[(\d+)\])?\s*;"

    def size(bits, count):
        return int(bits) // 8 * int(count or 1)

    # shared variables used by several kernels are declared at the module's level, the others in a kernel
    module = {var: size(bits, count) for bits, var, count in re.findall(rf"^{declared}", ptx, re.M)}
    heads = list(re.finditer(r"\.(entry|func)\s+(?:\([^)]*\)\s*)?(\w+)", ptx))
    bodies = {h[2]: ptx[h.end() : nxt and nxt.start()] for h, nxt in zip(heads, heads[1:] + [None])}
    functions = [h[2] for h in heads if h[1] == "func"]
    limits = {}
    for head in (h for h in heads if h[1] == "entry"):
        reached, todo = set(), [head[2]]  # the kernel and the functions it calls
        while todo:
            reached.add(function := todo.pop())
            todo += [f for f in functions if f not in reached and re.search(rf"\b{f}\b", bodies[function])]
        used = sum(
            n for var, n in module.items() if any(re.search(rf"\b{var}\b", bodies[f]) for f in reached)
        )
        inside = sum(size(bits, count) for f in reached for bits, _, count in re.findall(declared, bodies[f]))
        bound = re.search(r"\.maxntid\s+(\d+),\s*(\d+),\s*(\d+)", bodies[head[2]])
        limits[head[2]] = [math.prod(map(int, bound.groups())) if bound else 0, used + inside]
    return limits


class _Launch(ctypes.Structure):
    """cuda.h's EmuLaunch."""

    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("order", ctypes.c_int),
        ("seed", ctypes.c_ulonglong),
        ("fault_address", ctypes.c_ulonglong),
        ("fault", ctypes.c_int),
        ("error_block", ctypes.c_uint * 3),
        ("error_thread", ctypes.c_uint * 3),
        ("message", ctypes.c_char * 512),
    ]


class Library:
    """One source built for the emulated device: its kernels by their exported names."""

    def __init__(self, name, path, kernels, limits):
        self.name, self.path, self.kernels, self.limits = name, path, kernels, limits
        self.loaded = {}
        self.dll = ctypes.CDLL(str(path))
        self.dll.emu_map_guarded.restype = ctypes.c_void_p
        self.dll.emu_map_guarded.argtypes = [ctypes.c_size_t]
        self.dll.emu_unmap_guarded.argtypes = [ctypes.c_void_p, ctypes.c_size_t]

    def kernel(self, name):
        if name not in self.kernels:
            raise EmulatorError(f"{self.name}.cu has no kernel {name} (it has {', '.join(self.kernels)})")
        if name not in self.loaded:
            self.loaded[name] = Kernel(self, name)
        return self.loaded[name]


class Kernel:
    """One kernel of a Library, called as CuPy's RawKernel: kernel(grid, block, args, shared_mem=0)."""

    def __init__(self, library, name):
        self.library, self.name = library, name
        self.launch = getattr(library.dll, f"emu_launch_{name}")
        self.launch.argtypes = [ctypes.POINTER(_Launch), ctypes.c_void_p]
        text = ctypes.create_string_buffer(4096)
        getattr(library.dll, f"emu_params_{name}")(text, ctypes.c_size_t(len(text)))
        self.params = text.value.decode().split(",")[:-1]  # "pf4": a float*, "vi8": a long long (cuda.h)
        self.max_threads, self.shared_bytes = (library.limits or {}).get(name, (0, 0))

    def __call__(self, grid, block, args, shared_mem=0):
        grid, block, args = _dims(grid), _dims(block), tuple(args)
        self.check_launch(grid, block, shared_mem)
        problems = [f"argument {i}: {p}" for i, p in enumerate(map(argument_problem, args, self.params)) if p]
        if emulator.current():  # in an op of the device, as on a GPU: its arrays only
            device = emulator.EmulatedArray
            host = [i for i, a in enumerate(args) if isinstance(a, np.ndarray) and not isinstance(a, device)]
            problems += [f"argument {i}: {HOST_ARRAY}" for i in host]
        if len(args) != len(self.params):
            problems.insert(0, f"{len(args)} arguments for {len(self.params)} parameters")
        if problems:
            raise EmulatorError(f"{self.name}: " + "; ".join(problems))
        if emulator.counter is not None and not emulator.counter.kernel(self, args):
            return  # counted, not run (autograd.gpu_costs)
        groups = _groups(args)
        with _lock:
            results = {order: self.run(grid, block, args, groups, order) for order in _orders}
        first, written = next(iter(results.items()))
        for order, result in results.items():
            for (low, _, members), a, b in zip(groups, written, result):
                if a != b:
                    i, element = _element(args, members, low + _first_difference(a, b))
                    raise EmulatorError(
                        f"{self.name}: the threads in the orders {first!r} and {order!r} give different "
                        f"bits at element {element} of argument {i}: a race between two barriers"
                    )
        for (low, _, members), result in zip(groups, written):
            if any(args[i].flags.writeable for i in members):
                ctypes.memmove(low, result, len(result))
            elif result != (before := ctypes.string_at(low, len(result))):
                i, element = _element(args, members, low + _first_difference(before, result))
                raise EmulatorError(
                    f"{self.name}: a thread writes element {element} of argument {i}, a read-only array"
                )

    def check_launch(self, grid, block, shared_mem):
        """A GPU's limits on a launch, the kernel's own (its __launch_bounds__ and shared memory) included."""
        problems = [f"{what} {dims}" for what, dims in (("grid", grid), ("block", block)) if min(dims) < 1]
        problems += [f"grid {grid} over CUDA's {GRID_LIMITS}" for n, m in zip(grid, GRID_LIMITS) if n > m][:1]
        problems += [
            f"block {block} over CUDA's {BLOCK_LIMITS}" for n, m in zip(block, BLOCK_LIMITS) if n > m
        ][:1]
        threads = math.prod(block)
        if threads > MAX_THREADS or 0 < self.max_threads < threads:
            problems.append(
                f"{threads} threads per block, over {min(MAX_THREADS, self.max_threads or MAX_THREADS)}"
            )
        if self.shared_bytes > MAX_SHARED:
            problems.append(f"{self.shared_bytes} bytes of static shared memory, over {MAX_SHARED}")
        if shared_mem:
            problems.append(f"shared_mem={shared_mem}: no kernel here declares dynamic shared memory")
        if problems:
            raise EmulatorError(f"{self.name}: " + "; ".join(problems))

    def run(self, grid, block, args, groups, order):
        """One launch in one order on fresh guarded copies of the arrays: their bytes after it, per group."""
        dll = self.library.dll
        copies = [_Copy(dll, low, high) for low, high, _ in groups]
        try:
            values = [None if isinstance(a, np.ndarray) else _bytes_of(a) for a in args]
            for copy, (low, _, members) in zip(copies, groups):
                for i in members:
                    values[i] = ctypes.c_void_p(copy.start + args[i].ctypes.data - low)
            pointers = (ctypes.c_void_p * max(1, len(values)))(*map(ctypes.addressof, values))
            launch = _Launch(grid, block, ORDERS[order], _seed)
            code = self.launch(ctypes.byref(launch), pointers)
            for copy, (_, _, members) in zip(copies, groups):
                if (before := copy.written_before_start()) is not None:
                    i, element = _element(args, members, copy.low - before, before_start=True)
                    message = f"a thread writes element {element} of argument {i}, before its start"
                    raise EmulatorError(f"{self.name}: {message}")
            if code:
                where = f"block {tuple(launch.error_block)} thread {tuple(launch.error_thread)}"
                what = launch.message.decode() if code == 1 else self.fault(launch, args, groups, copies)
                raise EmulatorError(f"{self.name}: {where}: {what}")
            return [copy.read() for copy in copies]
        finally:
            for copy in copies:
                copy.release()

    def fault(self, launch, args, groups, copies):
        """What a memory fault (cuda.cpp's on_fault) was, in the kernel's terms."""
        if launch.fault == 4:
            return "its stack overflowed (the emulator gives a thread 256 KB)"
        if launch.fault == 5:
            return "an arithmetic fault (an integer divided by 0?)"
        verb, address = {1: "reads", 2: "writes"}.get(launch.fault, "touches"), launch.fault_address
        for copy, (low, _, members) in zip(copies, groups):
            if copy.mapping <= address < copy.mapping + copy.mapped:
                past = address >= copy.start + copy.size
                i, element = _element(args, members, low + address - copy.start, before_start=not past)
                where = "past its end" if past else "before its start"
                return f"{verb} element {element} of argument {i}, {where}"
        if address < 65536:
            return f"{verb} address {address:#x}: through a null pointer"
        return f"{verb} address {address:#x}, outside every array argument"


def argument_problem(arg, param):
    """Why `arg` cannot be passed for a parameter described as cuda.h's emu::describe does, or None."""
    kind, width = param[1], int(param[2:])
    c = C_NAMES.get(param[1:], "void" if kind == "x" else f"{width}-byte type")
    if param[0] == "p":
        if isinstance(arg, np.ndarray):
            fits = kind in "xs" or (arg.dtype.itemsize == width and _kind(arg.dtype) == kind)
            return None if fits else f"a {arg.dtype} array for a {c}*"
        null = isinstance(arg, np.uintp) and arg == 0
        return None if null else f"{arg!r} for the pointer {c}*: an array, or np.uintp(0) for a null pointer"
    if isinstance(arg, np.ndarray):
        return f"an array for the value {c}"
    if not isinstance(arg, np.generic):
        return f"{type(arg).__name__} {arg!r}: only arrays and NumPy scalars have a fixed width"
    if arg.dtype.itemsize != width:
        return f"{arg.dtype} ({arg.dtype.itemsize} bytes) for {c} ({width} bytes)"
    if (arg.dtype.kind == "f") != (kind == "f"):
        return f"{arg.dtype} for {c}: an integer and a floating type"
    return None


def _bytes_of(scalar):
    """A NumPy scalar as the bytes of a kernel's parameter (np.uintp(0): a null pointer)."""
    data = scalar.tobytes()
    return (ctypes.c_char * len(data)).from_buffer_copy(data)


def _kind(dtype):
    """The kind of C type an array of `dtype` holds: bfloat16 is common.cuh's bf16, an unsigned short."""
    return "u" if dtype == bfloat16 or dtype.kind == "b" else dtype.kind


def _dims(dims):
    dims = tuple(int(n) for n in dims)
    return dims + (1,) * (3 - len(dims))


def _groups(args):
    """The array arguments grouped by the memory they share, as [low, high, [argument indices]]: views of
    one array (attention's q, k and v of one qkv) are copied together, and stay views of one copy."""
    bounds = sorted(
        (*np.lib.array_utils.byte_bounds(a), i) for i, a in enumerate(args) if isinstance(a, np.ndarray)
    )
    groups = []
    for low, high, i in bounds:
        if groups and low < groups[-1][1]:
            groups[-1][1] = max(groups[-1][1], high)
            groups[-1][2].append(i)
        else:
            groups.append([low, high, [i]])
    return groups


def _first_difference(a, b):
    """The offset of the first byte where two equally long bytes differ."""
    return int(np.argmax(np.frombuffer(a, np.uint8) != np.frombuffer(b, np.uint8)))


def _element(args, members, address, before_start=False):
    """(argument, element index) of a host address in a group: the argument whose first element is the
    nearest below it (the nearest above, before the group's start); the first of those that start there."""
    starts = sorted({args[i].ctypes.data: i for i in sorted(members, reverse=True)}.items())
    start, i = starts[0] if before_start else max(s for s in starts if s[0] <= address)
    return i, (address - start) // args[i].itemsize


class _Copy:
    """A group's bytes for one launch: a PROT_NONE page, NaN, the bytes, a PROT_NONE page."""

    def __init__(self, dll, low, high):
        self.dll, self.low, self.size = dll, low, high - low
        self.mapping = dll.emu_map_guarded(self.size)
        if not self.mapping:
            raise MemoryError(f"no memory for a copy of {self.size} bytes")
        page = mmap.PAGESIZE
        self.mapped = 2 * page + -(-self.size // page) * page
        self.start = self.mapping + self.mapped - page - self.size
        self.slack = self.start - self.mapping - page
        ctypes.memmove(self.mapping + page, NAN_WORDS, self.slack)
        ctypes.memmove(self.start, low, self.size)

    def written_before_start(self):
        """How many bytes before the start the first changed byte of the NaN lies, or None."""
        slack = np.frombuffer(ctypes.string_at(self.start - self.slack, self.slack), np.uint8)
        changed = np.flatnonzero(slack != np.frombuffer(NAN_WORDS, np.uint8, self.slack))
        return None if changed.size == 0 else int(self.slack - changed[0])

    def read(self):
        return ctypes.string_at(self.start, self.size)

    def release(self):
        self.dll.emu_unmap_guarded(self.mapping, self.size)
