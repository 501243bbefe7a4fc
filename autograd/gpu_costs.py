"""What a step costs a GPU, counted on the CPU: the kernels it launches and the bytes they move.

    with gpu_costs.count_launches(run=False) as cost:  # work of the emulated device ("cuda-emulated")
        step()
    cost.kernels, cost.by_category(), cost.by_name(), cost.bytes_by_category()
    gpu_costs.compare(cost, names)                     # beside the kernels a GPU's profiler saw

Each operation of the emulated device (autograd/emulator/__init__.py) is told to the count, which records
what CuPy 14 launches for it on a GPU (read in CuPy's source) as Launches: name as a profiler shows it,
category, bytes read, bytes written. The rules:
  - the project's kernels: one launch, named as exported; an array argument's bytes are read where its C
    parameter is const, else written (an output also read counts once); Adam's and clipping's kernels
    reach their tensors through tables of pointers, counted from the tensors' sizes (TABLES), and Adam's
    writes the bfloat16 copies its table of them points to (COPIES);
  - a product (products.matmul): one cuBLAS call, bfloat16 in and float32 out included (gemmEx); no bytes;
  - a ufunc: one kernel, cupy_<ufunc>__<types>, inputs read and outputs written; a reduction: CUB's where
    CuPy's default accelerator takes it (all axes, or the trailing ones of a C-ordered array, in its own
    type: cupy/cuda/cub.pyx); else, over all axes of a contiguous array, CuPy's own two passes of CUB's
    block reduction (cupy/_core/_cub_reduction.pyx); else cupy_sum, cupy_max, ... (_with_dtype for
    another type);
  - astype to another type, copy, a reshape or ascontiguousarray that cannot be a view: one cupy_copy (a
    cast where the types differ); views, empty, astype without a copy: nothing; zeros: a memset; ones,
    full, fill: cupy_fill (a memset for 0); between host and device: a memcpy;
  - an index array: a gather (cupy_take), or a scatter; argsort: a copy of the keys, an index sequence
    and CUB's radix sort, in one tile up to RADIX_TILE keys, else a histogram, a scan and a pass per byte
    of the keys (the onesweep sort); where, arange, concatenate, searchsorted, and any other NumPy function
    of the device's arrays: one kernel.

Checked against the profiler on an H100 (bench/gpu_check.py's profile, 2026-11-26, CuPy 14.2: a GPT-1
step at batch 8, bench/results/gpu-profile-nvidia-h100-80gb-hbm3.json), the model gives every kernel of
the project by name and every category's launches exactly in bf16 (653: 49 cupy_sum, 48 + 49 casts, 48
bfloat16 + float32 adds, 49 adds, one Adam kernel, 147 products; CUB's sort and reduction kernels, which a
first count had as one kernel each, were read off the profile's names). Left out:
  - cuBLAS's choice of kernels by shape, type and GPU: in fp32 and tf32 it splits the reduction
    dimension of one product a layer into a second kernel (159 against the model's 147);
  - memcpys and memsets are counted (category "copies") but left out of `kernels` and compare(), as the
    profiler's count of bench/gpu_check.py leaves them out.
Bytes are what each kernel is given, once each: the traffic of a kernel that reads an array several times
(attention's key tiles, once per query tile) or only in part is more or less; products' is left out.
"""

import contextlib
import functools
import re
from collections import Counter
from typing import NamedTuple

import numpy as np

from . import emulator
from .emulator import kernels as emulator_kernels
from .kernels import compiling

