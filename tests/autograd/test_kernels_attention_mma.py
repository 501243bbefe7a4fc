"""Attention's kernels on tensor cores (autograd/kernels/cuda/attention.cu, FlashAttention-2 on mma.sync),
for bfloat16 and for float32 read as tf32, against their NumPy twin: the kernels' arithmetic written out
here in their order, which the emulated device must match bit for bit, forward and backward, causal or
not, with dropout, for T and S that leave partial tiles and heads of any width the kernels take (up to
128 in bfloat16, 64 in tf32); on a GPU within a few roundings. Also the dropout mask seen through
identity values."""

import contextlib
import math
from collections.abc import Callable
from typing import NamedTuple

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import autograd as ag
from autograd import backend, emulator, masks
from autograd import functional as F
from autograd.kernels import attention as attention_kernels
from tests.helpers import SEEDS, fresh_stream, upstream

LOG2_E = np.float32(1.4426950408889634)


def bf16(x):
    """x rounded to bfloat16 (to nearest, ties to even), as float32."""
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


class Kind(NamedTuple):
    """The tensor cores' kernels for one type: how an operand is rounded for a product, the columns an mma
    adds at a time, its Element in attention.cu's MmaTiles<Element, D> (whose forward_keys are the forward's
    keys per step), how the results are stored, the block in which they run, and how far a GPU may be from
    the twin."""

    dtype: object
    operand: Callable
    chunk: int
    element: str
    stored: Callable
    context: Callable
    on_a_gpu: float  # the relative error allowed there, of the largest entry's size


BF16 = Kind(ag.bfloat16, bf16, 16, "bf16", bf16, contextlib.nullcontext, 2**-7)
TF32 = Kind(np.float32, emulator.tf32, 8, "float", np.asarray, lambda: ag.use_precision("tf32"), 2**-9)
KINDS = {"bf16": BF16, "tf32": TF32}


def exp2(x):
    """2^x as the emulated device computes it: exact, rounded once to float32."""
    return np.exp2(x.astype(np.float64)).astype(np.float32)


def log2(x):
    return np.log2(x.astype(np.float64)).astype(np.float32)


def accumulate(kind, acc, x, y):
    """acc + x y as a warp's mma.sync adds it, x and y rounded to the kind's operands: kind.chunk columns of
    x (rows of y) at a time, each chunk's products added in float64 in the order of k, then acc, rounded
    once to float32 (mma.cuh's contract)."""
    x, y = kind.operand(x), kind.operand(y)
    for k0 in range(0, x.shape[-1], kind.chunk):
        total = np.zeros(acc.shape)
        for k in range(k0, min(k0 + kind.chunk, x.shape[-1])):
            total += x[..., k, None].astype(np.float64) * y[..., k, None, :].astype(np.float64)
        acc = (total + acc).astype(np.float32)
    return acc


def seen(n_queries, n_keys, causal):
    """(T, S): where query t sees key s (the causal mask: s <= t + S - T)."""
    return (
        np.tri(n_queries, n_keys, n_keys - n_queries, dtype=bool)
        if causal
        else np.ones((n_queries, n_keys), bool)
    )


