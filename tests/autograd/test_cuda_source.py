"""autograd.CudaSource: a user's own CUDA code, compiled as the project's sources are (the headers in
front, #line naming the user's file), its kernels called as CuPy's RawKernel. On the emulated device
they are the emulator's, with its checks: numbers, a build kept once, compile errors at the user's
file and line, a write past an array, a race, wrong arguments, an unknown name. On a GPU each launch is
checked against the parameters of the kernel's PTX: the checker on NVRTC's PTX, the whole path on
tests/fake_cuda.py's stand-in for CuPy (NVRTC compiles, nothing runs), and a launch on a real GPU."""

import os
import re
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autograd as ag
from autograd import backend, emulator
from autograd.emulator import kernels as emulator_kernels
from autograd.emulator.kernels import EmulatorError
from autograd.kernels import compiling, sources
from tests import fake_cuda

if not os.environ.get("CI"):  # CI installs NVRTC and g++: there a missing one must fail, not skip
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="pip install -e '.[nvrtc]'")
    if shutil.which("g++") is None:
        pytest.skip("needs g++ to build the kernels for the CPU", allow_module_level=True)

TEXT = r"""template <typename T>
__device__ void swish(const T* x, T* y, float beta, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) store(y, i, to_float(x[i]) / (1.0f + expf(-beta * to_float(x[i]))));
}
#define SWISH(suffix, T)                                                                      \
    extern "C" __global__ void swish_##suffix(const T* x, T* y, float beta, unsigned int n) { \
        swish(x, y, beta, n);                                                                 \
    }
SWISH(f32, float)
SWISH(bf16, bf16)

extern "C" __global__ void rotate_racing(float* x) {  // no __syncthreads() between the write and the read
    __shared__ float tile[256];
    tile[threadIdx.x] = x[threadIdx.x];
    x[threadIdx.x] = tile[(threadIdx.x + 1) % blockDim.x];
}

extern "C" __global__ void fill_one_too_many(float* y, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) y[i] = 1.0f;
}
"""
SWISH = ag.CudaSource(TEXT, name="swish")
KERNELS = "swish_f32, swish_bf16, rotate_racing, fill_one_too_many"
BROKEN = 'extern "C" __global__ void broken(float* x) {\n    x[0] = undeclared;\n}\n'  # line 2


def on_emulator(array, dtype=np.float32):
    return ag.tensor(array, dtype=dtype, device=emulator.NAME).data


def swish(x, beta):
    return x / (1 + np.exp(-beta * x))


