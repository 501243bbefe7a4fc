"""GELU's fast paths (the tanh form). The CPU's: the numbers go through in cache-sized blocks, on
all cores, in place in the output. The GPU's (autograd/kernels/cuda/gelu.cu): one pass over the
entries each way. Both backwards compute the tanh again rather than keeping a second array that
size: the forward keeps x alone."""

import math

import numpy as np

from .. import backend, buffers, parallel
from . import gpu

SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


def _tanh_inner(x, t):
    """t = tanh(sqrt(2/pi) (x + 0.044715 x^3)), written into the array t (shaped like x)."""
    np.multiply(x, x, out=t)
    t *= 0.044715
    t += 1
    t *= x  # x + 0.044715 x^3
    t *= SQRT_2_OVER_PI
    return np.tanh(t, out=t)


def forward_cpu(ctx, x):
    ctx.x = x
    out = buffers.empty(x.shape, x.dtype)
    flat_x, flat_out = x.reshape(-1), out.reshape(-1)

    def gelu(block):  # 0.5 x (1 + t)
        x, out = flat_x[block], flat_out[block]
        _tanh_inner(x, out)
        out += 1
        out *= x
        out *= 0.5

    parallel.run(gelu, parallel.blocks(x.size, 1))
    return out


def backward_cpu(ctx, grad):
    x = ctx.x
    grad_x = buffers.empty(x.shape, x.dtype)
    flat_x, flat_grad, flat_grad_x = x.reshape(-1), grad.reshape(-1), grad_x.reshape(-1)

    def slope_times_grad(block):
        # slope = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
        x, slope = flat_x[block], flat_grad_x[block]
        t = _tanh_inner(x, np.empty_like(x))
        np.multiply(t, t, out=slope)
        np.subtract(1, slope, out=slope)
        slope *= x
        inner = x * x
        inner *= 0.5 * SQRT_2_OVER_PI * 3 * 0.044715
        inner += 0.5 * SQRT_2_OVER_PI
        slope *= inner
        np.multiply(t, 0.5, out=inner)
        inner += 0.5
        slope += inner
        slope *= flat_grad[block]

    parallel.run(slope_times_grad, parallel.blocks(x.size, 1))
    return grad_x


def forward_gpu(ctx, x):
    xp = backend.get_array_module(x)
    ctx.x = x = xp.ascontiguousarray(x).reshape(x.shape)  # (ascontiguousarray makes a 0-d x 1-d)
    out = xp.empty_like(x)
    args = (x, out, np.int64(x.size))
    gpu.kernel("gelu", "gelu_forward", x.dtype)((gpu.blocks(x.size),), (gpu.THREADS,), args)
    return out


def backward_gpu(ctx, grad):
    xp, x = backend.get_array_module(grad), ctx.x
    grad = xp.ascontiguousarray(grad, dtype=x.dtype)
    grad_x = xp.empty_like(x)
    args = (x, grad, grad_x, np.int64(x.size))
    gpu.kernel("gelu", "gelu_backward", x.dtype)((gpu.blocks(x.size),), (gpu.THREADS,), args)
    return grad_x