def twin_forward(kind, q, k, v, causal, keep, keep_scale, keys_per_step):
    """y (float32, before it is stored) and L2, the base-2 log-sum-exp of each row, for q (n, T, d),
    k (n, S, d), v (n, S, e) and dropout's keep (n, T, S) (None: none): the forward kernel's online softmax
    over steps of keys_per_step keys, each lane of a quad summing its own columns."""
    n, n_queries, n_keys = q.shape[0], q.shape[1], k.shape[1]
    scale = np.float32(1 / math.sqrt(q.shape[-1])) * LOG2_E
    visible = seen(n_queries, n_keys, causal)
    m = np.full((n, n_queries), -np.inf, np.float32)
    lane_sums = np.zeros((n, n_queries, 4), np.float32)  # a lane holds columns 8j + 2t and 8j + 2t + 1
    acc = np.zeros((n, n_queries, v.shape[-1]), np.float32)
    for k0 in range(0, n_keys, keys_per_step):
        keys = slice(k0, k0 + keys_per_step)
        s = accumulate(
            kind, np.zeros((n, n_queries, k[:, keys].shape[1]), np.float32), q, k[:, keys].swapaxes(1, 2)
        )
        s = np.where(visible[:, keys], s * scale, np.float32(-np.inf))
        m_new = np.maximum(m, s.max(axis=-1))
        shrink = exp2(m - m_new)
        m = m_new
        lane_sums *= shrink[..., None]
        acc *= shrink[..., None]
        p = exp2(s - m[..., None])
        for column in range(p.shape[-1]):
            lane_sums[..., column % 8 // 2] += p[..., column]
        w = p if keep is None else p * keep[:, :, keys].astype(np.float32)  # dropped: times 0, a NaN stays
        acc = accumulate(kind, acc, w, v[:, keys])
    total = (lane_sums[..., 0] + lane_sums[..., 1]) + (lane_sums[..., 2] + lane_sums[..., 3])
    return acc * (np.float32(keep_scale) / total)[..., None], m + log2(total)


def twin_row_dot(y, dy):
    """D = rowsum(dy y) as attention_row_dot adds it: lane l sums columns l, l + 32, ... in order, then the
    warp's 32 sums meet by xor-shuffles over 16, 8, 4, 2 and 1 lanes."""
    lanes = np.zeros(y.shape[:-1] + (32,), np.float32)
    for column in range(y.shape[-1]):
        lanes[..., column % 32] += y[..., column] * dy[..., column]
    for offset in (16, 8, 4, 2, 1):
        lanes = lanes + lanes[..., np.arange(32) ^ offset]
    return lanes[..., 0]


def twin_backward(kind, q, k, v, dy, y, lse2, causal, keep, keep_scale):
    """dq, dk, dv (float32, before they are stored) from the forward's y and L2: P recomputed from them, dW
    and dS in float32, then W and dS rounded for their products, which add queries (dk, dv) or keys (dq) a
    chunk at a time in order."""
    scale = np.float32(1 / math.sqrt(q.shape[-1]))
    dot = twin_row_dot(y, dy)
    s = accumulate(kind, np.zeros((q.shape[0], q.shape[1], k.shape[1]), np.float32), q, k.swapaxes(1, 2))
    exponent = np.where(seen(q.shape[1], k.shape[1], causal), s * (scale * LOG2_E) - lse2[..., None], -np.inf)
    p = exp2(exponent.astype(np.float32))
    grad_w = accumulate(kind, np.zeros_like(s), dy, v.swapaxes(1, 2))
    kept = p > 0 if keep is None else (p > 0) & keep
    dropout_scale = np.where(kept, np.float32(keep_scale), np.float32(0))  # dropped: times 0, a NaN stays
    grad_p, w = grad_w * dropout_scale, p * dropout_scale
    grad_s = p * (grad_p - dot[..., None])
    grad_v = accumulate(kind, np.zeros(v.shape, np.float32), w.swapaxes(1, 2), dy)
    grad_k = accumulate(kind, np.zeros(k.shape, np.float32), grad_s.swapaxes(1, 2), q) * scale
    grad_q = accumulate(kind, np.zeros(q.shape, np.float32), grad_s, k) * scale
    return grad_q, grad_k, grad_v


def twin(kind, q, k, v, dy, causal, keep, dropout_p):
    """y, dq, dk, dv in float32, as the kernels store them."""
    width = 64 if max(q.shape[-1], v.shape[-1]) <= 64 else 128
    keep_scale = masks.keep_scale(dropout_p)
    keys_per_step = attention_kernels.MMA_TILES[f"{kind.element}, {width}"]["forward_keys"]
    y, lse2 = twin_forward(kind, q, k, v, causal, keep, keep_scale, keys_per_step)
    return [kind.stored(a) for a in (y, *twin_backward(kind, q, k, v, dy, y, lse2, causal, keep, keep_scale))]


def assert_kernel_is_twin(device, kind, kernel_results, twin_results):
    """Bit for bit on the emulated device; on a GPU (approximate exp2, fused multiply-adds, its own order of a
    chunk's sum) within kind.on_a_gpu of the largest entry's size."""
    for name, a, expected in zip(["y", "dq", "dk", "dv"], kernel_results, twin_results):
        if device == "cuda-emulated":
            np.testing.assert_array_equal(a.astype(np.float32), expected, err_msg=name)
        else:
            allowed = kind.on_a_gpu * max(np.abs(expected).max(initial=0), 1e-30)
            np.testing.assert_allclose(
                a.astype(np.float32), expected, rtol=kind.on_a_gpu, atol=allowed, err_msg=name
            )


WIDEST = {"bf16": 128, "tf32": 64}  # the heads each kind's kernels take (the CUDA cores' run wider ones)


def random_inputs(kind, seed, *shapes):
    """Standard normal arrays of the shapes as the kind's arrays hold them (bfloat16, or float32)."""
    rng = np.random.default_rng(seed)
    return [kind.stored(rng.standard_normal(shape).astype(np.float32)) for shape in shapes]


@st.composite
def attention_case(draw, widest):
    """Heads, T, S (>= T when causal), d, e, causal: partial tiles of 16, 32 and 64 rows, heads up to
    `widest` (both widths of the bfloat16 kernels)."""
    causal = draw(st.booleans())
    n_queries = draw(st.integers(1, 130))
    n_keys = draw(st.integers(n_queries, 130) if causal else st.integers(1, 130))
    d, e = (draw(st.one_of(st.sampled_from([8, 64, widest]), st.integers(1, widest))) for _ in range(2))
    return draw(st.integers(1, 3)), n_queries, n_keys, d, e, causal


def assert_attention_is_its_twin(device, kind, heads, n_queries, n_keys, d, e, causal, dropout_p, seed):
    """scaled_dot_product_attention of random q, k, v: y, dq, dk, dv against the twin's."""
    shapes = [(heads, n_queries, d), (heads, n_keys, d), (heads, n_keys, e)]
    q, k, v = random_inputs(kind, seed, *shapes)
    dy = kind.stored(upstream((heads, n_queries, e)).astype(np.float32))
    with ag.use_reference(False), kind.context():
        tensors = [ag.tensor(a, requires_grad=True, dtype=kind.dtype, device=device) for a in (q, k, v)]
        out = F.scaled_dot_product_attention(
            *tensors, causal=causal, dropout_p=dropout_p, generator=fresh_stream(seed)
        )
        out.backward(dy)
    shape = (heads, n_queries, n_keys)
    keep = masks.keep_mask(fresh_stream(seed), shape, dropout_p, np) if dropout_p else None
    kernel_results = [out.numpy()] + [backend.to_host(t.grad) for t in tensors]
    assert_kernel_is_twin(device, kind, kernel_results, twin(kind, q, k, v, dy, causal, keep, dropout_p))


@pytest.mark.parametrize("kind", KINDS)
@given(data=st.data(), dropout_p=st.sampled_from([0.0, 0.3]), seed=SEEDS)
def test_scaled_dot_product_attention_is_its_twin(gpu_device, kind, data, dropout_p, seed):
    case = data.draw(attention_case(WIDEST[kind]))
    assert_attention_is_its_twin(gpu_device, KINDS[kind], *case, dropout_p, seed)


# (T, S, head width), causal: S - T one more than a multiple of a tile, so that the last key a tile of
# queries sees is the first of a tile of keys, and the first query that sees a tile of keys the last of a
# tile of queries (in bfloat16, tiles of 64 queries and 64 keys at width 64; at width 128, and in tf32,
# 32 keys a step in the forward, 16 queries and keys a step in the backward). tf32 runs them at width 64.
CAUSAL_TILE_EDGES = [(64, 129, 64), (5, 70, 8), (1, 66, 3), (40, 73, 128), (16, 49, 128), (70, 135, 100)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n_queries, n_keys, width", CAUSAL_TILE_EDGES)
def test_causal_attention_at_the_edges_of_tiles_is_its_twin(gpu_device, kind, n_queries, n_keys, width):
    width = min(width, WIDEST[kind])
    assert_attention_is_its_twin(gpu_device, KINDS[kind], 2, n_queries, n_keys, width, width, True, 0.0, 0)


@pytest.mark.parametrize("kind", KINDS)
@given(
    batch=st.integers(1, 2),
    time=st.integers(1, 130),
    n_head=st.integers(1, 3),
    data=st.data(),
    dropout=st.booleans(),
    seed=SEEDS,
)
def test_multi_head_attention_with_its_bias_is_its_twin(
    gpu_device, kind, batch, time, n_head, data, dropout, seed
):
    """q, k and v read out of packed qkv, the float32 bias added (before the rounding to bfloat16)."""
    width = data.draw(st.integers(1, WIDEST[kind]), label="width")
    kind = KINDS[kind]
    qkv, bias = random_inputs(kind, seed, (batch, time, 3 * n_head * width), 3 * n_head * width)
    dropout_p = 0.3 if dropout else 0.0
    dy = kind.stored(upstream((batch, time, n_head * width)).astype(np.float32))
    with ag.use_reference(False), kind.context():
        x = ag.tensor(qkv, requires_grad=True, dtype=kind.dtype, device=gpu_device)
        b = ag.tensor(bias, dtype=np.float32, device=gpu_device)
        out = F.multi_head_attention(x, n_head, dropout_p=dropout_p, generator=fresh_stream(seed), bias=b)
        out.backward(dy)

    def heads(a):  # (batch, time, n_head * width) -> (batch * n_head, time, width)
        return a.reshape(batch, time, n_head, width).swapaxes(1, 2).reshape(batch * n_head, time, width)

    q, k, v = (heads(kind.stored(part)) for part in np.split(qkv + bias, 3, axis=-1))
    shape = (batch, n_head, time, time)  # the reference's draw: the batch is the example axis
    keep = (
        masks.keep_mask(fresh_stream(seed), shape, dropout_p, np).reshape(-1, time, time) if dropout else None
    )
    y, *grads = twin(kind, q, k, v, heads(dy), True, keep, dropout_p)
    grad_qkv = backend.to_host(x.grad).reshape(batch, time, 3, n_head, width).transpose(2, 0, 3, 1, 4)
    kernel_results = [heads(out.numpy()), *grad_qkv.reshape(3, batch * n_head, time, width)]
    assert_kernel_is_twin(gpu_device, kind, kernel_results, [y, *grads])


@pytest.mark.parametrize("kind", KINDS)
def test_the_kernels_drop_the_references_entries(gpu_device, kind):
    """With v the identity, y is the weights after dropout (rounded to bfloat16): zero exactly where the
    reference's are (the mask of autograd/random.py, each draw made once by the block, KeepBits)."""
    kind = KINDS[kind]
    q, k = random_inputs(kind, 5, (3, 37, 16), (3, 45, 16))
    v = np.broadcast_to(np.eye(45, dtype=np.float32), (3, 45, 45))
    weights = {}
    for reference in (False, True):
        with ag.use_reference(reference), kind.context():
            q_, k_, v_ = (ag.tensor(a, dtype=kind.dtype, device=gpu_device) for a in (q, k, v))
            out = F.scaled_dot_product_attention(
                q_, k_, v_, causal=True, dropout_p=0.3, generator=fresh_stream(4)
            )
            weights[reference] = out.numpy().astype(np.float32)
    assert 0.2 < (weights[True] == 0).mean() < 0.8
    np.testing.assert_array_equal(weights[False] == 0, weights[True] == 0)