CATEGORIES = ("attention", "matrix products", "layer norm", "elementwise", "reductions", "casts")
CATEGORIES += ("optimizer", "embedding", "loss", "dropout", "copies", "other")
PROJECT = {  # the project's kernels (autograd/kernels/cuda) by the start of their names
    "attention_": "attention",
    "layer_norm_": "layer norm",
    "residual_layer_norm_": "layer norm",
    "gelu_": "elementwise",
    "dropout_": "dropout",
    "cross_entropy_": "loss",
    "embedding_": "embedding",
    **dict.fromkeys(("column_partials", "column_sums"), "reductions"),
    **dict.fromkeys(("adam_step", "chunk_squares", "clip_factor", "scale_chunks"), "optimizer"),
}
TABLES = {"adam_step": (4, 3), "chunk_squares": (1, 0), "scale_chunks": (1, 1)}  # tensors read, written
COPIES = {"adam_step": 4}  # the argument of pointers to bfloat16 copies written beside them (0: none)
REDUCTIONS = {"add": "sum", "multiply": "prod", "maximum": "max", "minimum": "min"}
REDUCING = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "amax": np.maximum, "min": np.minimum}
REDUCING |= {"amin": np.minimum}  # xp.sum(a, axis) is a.sum(axis), as CuPy's own cupy.sum is
CUB_SUMS = {np.dtype(t) for t in (np.int64, np.uint64, np.float16, np.float32, np.float64)}  # cub.pyx
# keys CUB sorts in one tile: the 512 position ids did on an H100, the 4,096 token ids did not
RADIX_TILE = 512
CUB_OTHERS = CUB_SUMS | {np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32)}
PRODUCTS = {"product", "dot", "vdot", "inner", "tensordot", "einsum"}  # product: products.matmul's
NOTHING = {"broadcast_to", "expand_dims", "swapaxes", "moveaxis", "transpose", "split", "squeeze"}
NOTHING |= {"empty", "empty_like", "may_share_memory", "shares_memory", "result_type"}


class Launch(NamedTuple):
    name: str  # as a profiler shows it
    category: str
    read: int = 0  # bytes
    written: int = 0


# the kernels of libraries, by a part of their names as a profiler shows them (in any case), the first match:
# cuBLAS's (nvjet on Hopper), CUB's and thrust's, and PyTorch's, for the profile of a step beside PyTorch's
LIBRARY_KERNELS = (
    (r"flash|fmha|sdpa|attention", "attention"),  # cuDNN's and PyTorch's, some of them on cutlass
    (r"gemm|gemv|cutlass|xmma|splitKreduce|cublas|nvjet", "matrix products"),
    (r"layer_?norm|gammabeta", "layer norm"),
    (r"softmax|nll_loss|cross_entropy", "loss"),
    (r"dropout", "dropout"),
    (r"index_?select|embedding", "embedding"),
    (r"multi_tensor_apply|adam", "optimizer"),
    (r"direct_copy|copy_kernel", "casts"),
    (r"fillfunctor", "copies"),
    (r"sort|search|thrust", "other"),
    (r"reduce|^cupy_cub_|^cupy_(sum|prod|max|min|mean)(_with_dtype)?$", "reductions"),
    (r"^cupy_|elementwise_kernel", "elementwise"),
)


def category(name):
    """The category of a kernel, by its name as the model gives it or as CUDA's profiler shows it."""
    kind = next((kind for start, kind in PROJECT.items() if name.startswith(start)), None)
    if kind is not None:
        return kind
    if name.startswith(("Memcpy", "Memset", "cupy_fill", "cupy_take", "cupy_concatenate", "cupy_scatter")):
        return "copies"
    if name.startswith("cupy_copy__"):  # cupy_copy__<from>_<to>
        return "casts" if len(set(name.split("__")[1].split("_"))) > 1 else "copies"
    found = (kind for pattern, kind in LIBRARY_KERNELS if re.search(pattern, name, re.IGNORECASE))
    return next(found, "other")


def is_project_kernel(name):
    """Whether a kernel is one of autograd/kernels/cuda's (by its name, as the profiler shows it)."""
    return name.startswith(tuple(PROJECT))


@contextlib.contextmanager
def count_launches(run=True):
    """`with count_launches() as cost:` records in `cost`, a Count, each launch a GPU would make for the
    work of the emulated device inside the block (work on the CPU launches nothing; a block inside it
    counts its own work, which the outer one does not see). run=False: the project's kernels and
    products.matmul's products are checked but not run, their outputs left uninitialised (a GPT-1 step
    in seconds), and NumPy's warnings about the values computed from them silenced."""
    before, emulator.counter = emulator.counter, Count(run)
    try:
        with np.errstate(all="ignore") if not run else contextlib.nullcontext():
            yield emulator.counter
    finally:
        emulator.counter = before


