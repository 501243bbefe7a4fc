"""Every launch that the Python launchers make of the CUDA kernels passes what the kernel takes: as many
arguments as it has parameters, in order, a device array for each pointer and a NumPy scalar of the
parameter's width and kind (integer or floating) for each value. CuPy's RawKernel passes the bytes it is
given, so a mismatch would be silent memory corruption on a GPU; here it is found in CI, with no GPU.

The kernels' parameters come from their sources twice: from the PTX that NVRTC compiles (the widths the
driver reads) and from the C parameter lists after the preprocessor (which of them are pointers, and of
what). The launches come from tests/fake_cuda.py's stand-in for CuPy, which records each one: every
launcher runs there, for float32 and bfloat16 and for each variant it launches, forward and backward."""

import os
import shutil
from typing import NamedTuple

import numpy as np
import pytest

import autograd as ag
from autograd import functional as F
from autograd.emulator import kernels as emulator_kernels
from autograd.functional import Embedding
from autograd.kernels import compiling
from autograd.optim import Adam, clip_grad_norm
from tests.helpers import ptx_of
from tinygpt import GPT, GPTConfig

from .. import fake_cuda

if not os.environ.get("CI"):  # CI installs NVRTC and g++: there a missing one must fail, not skip
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="pip install -e '.[nvrtc]'")
    if shutil.which("g++") is None:
        pytest.skip("needs g++ to preprocess the CUDA sources", allow_module_level=True)

SOURCES = sorted(path.stem for path in compiling.SOURCES.glob("*.cu"))
DTYPES = [np.dtype(np.float32), ag.bfloat16]
# the C types of the sources' parameters: each one's NumPy dtype (of a value, or of what a pointer points at)
C_TYPES = {
    "float": np.dtype(np.float32),
    "double": np.dtype(np.float64),
    "bf16": ag.bfloat16,
    "bool": np.dtype(np.bool_),
    "unsigned char": np.dtype(np.uint8),
    "int": np.dtype(np.int32),
    "unsigned int": np.dtype(np.uint32),
    "long long": np.dtype(np.int64),
    "unsigned long long": np.dtype(np.uint64),
}


class Param(NamedTuple):
    """One parameter of a compiled kernel: its C declaration, PTX type and width in bytes, and whether
    it is a pointer; `dtype` is the value's NumPy dtype, or for a pointer what it points at."""

    c: str
    ptx: str
    width: int
    pointer: bool
    dtype: np.dtype


# ----- the kernels' parameters, from the PTX and from the C source


def c_kernels(name):
    """{kernel name: [(C type less const, pointer?)]} of the extern "C" __global__ functions of a source
    once preprocessed by g++ (the macros that define them expanded)."""
    declarations = emulator_kernels.kernel_declarations(compiling.text(name))
    return {
        kernel: [c_type(p) for p in params.split(",") if p.strip()] for kernel, params in declarations.items()
    }


def c_type(declaration):
    """("unsigned int", False) for "unsigned int n", ("float", True) for "const float* __restrict__ x"."""
    words = declaration.replace("*", " ").split()[:-1]  # the last word is the parameter's name
    kept = [w for w in words if w not in ("const", "volatile", "__restrict__")]
    return " ".join(kept), "*" in declaration


@pytest.fixture(scope="module")
def signatures():
    """{kernel: (its PTX parameters, its C parameters)} for every entry point of every source."""
    found = {}
    for name in SOURCES:
        ptx = compiling.ptx_entries(ptx_of(name))
        c = c_kernels(name)
        found.update({kernel: (ptx[kernel], c.get(kernel)) for kernel in ptx})
        found.update({kernel: (None, c[kernel]) for kernel in c.keys() - ptx.keys()})
    return found


@pytest.fixture(scope="module")
def kernels(signatures):
    """{kernel: [Param]}: the PTX and C lists taken together (checked to agree by a test below)."""
    return {
        kernel: [
            Param(c_name, ptx, width, pointer, C_TYPES.get(c_name))
            for (ptx, width), (c_name, pointer) in zip(ptx_params, c_params)
        ]
        for kernel, (ptx_params, c_params) in signatures.items()
        if ptx_params is not None and c_params is not None
    }


