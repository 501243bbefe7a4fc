"""A user's own ops, tested as a user would, with the public API alone: an op with its own CUDA kernel
and a CPU fast path, checked on every device; a bug on the path of an input that needs no gradient; an
op of two outputs; and each mistake a Function can make, named in one line."""

import numpy as np
import pytest
from hypothesis import strategies as st

import autograd as ag
from autograd import testing
from autograd.testing import arrays, check_fast_paths, check_gradients, shapes

SWISH_CUDA = """
// swish(x) = x sigmoid(x); swish'(x) = s (1 + x (1 - s)) with s = sigmoid(x). float32 and bfloat16 in,
// float32 arithmetic (to_float and store are common.cuh's: a bfloat16 is rounded once, on its store).
template <typename T>
__device__ void swish_forward(const T* x, T* out, long long n) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = to_float(x[i]);
        store(out, i, v / (1.0f + expf(-v)));
    }
}

template <typename T>
__device__ void swish_backward(const T* x, const T* grad, T* out, long long n) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = to_float(x[i]), s = 1.0f / (1.0f + expf(-v));
        store(out, i, to_float(grad[i]) * s * (1.0f + v * (1.0f - s)));
    }
}

extern "C" __global__ void swish_forward_f32(const float* x, float* out, long long n) {
    swish_forward(x, out, n);
}
extern "C" __global__ void swish_forward_bf16(const bf16* x, bf16* out, long long n) {
    swish_forward(x, out, n);
}
extern "C" __global__ void swish_backward_f32(const float* x, const float* g, float* out, long long n) {
    swish_backward(x, g, out, n);
}
extern "C" __global__ void swish_backward_bf16(const bf16* x, const bf16* g, bf16* out, long long n) {
    swish_backward(x, g, out, n);
}
"""


def contiguous(a):
    """`a` in C order, as a kernel indexes it (ascontiguousarray would make a 0-d array 1-d)."""
    return a if a.flags.c_contiguous else a.copy()