class Count:
    """The launches (`launches`, in order) of the work inside one count_launches block, and summaries."""

    def __init__(self, run=True):
        self.run, self.launches, self._inside = run, [], False

    @property
    def total(self):
        return len(self.launches)

    @property
    def kernels(self):
        """The launches less the runtime's memcpys and memsets: what a profiler's kernel count counts."""
        return sum(is_kernel(launch.name) for launch in self.launches)

    def by_category(self):
        counts = Counter(launch.category for launch in self.launches)
        return {kind: counts[kind] for kind in CATEGORIES if counts[kind]}

    def by_name(self):
        return dict(Counter(launch.name for launch in self.launches).most_common())

    def bytes_by_category(self):
        """{category: (bytes read, bytes written)}, for the categories that move any."""
        moved = {kind: [0, 0] for kind in CATEGORIES}
        for launch in self.launches:
            moved[launch.category][0] += launch.read
            moved[launch.category][1] += launch.written
        return {kind: tuple(both) for kind, both in moved.items() if any(both)}

    # ----- what the emulated device tells

    def kernel(self, kernel, args):
        """A launch of one of the project's kernels (an emulator.kernels.Kernel); whether to run it."""
        name = kernel.name.rsplit("_", 1)[0]
        if name in TABLES:  # float32 tensors of `sizes`, the first int64 array argument
            sizes = next(
                emulator.host_view(a) for a in args if isinstance(a, np.ndarray) and a.dtype == np.int64
            )
            read, written = (n * 4 * int(sizes.sum()) for n in TABLES[name])
            if name in COPIES:  # 2 bytes a number of each tensor that has a copy
                written += 2 * int(sizes[emulator.host_view(args[COPIES[name]]) != 0].sum())
            self.launches.append(Launch(kernel.name, category(kernel.name), read, written))
            return self.run
        const = _const_parameters(kernel.library.name)[kernel.name]
        arrays = [(a, c) for a, c in zip(args, const) if isinstance(a, np.ndarray)]
        read, written = [a for a, c in arrays if c], [a for a, c in arrays if not c]
        self.launches.append(_launch(kernel.name, read, written))
        return self.run

    def operation(self, name, args, kwargs, compute):
        """An operation of the device (emulator.counted): what CuPy launches for it recorded, and its
        result given back. The operations it makes itself are part of it, not counted again."""
        if self._inside:
            return compute()
        self._inside = True
        try:
            if name == "__array_function__":  # (self, function, types, args, kwargs)
                name, args, kwargs = args[1].__name__, args[3], args[4]
            if name == "product" and not self.run:  # (a, b, dtype): left uninitialised
                result = np.empty((args[0].shape[0], args[1].shape[1]), args[2]).view(type(args[0]))
            else:
                result = compute()
            self.launches += _launches(name, args, kwargs, result)
            return result
        finally:
            self._inside = False


def _launches(name, args, kwargs, result):
    """What CuPy launches for the operation `name` of arguments args, kwargs that gave `result`."""
    if name == "__array_ufunc__":  # (self, ufunc, method, *inputs)
        return _ufunc(args[1], args[2], args[3:], kwargs, result)
    if isinstance(getattr(np, name, None), np.ufunc):  # a ufunc as the device module's function
        return _ufunc(getattr(np, name), "__call__", args, kwargs, result)
    if name in PRODUCTS:
        return [_product(*args[:2], result)]
    if name in REDUCING:
        axis = kwargs.get("axis", args[1] if len(args) > 1 else None)
        return _reduction(REDUCING[name], args[0], {**kwargs, "axis": axis}, result)
    if name in RULES:
        return RULES[name](args, result)
    if name in NOTHING:
        return []
    arrays = [a for a in args if isinstance(a, np.ndarray)]
    return [_launch(f"cupy_{name}", arrays, [result] if isinstance(result, np.ndarray) else [])]