def launch(source, x, beta=1.5):
    """y = swish(x) by the source's kernel for the dtype of x, on its device."""
    y, blocks = backend.get_array_module(x).zeros_like(x), -(-x.size // 256)
    with x.device:
        source.kernel("swish", x.dtype)((blocks,), (256,), (x, y, np.float32(beta), np.uint32(x.size)))
    return y


@settings(max_examples=10)
@given(n=st.integers(1, 700), beta=st.floats(-4, 4, width=32))
def test_a_string_sources_kernel_gives_the_right_numbers(n, beta):
    x = on_emulator(np.linspace(-5, 5, n))
    np.testing.assert_allclose(launch(SWISH, x, beta), swish(np.float64(x), beta), rtol=1e-6, atol=1e-7)


def test_a_dtype_picks_the_kernel_exported_for_it():
    x = on_emulator(np.linspace(-5, 5, 300), ag.bfloat16)
    with x.device:
        assert SWISH.kernel("swish", ag.bfloat16).name == "swish_bf16"
        assert SWISH.kernel("swish", np.float32).name == SWISH.kernel("swish_f32").name == "swish_f32"
        with pytest.raises(TypeError, match="swish.nothing: the CUDA path takes float32 or bfloat16, not"):
            SWISH.kernel("nothing", np.float64)
    expected = swish(np.asarray(x, np.float32), 1.5).astype(ag.bfloat16)
    np.testing.assert_allclose(np.float32(launch(SWISH, x)), np.float32(expected), rtol=2**-7)


def test_a_file_sources_kernel_is_built_once_and_its_text_names_the_file(tmp_path, monkeypatch):
    """The text has the headers in front of the code, each after a #line naming its file; the same text
    twice (the same file, named by a str or a Path) is built once."""
    path = tmp_path / "swish.cu"
    path.write_text(TEXT)
    built = []
    limits = emulator_kernels.ptx_limits
    monkeypatch.setattr(
        emulator_kernels, "ptx_limits", lambda text, name: built.append(name) or limits(text, name)
    )
    first, second = ag.CudaSource.from_file(path), ag.CudaSource.from_file(str(path))
    assert first.name == "swish" and first.text == second.text
    assert first.text.index(str(compiling.SOURCES / "common.cuh")) < first.text.index(
        f'#line 1 "{path}"\n{TEXT}'
    )
    assert '#line 1 "swish.cu"\n' in SWISH.text and ag.CudaSource is sources.CudaSource
    x = on_emulator(np.linspace(-5, 5, 300))
    np.testing.assert_allclose(launch(first, x), swish(np.float64(x), 1.5), rtol=1e-6, atol=1e-7)
    with x.device:
        assert first.kernel("swish_f32").library is second.kernel("swish_f32").library
    assert built == ["swish"]


def test_a_compile_error_names_the_users_file_and_line(tmp_path, monkeypatch):
    """NVRTC's log (path(line)) as the emulator builds a source, or as a GPU's module compiles it; g++'s
    (path:line:column) where NVRTC would pass it."""
    path = tmp_path / "broken.cu"
    path.write_text(BROKEN)
    source, where = ag.CudaSource.from_file(path), re.escape(str(path))
    with pytest.raises(RuntimeError, match=rf"broken.cu does not compile:\n{where}\(2\): error"):
        compiling.compiled(source.text, source.name, "compute_90")
    with emulator.Device():
        with pytest.raises(EmulatorError, match=rf"^broken: NVRTC: .*\n{where}\(2\): error"):
            source.kernel("broken")
        with pytest.raises(EmulatorError, match=r"\nbroken.cu\(2\): error"):  # a string source: <name>.cu
            ag.CudaSource(BROKEN, name="broken").kernel("broken")
        monkeypatch.setattr(
            emulator_kernels, "ptx_limits", lambda text, name: None
        )  # as if NVRTC were not there
        with pytest.raises(
            EmulatorError, match=rf"(?s)^broken: g\+\+ does not compile it .*\n{where}:2:\d+: error"
        ):
            source.kernel("broken")


def test_a_write_past_an_arrays_end_and_a_race_are_named():
    y, x = on_emulator(np.zeros(100)), on_emulator(np.arange(256))
    message = (
        r"^fill_one_too_many: block \(0, 0, 0\) thread \(100, 0, 0\): writes element 100 of argument 0, past"
    )
    with y.device:
        with pytest.raises(EmulatorError, match=message):
            SWISH.kernel("fill_one_too_many")((1,), (256,), (y, np.uint32(100)))
        with emulator_kernels.thread_orders("written", "reversed"):
            with pytest.raises(EmulatorError, match=r"^rotate_racing: the threads in the orders .* a race"):
                SWISH.kernel("rotate_racing")((1,), (256,), (x,))


WRONG = {
    "a Python int": (lambda x: (x, x, np.float32(1), 300), "argument 3: int 300: only arrays and NumPy"),
    "a float64 array": (lambda x: (np.float64(x), x, np.float32(1), np.uint32(300)), "argument 0: a float64"),
    "three arguments": (lambda x: (x, x, np.float32(1)), "3 arguments for 4 parameters"),
}


@pytest.mark.parametrize("mistake", WRONG)
def test_wrong_arguments_and_an_unknown_name_are_refused_on_the_emulator(mistake):
    args, message = WRONG[mistake]
    x = on_emulator(np.linspace(-5, 5, 300))
    with x.device:
        with pytest.raises(EmulatorError, match=f"^swish_f32: {message}"):
            SWISH.kernel("swish_f32")((2,), (256,), args(x))
        with pytest.raises(EmulatorError, match=rf"^swish.cu has no kernel nothing_f32 \(it has {KERNELS}\)"):
            SWISH.kernel("nothing", np.float32)


# ----- on a GPU: the checks the PTX allows


@pytest.fixture(scope="module")
def params():
    """The PTX parameters of swish_f32, from NVRTC: x and y pointers, beta a float, n an unsigned int."""
    return compiling.ptx_entries(compiling.compiled(SWISH.text, "swish", "compute_90").decode())["swish_f32"]


ARRAY, BETA, N = "an array", np.float32(1), np.uint32(3)  # ARRAY: a NumPy array stands for a device's
PTX_WRONG = {
    "a count": ((ARRAY, ARRAY, BETA), "3 arguments for 4 parameters"),
    "a width": ((ARRAY, ARRAY, np.float64(1), N), r"argument 2: float64 \(8 bytes\) for float \(4 bytes\)"),
    "an integer for a float": (
        (ARRAY, ARRAY, np.int32(1), N),
        "argument 2: int32 for float: an integer and a.*",
    ),
    "an array for a value": ((ARRAY, ARRAY, BETA, ARRAY), r"argument 3: an array for the value \.u32"),
    "a Python number": ((ARRAY, ARRAY, 1.5, N), "argument 2: float 1.5: only arrays and NumPy scalars.*"),
    "a value for a pointer": (
        (ARRAY, BETA, BETA, N),
        r"argument 1: float32 \(4 bytes\) for long long.*",
    ),
}


@pytest.mark.parametrize("mistake", PTX_WRONG)
def test_the_ptx_parameters_check_a_launchs_arguments(params, mistake):
    assert params == [(".u64", 8), (".u64", 8), (".f32", 4), (".u32", 4)]
    x = np.zeros(3, np.float32)
    assert sources.argument_problems(params, (x, x, BETA, N)) == []
    args, message = PTX_WRONG[mistake]
    problems = sources.argument_problems(params, [x if a is ARRAY else a for a in args])
    assert len(problems) == 1 and re.fullmatch(message, problems[0]), problems


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """tests/fake_cuda.py's stand-in for CuPy, whose modules record the launches of their functions."""
    fake_cuda.install(monkeypatch)
    launches = []

    class Module:
        def load(self, binary):
            self.binary = binary

        def get_function(self, name):
            return lambda *launch, **options: launches.append((name, *launch))

    monkeypatch.setattr(backend.cupy.cuda, "Module", Module, raising=False)
    monkeypatch.setattr(compiling, "CACHE", tmp_path)
    return launches


def test_on_a_gpu_a_launch_is_checked_then_made(fake_gpu, tmp_path):
    """A kernel's launches are checked (an array of another GPU, a host array included), a name the
    source does not export is refused naming those it does; the binary and the PTX are compiled once."""
    cupy = backend.cupy
    x = cupy.asarray(np.zeros(300, np.float32))
    with cupy.cuda.Device(1):
        elsewhere = cupy.asarray(x)
    kernel = SWISH.kernel("swish", np.float32)
    kernel((2,), (256,), (x, x, np.float32(1), np.uint32(300)))
    assert [name for name, *_ in fake_gpu] == ["swish_f32"]
    for y in (elsewhere, np.zeros(300, np.float32)):
        with pytest.raises(TypeError, match="^swish_f32: argument 1: an array not on the kernel's device 0$"):
            kernel((2,), (256,), (x, y, np.float32(1), np.uint32(300)))
    with pytest.raises(TypeError, match="^swish_f32: argument 3: int 300: only arrays and NumPy scalars"):
        kernel((2,), (256,), (x, x, np.float32(1), 300))
    with pytest.raises(ValueError, match=rf"^swish.cu has no kernel nothing \(it has {KERNELS}\)"):
        ag.CudaSource(TEXT, name="swish").kernel("nothing")
    assert len(fake_gpu) == 1 and len(list(tmp_path.iterdir())) == 2  # an sm_90 binary, compute_90 PTX


def test_the_projects_own_kernels_are_cupys_functions_unwrapped(fake_gpu):
    """No work per launch: their launches are checked in CI (tests/autograd/test_kernel_launches.py)."""
    assert sources.source("gelu").kernel("gelu_forward", np.float32).__name__ == "<lambda>"
    assert not sources.source("gelu").checked and SWISH.checked


@pytest.mark.gpu
def test_a_users_kernel_runs_on_a_gpu_and_its_launches_are_checked():
    x = ag.tensor(np.linspace(-5, 5, 300), device="cuda").data
    np.testing.assert_allclose(launch(SWISH, x).get(), swish(np.float64(x.get()), 1.5), rtol=1e-6, atol=1e-7)
    with x.device:
        with pytest.raises(TypeError, match="^swish_f32: argument 3: int 300"):
            SWISH.kernel("swish_f32")((2,), (256,), (x, x, np.float32(1), 300))
        with pytest.raises(ValueError, match=rf"^swish.cu has no kernel nothing \(it has {KERNELS}\)"):
            SWISH.kernel("nothing")


def test_a_launch_outside_any_device_says_how_to_make_one_current():
    """Outside an op nothing makes a device current: on a machine without a GPU that is named, with the
    way to launch on the emulated device's arrays."""
    if ag.cuda_available():
        pytest.skip("a GPU is current here")
    with pytest.raises(
        RuntimeError, match=r"^swish.swish_forward: no CUDA device is current: .*device_scope"
    ):
        SWISH.kernel("swish_forward")


INTRINSICS = """
extern "C" __global__ void fast_math(const float* x, float* out, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) {
        float v = __ldg(x + i);
        out[i] = __expf(v) + __logf(v) + __log2f(v) + __sinf(v) + __cosf(v) + __tanf(v) + __powf(v, 1.5f)
                 + __fdividef(v, 3.0f) + rsqrtf(v);
    }
}
"""


def test_the_fast_math_intrinsics_run_on_the_emulator_as_the_exact_functions():
    """__expf and its family compile for a GPU and run on the emulated device, where they give the exact
    functions' numbers (on a GPU they are within their documented error of them)."""
    x = np.linspace(0.5, 2.0, 40, dtype=np.float32)
    assert compiling.compiled(ag.CudaSource(INTRINSICS, "fast_math").text, "fast_math", "compute_90")
    with emulator.Device():
        xe, out = emulator.xp.asarray(x), emulator.xp.empty(40, np.float32)
        ag.CudaSource(INTRINSICS, "fast_math").kernel("fast_math")((1,), (64,), (xe, out, np.int64(40)))
    v = x.astype(np.float64)
    expected = (
        np.exp(v) + np.log(v) + np.log2(v) + np.sin(v) + np.cos(v) + np.tan(v) + v**1.5 + v / 3 + v**-0.5
    )
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5)