def launch(kernel, *arrays):
    """A grid-stride kernel over the last array's entries, 256 threads a block."""
    n = arrays[-1].size
    kernel((max(1, min(-(-n // 256), 1024)),), (256,), (*arrays, np.int64(n)))


class Swish(ag.Function):
    """swish(x) = x sigmoid(x): the reference on whole arrays, a CPU fast path in place, and a GPU one
    that runs the kernels of SWISH_CUDA (on "cuda", and on "cuda-emulated" without a GPU)."""

    source = ag.CudaSource(SWISH_CUDA, name="swish")

    @staticmethod
    def forward(ctx, x):
        xp = ag.backend.get_array_module(x)
        ctx.x = x
        return x / (1 + xp.exp(-x))

    @staticmethod
    def backward(ctx, grad):
        xp = ag.backend.get_array_module(ctx.x)
        s = 1 / (1 + xp.exp(-ctx.x))
        return grad * s * (1 + ctx.x * (1 - s))

    @staticmethod
    def forward_cpu(ctx, x):
        ctx.x = x
        out = np.negative(x, out=np.empty_like(x))  # in one array, an array even for a 0-d x
        np.exp(out, out=out)
        out += 1
        return np.divide(x, out, out=out)

    backward_cpu = backward

    @staticmethod
    def forward_gpu(ctx, x):
        xp = ag.backend.get_array_module(x)
        ctx.x = x = contiguous(x)
        out = xp.empty_like(x)
        launch(Swish.source.kernel("swish_forward", x.dtype), x, out)
        return out

    @staticmethod
    def backward_gpu(ctx, grad):
        xp = ag.backend.get_array_module(grad)
        out = xp.empty_like(ctx.x)
        launch(Swish.source.kernel("swish_backward", grad.dtype), ctx.x, contiguous(grad), out)
        return out


def swish(x):
    return Swish.apply(x)


@testing.checks_gradient_of(Swish)
@pytest.mark.parametrize("device", testing.DEVICES)
def test_swish_gradient_on_every_device(device):
    ran = check_gradients(swish, arrays(shapes()), device=device)
    assert "calls on a fast path: Swish" in ran  # float64 on the CPU, float32 on a GPU device


@pytest.mark.parametrize("device", testing.DEVICES)
def test_swish_fast_paths_give_the_references_numbers(device):
    dtypes = (np.float32,) if device == "cpu" else (np.float32, ag.bfloat16)
    check_fast_paths(swish, arrays(shapes(max_side=40)), device=device, dtypes=dtypes)


def test_a_wrong_sign_in_the_cuda_backward_fails_on_the_emulated_device(monkeypatch):
    """The planted bug: swish' with (1 - x (1 - s)). float64 on a GPU runs the reference, where it is
    not; check_gradients finds it in its float32 comparison of the fast path with the reference."""
    wrong = SWISH_CUDA.replace("(1.0f + v * (1.0f - s))", "(1.0f - v * (1.0f - s))")
    assert wrong != SWISH_CUDA
    monkeypatch.setattr(Swish, "source", ag.CudaSource(wrong, name="swish_wrong"))
    check_gradients(swish, arrays(shapes()), device="cpu")  # the CPU's paths are right
    with pytest.raises(
        AssertionError, match=r"gradient of x \(float32 on cuda-emulated\): fast path and reference"
    ):
        check_gradients(swish, arrays(shapes()), device="cuda-emulated")


# ----- a bug on the path of an input that needs no gradient


class Gate(ag.Function):
    """y = x * g: its backward computes g's gradient only when asked, and gets x's wrong when it is not."""

    @staticmethod
    def forward(ctx, x, g):
        ctx.x, ctx.g = x, g
        return x * g

    @staticmethod
    def backward(ctx, grad):
        if ctx.needs_input_grad[1]:
            return grad * ctx.g, grad * ctx.x
        return grad * ctx.g * 2, None  # the bug


def gate(x, g):
    return Gate.apply(x, g)


def test_a_bug_where_an_input_needs_no_gradient_fails_and_is_named():
    same_shape = arrays((3,))
    check_gradients(gate, same_shape, same_shape, requires_grad=(True, True))  # the bug hides here
    with pytest.raises(ag.GradcheckError, match=r"input x\[") as failure:
        check_gradients(gate, same_shape, same_shape)
    assert any(
        note.endswith("(requires grad: False)") and note.startswith("g = ")
        for note in failure.value.__notes__
    )


# ----- an op of two outputs


class PolarToXY(ag.Function):
    """(r cos t, r sin t): two outputs, and a gradient for each reaches the one backward."""

    @staticmethod
    def forward(ctx, r, t):
        xp = ag.backend.get_array_module(r)
        ctx.r, ctx.cos, ctx.sin = r, xp.cos(t), xp.sin(t)
        return r * ctx.cos, r * ctx.sin

    @staticmethod
    def backward(ctx, grad_x, grad_y):
        grad_r = grad_x * ctx.cos + grad_y * ctx.sin
        grad_t = ctx.r * (grad_y * ctx.cos - grad_x * ctx.sin)
        return grad_r, grad_t


def distance_travelled(r, t):
    x, y = PolarToXY.apply(r, t)
    return (x * x + y * y.exp()).sum() + x.sum()  # x used twice, y once


def same_shape(count):
    """`count` arrays of one drawn shape."""
    return shapes().flatmap(lambda shape: st.tuples(*[arrays(shape)] * count))


@testing.checks_gradient_of(PolarToXY)
@pytest.mark.parametrize("device", testing.DEVICES)
def test_an_op_of_two_outputs_matches_finite_differences(device):
    check_gradients(distance_travelled, same_shape(2), device=device)


def test_an_output_left_unused_gets_zeros():
    r, t = ag.tensor([2.0], requires_grad=True), ag.tensor([0.5], requires_grad=True)
    x, _ = PolarToXY.apply(r, t)
    x.sum().backward()
    np.testing.assert_allclose(r.grad, np.cos([0.5]), rtol=1e-6)
    np.testing.assert_allclose(t.grad, -2 * np.sin([0.5]), rtol=1e-6)


# ----- a Function's mistakes, one line each


class Mistaken(ag.Function):
    """2 x, or, as `mistake` says, what a Function may get wrong."""

    @staticmethod
    def forward(ctx, x, mistake=None):
        ctx.mistake = mistake
        wrong = {
            "a number output": (2 * x, 1.0),
            "a Tensor output": ag.tensor(2 * x),
            "two outputs": (2 * x, x),
        }
        return wrong.get(mistake, 2 * x)

    @staticmethod
    def backward(ctx, grad):
        wrong = {"a list": [2 * grad], "one too many": (2 * grad, grad), "a wrong shape": (2 * grad)[:1]}
        wrong["a Tensor gradient"] = ag.tensor(2 * grad)
        return wrong.get(ctx.mistake, 2 * grad)


MISTAKES = {
    "a number output": r"^Mistaken.forward gave a float as its output 1: give an array, or a tuple of them",
    "a Tensor output": r"^Mistaken.forward gave a Tensor as its output: give an array, or a tuple of them",
    "a Tensor gradient": r"^Mistaken.backward gave \(Tensor\): give a tuple of 1: an array or None per",
    "two outputs": r"^Mistaken.backward\(\) takes 2 positional arguments but 3 were given$",
    "a list": r"^Mistaken.backward gave \(list\): give a tuple of 1: an array or None per positional arg$",
    "one too many": r"^Mistaken.backward gave \(ndarray, ndarray\): give a tuple of 1: an array or None",
    "a wrong shape": r"^Mistaken.backward gave a float32 \(1,\) gradient for argument x, a float32 \(3,\)",
}


@pytest.mark.parametrize("mistake", MISTAKES)
def test_each_mistake_is_a_one_line_error_naming_the_op_and_argument(mistake):
    x = ag.tensor([1.0, 2.0, 3.0], requires_grad=True)
    with pytest.raises((TypeError, RuntimeError), match=MISTAKES[mistake]):
        out = Mistaken.apply(x, mistake=mistake)
        (out[0] + out[1] if isinstance(out, tuple) else out).sum().backward()


def test_a_tensor_passed_by_keyword_is_named():
    x = ag.tensor([1.0], requires_grad=True)
    with pytest.raises(
        TypeError, match=r"^Mistaken.apply: pass mistake= by position: a keyword is not a graph input$"
    ):
        Mistaken.apply(x, mistake=ag.tensor([2.0]))