RULES = {  # operation: (its arguments, its result) -> its launches; a method's first argument is self
    "__getitem__": lambda args, result: _gather(args[1], result),
    "__setitem__": lambda args, result: _assign(*args),
    "astype": lambda args, result: [] if result is args[0] else [_copy(args[0], result)],
    "copy": lambda args, result: [_copy(args[0], result)],
    "reshape": lambda args, result: _copy_unless_view(args[0], result),
    "fill": lambda args, result: [_fill(*args)],
    "get": lambda args, result: [_launch("Memcpy DtoH", [args[0]])],
    "asarray": lambda args, result: _to_device(args[1], result),  # args[0]: the device's module
    "zeros": lambda args, result: [_launch("Memset", written=[result])],
    "ones": lambda args, result: [_launch("cupy_fill", written=[result])],
    "where": lambda args, result: [_launch(_typed("where", [*args, result]), args, [result])],
    "arange": lambda args, result: [_launch(f"cupy_arange__{result.dtype}", written=[result])],
    "concatenate": lambda args, result: [_launch("cupy_concatenate", args[0], [result])],
    "argsort": lambda args, result: _argsort(args[0], result),
    "searchsorted": lambda args, result: [_launch("cupy_searchsorted_kernel", args[:2], [result])],
}
RULES |= {"ravel": RULES["reshape"], "array": RULES["asarray"], "ascontiguousarray": RULES["asarray"]}
RULES |= {"zeros_like": RULES["zeros"], "ones_like": RULES["ones"], "full_like": RULES["ones"]}
RULES |= {"full": RULES["ones"], "stack": RULES["concatenate"]}


def _ufunc(ufunc, method, inputs, kwargs, result):
    """The launches of a ufunc's call (or reduction, ...)."""
    out = kwargs.get("out") or (result,)
    if ufunc is np.matmul:
        return [_product(*inputs, out[0])]
    if method == "reduce":
        return _reduction(ufunc, inputs[0], kwargs, out[0])
    name = "true_divide" if ufunc is np.divide else ufunc.__name__
    name = name if method == "__call__" else f"{name}_{method}"
    return [_launch(_typed(name, [*inputs, *out]), inputs, out)]


def _reduction(ufunc, x, kwargs, result):
    """CUB's reduction where CuPy's default accelerator takes it (cub.pyx, cub_reduction), else CuPy's."""
    kind = REDUCTIONS.get(ufunc.__name__, ufunc.__name__)
    axis, dtype = kwargs.get("axis", 0), kwargs.get("dtype")
    axes = tuple(range(x.ndim)) if axis is None else tuple(sorted(np.atleast_1d(axis) % max(x.ndim, 1)))
    cub_types = CUB_SUMS if kind in ("sum", "prod") and dtype is None else CUB_OTHERS
    if (dtype is None or np.dtype(dtype) == x.dtype) and x.dtype in cub_types:
        if len(axes) == x.ndim and (x.flags.c_contiguous or x.flags.f_contiguous):
            return [_launch("cub::DeviceReduceSingleTileKernel", [x], [result])]
        if x.flags.c_contiguous and axes == tuple(range(x.ndim - len(axes), x.ndim)):
            return [_launch("cub::DeviceSegmentedReduceKernel", [x], [result])]
    name = f"cupy_{kind}{'' if dtype is None else '_with_dtype'}"
    if len(axes) == x.ndim and x.flags.c_contiguous:  # CUB's block reduction, two passes
        return [
            _launch(f"cupy_cub_{name[5:]}_pass1", [x]),
            _launch(f"cupy_cub_{name[5:]}_pass2", written=[result]),
        ]
    return [_launch(name, [x], [result])]


def _indexes(index):
    """Whether an index holds arrays (or lists): a gather or a scatter, not a view."""
    return any(isinstance(i, (np.ndarray, list)) for i in (index if isinstance(index, tuple) else (index,)))


def _gather(index, result):
    """a[index]: a view, or a gather of the entries the index arrays name."""
    return [_launch("cupy_take", [result, *_index_arrays(index)], [result])] if _indexes(index) else []


def _index_arrays(index):
    return [i for i in (index if isinstance(index, tuple) else (index,)) if isinstance(i, np.ndarray)]


def _assign(target, index, value):
    """target[index] = value: a scatter through an index array, else a copy into the view, or a fill."""
    if _indexes(index):
        return [_launch("cupy_scatter_update", [value, *_index_arrays(index)], [target[index]])]
    return [_copy(value, target[index]) if isinstance(value, np.ndarray) else _fill(target[index], value)]


def _fill(array, value):
    """CuPy's fill: a memset for 0 in a C-ordered array, else a kernel."""
    return _launch("Memset" if value == 0 and array.flags.c_contiguous else "cupy_fill", written=[array])