def disagreements(kernel, ptx_params, c_params):
    """How a kernel's PTX and C parameter lists differ: a pointer must be 8 bytes, a value as wide as
    its C type, and floating exactly where the C type is."""
    if ptx_params is None or c_params is None:
        return [f"{kernel}: only in the {'C source' if ptx_params is None else 'PTX'}"]
    if len(ptx_params) != len(c_params):
        return [f"{kernel}: {len(ptx_params)} PTX parameters, {len(c_params)} in C"]
    found = []
    for i, ((ptx, width), (c_name, pointer)) in enumerate(zip(ptx_params, c_params)):
        dtype = C_TYPES.get(c_name)
        if dtype is None:
            found.append(f"{kernel} parameter {i}: C type {c_name} unknown here (add it to C_TYPES)")
            continue
        expected = (8, False) if pointer else (dtype.itemsize, dtype.kind == "f")
        if (width, ptx.startswith(".f")) != expected:
            found.append(f"{kernel} parameter {i}: C {c_name}{'*' * pointer} but PTX {ptx} ({width} bytes)")
    return found


def test_the_ptx_and_the_c_source_agree_on_every_kernels_parameters(signatures):
    """The two readings of each source name the same kernels with the same parameters: else the
    checks of the launches below would rest on a wrong reading."""
    problems = [p for kernel, (ptx, c) in signatures.items() for p in disagreements(kernel, ptx, c)]
    assert not problems, "\n".join(problems)


# ----- the check of one launch


def argument_problem(arg, param):
    """Why `arg` cannot be passed for `param`, or None when it can."""
    if isinstance(arg, fake_cuda.GpuArray):
        if not param.pointer:
            return f"a device array for the value {param.c}"
        if param.dtype is not None and arg.dtype != param.dtype:
            return f"a {arg.dtype} array for a {param.c}*"
        return None
    if not isinstance(arg, np.generic):
        return f"{type(arg).__name__} {arg!r}: only device arrays and NumPy scalars have a fixed width"
    if param.pointer:
        null = isinstance(arg, np.uintp) and arg == 0
        return None if null else f"the value {arg!r} ({arg.dtype}) for the pointer {param.c}*"
    if param.dtype is None:
        return f"{arg!r} for {param.c}, a C type unknown here"
    if arg.dtype.itemsize != param.width:
        return f"{arg.dtype} ({arg.dtype.itemsize} bytes) for {param.c} ({param.ptx}, {param.width} bytes)"
    if (arg.dtype.kind == "f") != (param.dtype.kind == "f"):
        return f"{arg.dtype} for {param.c}: an integer and a floating type"
    return None


def launch_problems(launch, params):
    """What is wrong with one recorded launch of a kernel whose parameters are `params` (None: a
    kernel the sources do not have), each naming the kernel and the argument."""
    if params is None:
        return [f"{launch.kernel}: no such kernel in {launch.source}.cu"]
    if len(launch.args) != len(params):
        return [f"{launch.kernel}: {len(launch.args)} arguments for {len(params)} parameters"]
    problems = (argument_problem(arg, param) for arg, param in zip(launch.args, params))
    return [f"{launch.kernel} argument {i}: {p}" for i, p in enumerate(problems) if p is not None]


# ----- the launchers, driven through the stand-in for CuPy


def on_gpu(rng, shape, dtype=np.float32):
    """A tensor of normal numbers on GPU 0 of the stand-in, wanting a gradient."""
    return ag.tensor(rng.standard_normal(shape), requires_grad=True, dtype=dtype, device="cuda:0")


def drive_layer_norm(rng, dtype):
    """Rows of a warp (width <= 1024) and of a block, with weight and bias, weight only, neither; and
    the residual layer norm's, with all three parameters and dropout, and with none and no dropout."""
    for width in (48, 2000):
        x, w, b = on_gpu(rng, (3, 5, width), dtype), on_gpu(rng, (width,)), on_gpu(rng, (width,))
        for weight, bias in ((w, b), (w, None), (None, None)):
            F.layer_norm(x, weight, bias).sum().backward()
        y = on_gpu(rng, (3, 5, width), dtype)
        F.residual_layer_norm(x, y, b, w, b, dropout_p=0.2).sum().backward()
        F.residual_layer_norm(x, y, None, None, None).sum().backward()


def drive_elementwise(rng, dtype):
    """GELU (with a float32 bias, its gradient wanted or not, and without), dropout and cross-entropy
    (with an ignored target), forward and backward."""
    F.gelu(on_gpu(rng, (4, 6), dtype)).sum().backward()
    F.gelu(on_gpu(rng, (4, 6), dtype), bias=on_gpu(rng, (6,))).sum().backward()
    F.gelu(on_gpu(rng, (4, 6), dtype), bias=on_gpu(rng, (6,)).detach()).sum().backward()
    F.dropout(on_gpu(rng, (4, 6), dtype), 0.3).sum().backward()
    F.cross_entropy(on_gpu(rng, (4, 10), dtype), np.array([1, 2, -100, 9])).backward()


def drive_attention(rng, dtype):
    """Both attention Functions with heads that take the d64 and the d128 kernels, causal or not,
    with dropout and without; 5 queries over 7 keys, as with a KV cache. Multi-head attention with no
    bias, a float32 one (the bf16 policy's) and one of qkv's type. float32 under the tf32 policy too
    (the tensor cores' tf32 kernels)."""
    for precision in [None, "tf32"] if dtype == np.float32 else [None]:
        with ag.use_precision(precision):
            attend_every_way(rng, dtype)


def attend_every_way(rng, dtype):
    for d in (32, 100):
        q, k, v = (
            on_gpu(rng, (2, 3, 5, d), dtype),
            on_gpu(rng, (2, 3, 7, d), dtype),
            on_gpu(rng, (1, 7, d), dtype),
        )
        for causal in (True, False):
            for p in (0.0, 0.2):
                F.scaled_dot_product_attention(q, k, v, causal=causal, dropout_p=p).sum().backward()
        for p in (0.0, 0.2):
            for bias in (None, on_gpu(rng, (6 * d,)), on_gpu(rng, (6 * d,), dtype)):
                F.multi_head_attention(on_gpu(rng, (2, 5, 6 * d), dtype), 2, p, bias=bias).sum().backward()


def drive_embedding(rng, dtype):
    """A table of `dtype` read into outputs of either type: every <read>_<write> kernel both ways."""
    ids = ag.tensor(np.array([[1, 3, 3, 0]]), device="cuda:0")
    for out_dtype in DTYPES:
        Embedding.apply(ids, on_gpu(rng, (11, 4), dtype), dtype=out_dtype).sum().backward()


def drive_optimiser(rng, dtype):
    """Adam (float32 only: the master weights), coupled and decoupled, with a parameter that has no
    gradient, and clip_grad_norm."""
    for mode in ("coupled", "decoupled"):
        params = [on_gpu(rng, (3, 4), dtype), on_gpu(rng, (5,), dtype), on_gpu(rng, (2,), dtype)]
        for p in params[:2]:
            p.grad = p.data * 0.5
        clip_grad_norm(params, 1.0)
        Adam(params, lr=1e-3, l2=0.01, l2_mode=mode).step()


def drive_gpt_step(rng, dtype):
    """One training step of a tiny GPT, in float32 or under bf16 (bfloat16 activations)."""
    ag.manual_seed(0)
    model = GPT(GPTConfig.tiny(n_layer=1)).to("cuda:1").train()
    opt = Adam(model.parameters(), lr=1e-3, l2=0.01)
    ids = rng.integers(0, model.config.vocab_size, (2, 9))
    with ag.use_precision("bf16" if dtype == ag.bfloat16 else "fp32"):
        loss = F.cross_entropy(model(ids[:, :-1]), ids[:, 1:])
        loss.backward()
    clip_grad_norm(model.parameters(), 1.0)
    opt.step()


DRIVES = [drive_layer_norm, drive_elementwise, drive_attention, drive_embedding, drive_gpt_step]