def _to_device(a, result):
    """asarray, array, ascontiguousarray: a memcpy from the host; on the device, a copy unless a view does."""
    if not isinstance(a, emulator.EmulatedArray):
        return [_launch("Memcpy HtoD", written=[result])]
    return _copy_unless_view(a, result)


def _copy_unless_view(source, result):
    return [] if np.may_share_memory(source, result) else [_copy(source, result)]


def _copy(source, result):
    """The cupy_copy kernel that writes `result` from `source` (a cast where their types differ)."""
    return _launch(_typed("copy", [source, result]), [source], [result])


def _argsort(keys, result):
    """A copy of the keys, an index sequence and CUB's radix sort (cupy/_core/_routines_sorting.pyx,
    cupy/cuda/cupy_thrust.cu): one kernel for a tile of keys, else the onesweep sort's histogram, scan
    and one pass for each byte of the keys."""
    sort = "cub::detail::radix_sort::DeviceRadixSort"
    if keys.size <= RADIX_TILE:
        passes = [_launch(f"{sort}SingleTileKernel", [keys, result], [keys, result])]
    else:
        passes = [_launch(f"{sort}HistogramKernel", [keys]), _launch(f"{sort}ExclusiveSumKernel")]
        passes += [_launch(f"{sort}OnesweepKernel", [keys, result], [keys, result])] * keys.itemsize
    return [_copy(keys, keys), _launch("cub::detail::transform::transform_kernel", written=[result]), *passes]


def _product(a, b, result):
    """One cuBLAS call: which kernels, and so their traffic, are cuBLAS's choice, left out."""
    return Launch(f"cublas_gemm__{a.dtype}_{b.dtype}_{result.dtype}", "matrix products")


def _launch(name, read=(), written=()):
    """A Launch of `name` that reads the arrays `read` and writes the arrays `written`."""
    return Launch(name, category(name), sum(map(_bytes, read)), sum(map(_bytes, written)))


def _bytes(a):
    """The bytes of an array's elements, one that broadcasting repeats counted once (0 for a number)."""
    if not isinstance(a, np.ndarray):
        return 0
    return int(np.prod([n for n, stride in zip(a.shape, a.strides) if stride])) * a.itemsize


def _typed(name, operands):
    """CuPy's name of an elementwise kernel: cupy_<name>__ and each operand's type, an array's dtype, a
    number's kind as the kernel takes it, the first array's (_kernel.pyx, _get_name_with_type)."""
    first = next((a.dtype for a in operands if isinstance(a, np.ndarray)), np.asarray(operands[0]).dtype)
    words = [a.dtype.name if isinstance(a, np.ndarray) else first.name.rstrip("0123456789") for a in operands]
    return f"cupy_{name}__{'_'.join(words)}"


@functools.cache
def _const_parameters(source):
    """{kernel: whether each of its parameters is const} of autograd/kernels/cuda/<source>.cu."""
    declared = emulator_kernels.kernel_declarations(compiling.text(source)).items()
    return {kernel: [p.split()[0] == "const" for p in params.split(",")] for kernel, params in declared}


def is_kernel(name):
    """A kernel, not a memcpy or memset of the CUDA runtime (which a profiler's kernel count leaves out)."""
    return not name.startswith(("Memcpy", "Memset"))


def compare(model, profiler_names):
    """How a Count agrees with the kernels a GPU profiler saw for the same step (their names), memcpys and
    memsets left out on both sides: {"total", "categories", "kernels" (the project's, by name): each
    (model, profiler)}, and "differences": one line for each that differs."""
    ours = Counter(launch.name for launch in model.launches if is_kernel(launch.name))
    theirs = Counter(filter(is_kernel, profiler_names))

    def side_by_side(key, names):
        table = {}
        for name in names:
            row = table.setdefault(key(name), [0, 0])
            row[0], row[1] = row[0] + ours[name], row[1] + theirs[name]
        return {k: tuple(row) for k, row in table.items()}

    names = ours.keys() | theirs.keys()
    categories = side_by_side(category, names)
    kernels = side_by_side(str, filter(is_project_kernel, names))
    total = (sum(ours.values()), sum(theirs.values()))
    rows = [("total", total), *categories.items(), *sorted(kernels.items())]
    differences = [f"{what}: model {m}, profiler {p}" for what, (m, p) in rows if m != p]
    return {"total": total, "categories": categories, "kernels": kernels, "differences": differences}