@pytest.fixture(scope="module")
def launches():
    """[(what drove it, Launch)] for every drive and dtype, and for the optimiser in float32."""
    recorded = []
    runs = [(drive, dtype) for drive in DRIVES for dtype in DTYPES] + [(drive_optimiser, DTYPES[0])]
    with pytest.MonkeyPatch.context() as patch:
        log = fake_cuda.install(patch)
        for drive, dtype in runs:
            start = len(log)
            with ag.random.use_masks(ag.random.MaskStream(0)):
                drive(np.random.default_rng(0), dtype)
            recorded += [(f"{drive.__name__}({dtype})", launch) for launch in log[start:]]
    return recorded


def test_every_launch_passes_what_its_kernel_takes(launches, kernels):
    """Each recorded launch, argument by argument, against its kernel's compiled parameters."""
    problems = [
        f"{driven}: {problem}"
        for driven, launch in launches
        for problem in launch_problems(launch, kernels.get(launch.kernel))
    ]
    assert not problems, "\n".join(problems)


def test_every_kernel_of_every_source_is_launched(launches, kernels):
    """A kernel that no launcher above launches is a kernel whose launches nothing checks."""
    launched = {launch.kernel for _, launch in launches}
    assert not kernels.keys() - launched, f"never launched: {sorted(kernels.keys() - launched)}"
    assert launched <= kernels.keys(), f"not in the sources: {sorted(launched - kernels.keys())}"


# ----- the check itself catches mistakes


def with_arg(i, value):
    """A change to a launch's arguments: argument i replaced by value(argument i)."""
    return lambda args: args[:i] + (value(args[i]),) + args[i + 1 :]


# layer_norm_forward_*(x, w, b, y, mean, rstd, long long rows, int width, float eps)
MISTAKES = {
    "an argument left out": (lambda args: args[:-1], "8 arguments for 9 parameters"),
    "np.int64 for an int": (with_arg(7, np.int64), "int64 (8 bytes) for int (.u32, 4 bytes)"),
    "np.int32 for a long long": (with_arg(6, np.int32), "int32 (4 bytes) for long long (.u64, 8 bytes)"),
    "np.int64 for a pointer": (with_arg(0, lambda a: np.int64(a.ctypes.data)), "for the pointer bf16*"),
    "a non-null np.uintp for a pointer": (with_arg(1, lambda a: np.uintp(8)), "for the pointer float*"),
    "np.int32 for a float": (
        with_arg(8, lambda e: np.int32(1)),
        "int32 for float: an integer and a floating",
    ),
    "a Python int": (with_arg(7, int), "int 48: only device arrays and NumPy scalars"),
    "a Python float": (with_arg(8, lambda e: 1e-5), "float 1e-05: only device arrays and NumPy scalars"),
    "a device array for a value": (with_arg(6, lambda n: fake_cuda.GpuArray(1, np.int64)), "a device array"),
    "a host array for a pointer": (with_arg(0, np.asarray), "ndarray array("),
    "a float32 array for a bf16*": (with_arg(0, lambda x: x.view(np.float32)), "a float32 array for a bf16*"),
}


@pytest.fixture(scope="module")
def layer_norm_launch(launches):
    """A recorded launch of bfloat16 layer norm with a weight and a bias (two device arrays there)."""
    return next(
        launch
        for _, launch in launches
        if launch.kernel == "layer_norm_forward_warps_bf16" and isinstance(launch.args[1], fake_cuda.GpuArray)
    )


@pytest.mark.parametrize("mistake", MISTAKES)
def test_the_check_reports_a_wrong_launch(layer_norm_launch, kernels, mistake):
    alter, expected = MISTAKES[mistake]
    params = kernels[layer_norm_launch.kernel]
    assert launch_problems(layer_norm_launch, params) == []
    problems = launch_problems(layer_norm_launch._replace(args=alter(layer_norm_launch.args)), params)
    assert len(problems) == 1 and expected in problems[0], problems
    assert problems[0].startswith("layer_norm_forward_warps_bf16")


def test_the_check_takes_a_null_pointer_for_an_absent_weight(layer_norm_launch, kernels):
    """np.uintp(0) is how the launchers pass no weight or bias: a null pointer, which the kernel tests."""
    launch = layer_norm_launch._replace(args=with_arg(1, lambda w: np.uintp(0))(layer_norm_launch.args))
    assert launch_problems(launch, kernels[launch.kernel]) == []
