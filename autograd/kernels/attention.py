"""Attention's fast paths, for both attention Functions.

The CPU path: stacks of heads, (heads, time, width) arrays, go through a few heads at a time, so
that each head's T x S scores stay in cache from the matrix product through the softmax to the
next product, and the pieces run on all the cores. The scale goes on q (T x d) rather than on the
scores (T x S).

The CUDA path (below): flash attention, autograd/kernels/cuda/attention.cu. The T x S matrices are
never stored: the forward keeps each row's log-sum-exp, from which the backward recomputes them,
and dropout's mask is drawn inside the kernels, the reference's mask bit for bit.

MultiHeadAttention's bias (the projection's that made qkv) costs no pass of its own: the CPU adds it in
the copy that lays the heads out, the kernels as they load q, k and v. Its gradient is the column sums
of dqkv."""

import math
import re

import numpy as np

from .. import buffers, masks, products, threads
from ..backend import get_array_module
from ..ops import unbroadcast
from ..precision import bfloat16
from . import compiling, launching, sources
from . import linear as linear_kernels


def _dropped(ctx, heads, probs):
    """The attention weights of some heads after dropout (probs itself without dropout)."""
    if ctx.keep is None:
        return probs
    return masks.drop(probs, ctx.keep[heads], ctx.keep_scale)


def _attend_on_threads(ctx, q, k, v, causal, keep, dropout_p):
    """softmax(q k^T / sqrt(d) + mask), dropped out where `keep` (n, T, S) is false (no dropout
    when it is None), times v, for q (n, T, d), k (n, S, d), v (n, S, e); keeps the softmax and
    the dropout mask on ctx for _attend_backward_on_threads."""
    n, n_queries, n_keys = q.shape[0], q.shape[1], k.shape[1]
    ctx.scale = 1 / math.sqrt(q.shape[-1])
    scaled_q = q * ctx.scale
    ctx.scaled_q, ctx.k, ctx.v = scaled_q, k, v
    hidden = ~np.tri(n_queries, n_keys, n_keys - n_queries, dtype=bool) if causal else None
    ctx.probs = probs = buffers.empty((n, n_queries, n_keys), q.dtype)
    ctx.keep, ctx.keep_scale = keep, masks.keep_scale(dropout_p)
    out = buffers.empty((n, n_queries, v.shape[-1]), q.dtype)

    def attend(heads):
        scores = np.matmul(scaled_q[heads], np.swapaxes(k[heads], -1, -2), out=probs[heads])
        if hidden is not None:
            np.copyto(scores, -np.inf, where=hidden)
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        np.matmul(_dropped(ctx, heads, scores), v[heads], out=out[heads])

    threads.for_each(attend, threads.blocks(n, n_queries * n_keys), multiplies=True)
    return out


def _attend_backward_on_threads(ctx, grad, needs=(True, True, True)):
    """Gradients of q, k, v (None where not needed) for the output gradient `grad` (n, T, e).
    The probabilities kept by the forward are used up."""
    scaled_q, k, v, probs = ctx.scaled_q, ctx.k, ctx.v, ctx.probs
    grad_q, grad_k, grad_v = (
        buffers.empty(a.shape, a.dtype) if need else None for a, need in zip((scaled_q, k, v), needs)
    )

    def backward(heads):
        p = probs[heads]
        weights = _dropped(ctx, heads, p)
        if grad_v is not None:
            np.matmul(np.swapaxes(weights, -1, -2), grad[heads], out=grad_v[heads])
        grad_scores = grad[heads] @ np.swapaxes(v[heads], -1, -2)
        grad_scores *= weights  # dropout's mask and scale, and p, at once: w G
        p *= grad_scores.sum(axis=-1, keepdims=True)  # without dropout, p is the weights: not needed now
        grad_scores -= p
        if grad_q is not None:
            np.matmul(grad_scores, k[heads], out=grad_q[heads])
            grad_q[heads] *= ctx.scale
        if grad_k is not None:
            np.matmul(np.swapaxes(grad_scores, -1, -2), scaled_q[heads], out=grad_k[heads])

    threads.for_each(backward, threads.blocks(len(probs), probs.shape[1] * probs.shape[2]), multiplies=True)
    return grad_q, grad_k, grad_v


def scaled_dot_product_forward_cpu(ctx, q, k, v, causal, dropout_p, generator):
    heads = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    ctx.shapes, ctx.heads = (q.shape, k.shape, v.shape), heads
    keep = None
    if dropout_p > 0:  # one mask per head of the scores q k^T, as the reference draws it; heads
        # that only v adds share it
        score_heads = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
        keep = masks.keep_mask(generator, score_heads + (q.shape[-2], k.shape[-2]), dropout_p, np)
        keep = np.broadcast_to(keep, heads + keep.shape[-2:]).reshape(-1, *keep.shape[-2:])
    q, k, v = (np.broadcast_to(a, heads + a.shape[-2:]).reshape(-1, *a.shape[-2:]) for a in (q, k, v))
    return _attend_on_threads(ctx, q, k, v, causal, keep, dropout_p).reshape(heads + (q.shape[1], v.shape[2]))


def scaled_dot_product_backward_cpu(ctx, grad):
    grads = _attend_backward_on_threads(ctx, grad.reshape(-1, *grad.shape[-2:]), ctx.needs_input_grad)
    return tuple(
        None if g is None else unbroadcast(g.reshape(ctx.heads + shape[-2:]), shape)
        for g, shape in zip(grads, ctx.shapes)
    )


def multi_head_forward_cpu(ctx, qkv, bias, n_head, dropout_p, generator):
    batch, time, width3 = qkv.shape
    ctx.heads_shape = (batch, time, 3, n_head, width3 // (3 * n_head))
    ctx.bias_dtype = None if bias is None else bias.dtype
    # (3, batch * head, time, head width): one copy, which each head reads contiguously; the bias is
    # added as it is made
    heads = qkv.reshape(ctx.heads_shape).transpose(2, 0, 3, 1, 4)  # (3, batch, head, time, head width)
    if bias is not None:
        heads = np.add(heads, bias.reshape(3, 1, n_head, 1, -1), out=buffers.empty(heads.shape, qkv.dtype))
    q, k, v = heads.reshape(3, batch * n_head, time, -1)
    keep = None
    if dropout_p > 0:  # drawn as the reference does, (batch, head, time, time): the batch is the example axis
        keep = masks.keep_mask(generator, (batch, n_head, time, time), dropout_p, np).reshape(-1, time, time)
    y = _attend_on_threads(ctx, q, k, v, True, keep, dropout_p)
    return y.reshape(batch, n_head, time, -1).transpose(0, 2, 1, 3).reshape(batch, time, width3 // 3)


def multi_head_backward_cpu(ctx, grad):
    batch, time, _, n_head, head_width = ctx.heads_shape
    heads = grad.reshape(batch, time, n_head, head_width).transpose(0, 2, 1, 3)
    grad = heads.reshape(batch * n_head, time, -1)
    grad_qkv = buffers.empty(ctx.heads_shape, grad.dtype)
    for i, g in enumerate(_attend_backward_on_threads(ctx, grad)):
        grad_qkv[:, :, i] = g.reshape(batch, n_head, time, head_width).transpose(0, 2, 1, 3)
    grad_qkv = grad_qkv.reshape(batch, time, -1)
    if not ctx.needs_input_grad[1]:
        return grad_qkv, None
    return grad_qkv, grad_qkv.reshape(batch * time, -1).sum(axis=0).astype(ctx.bias_dtype, copy=False)


# ----- the CUDA path: flash attention (autograd/kernels/cuda/attention.cu), for float32 and bfloat16

WIDTHS = (64, 128)  # the head widths of the kernels: a head runs zero-padded in the first that holds it
CUDA_TEXT = compiling.text("attention")  # where the kernels' tile sizes are written


def cuda_tiles(struct, text=CUDA_TEXT):
    """{template arguments: {name: value}} of the specializations of a struct of `text` that holds only
    `static constexpr int name = value, ...;`: cuda_tiles("Tiles")["64"]["forward_keys"] is attention.cu's
    Tiles<64>::forward_keys. Each tile size is written there once, beside the shared memory it fills."""
    found = re.findall(rf"struct {struct}<([^>]+)> \{{\s*static constexpr int ([^;]+);", text)
    return {args: {name: int(n) for name, n in re.findall(r"(\w+) = (\d+)", body)} for args, body in found}


# The rows a block takes per tile set the launch grid. On CUDA cores ("fp32"), Tiles<width>'s
# forward_queries (the forward), backward_keys (the backward over keys) and backward_queries (over
# queries); on tensor cores ("bf16" for bfloat16, "tf32" for float32 under the tf32 policy, not
# CUPY_TF32's; for the head widths of MmaTiles<Element, width>), MMA_ROWS in every kernel. The kernels
# stride over their tiles: any grid gives the same numbers.
TILES, MMA_TILES = cuda_tiles("Tiles"), cuda_tiles("MmaTiles")
MMA_ROWS, TILE_THREADS = (  # a tensor-core block's rows, and every tile kernel's threads a block
    int(re.search(rf"constexpr int {name} = (\d+);", CUDA_TEXT)[1]) for name in ("MMA_ROWS", "TILE_THREADS")
)
MAX_GRID_Y = 65535
NO_BIAS = (np.uintp(0),) * 3  # null pointers: nothing added to q, k and v


def _kernel_width(d, e):
    """The kernels' head width for q and k of width d and v of width e; None when wider than any."""
    return next((width for width in WIDTHS if max(d, e) <= width), None)


def _layout(a, n_head):
    """The (batch, head, row) strides, in elements, of a (batch, rows, n_head * width) array whose last
    axis is contiguous: from a head's row to the same row of the next batch entry, of the next head, and
    to the next row."""
    batch, row, _ = (stride // a.itemsize for stride in a.strides)
    return np.int64(batch), np.int64(a.shape[2] // n_head), np.int64(row)


def _kind(xp, dtype, width):
    """Which kernels run heads of `width` in arrays of `dtype`: "fp32", "tf32" or "bf16" (tensor cores' for
    bfloat16: _fits asks for them)."""
    if dtype == bfloat16:
        return "bf16"
    tf32 = f"float, {width}" in MMA_TILES and products.tf32_asked() and products.tensor_cores(xp)
    return "tf32" if tf32 else "fp32"


def _fits(array, d, e):
    """Whether the kernels take heads of q and k of width d and v of width e, in `array`'s type and
    device: up to 128 wide; bfloat16 on tensor cores only (sm_80 and later)."""
    xp = get_array_module(array)
    return _kernel_width(d, e) is not None and (array.dtype != bfloat16 or products.tensor_cores(xp))


def _launch(ctx, kernel, tile, n_rows, arrays):
    """One tile kernel over every head (grid x) and the tiles of n_rows rows (grid y): `tile` names the
    field of Tiles that holds the rows a block takes on CUDA cores."""
    rows = TILES[str(ctx.width)][tile] if ctx.kind == "fp32" else MMA_ROWS
    grid = (ctx.n_heads, min(-(-n_rows // rows), MAX_GRID_Y))
    engine = {"fp32": "", "bf16": "_mma", "tf32": "_mma_tf32"}[ctx.kind]  # tensor cores' kernels: "mma"
    name = f"{kernel}{engine}_d{ctx.width}"
    sources.kernel("attention", name, ctx.dtype)(grid, (TILE_THREADS,), (*arrays, *ctx.args))


def _flash_forward(ctx, q, k, v, n_head, causal, dropout_p, generator, rows_per_example, biases=NO_BIAS):
    """y (batch, T, n_head * e) for the n_head heads of q (batch, T, n_head * d), k (batch, S, n_head * d)
    and v (batch, S, n_head * e), whose last axes are contiguous: one launch, which also writes each row's
    log-sum-exp (and y in float32 where y is bfloat16: the backward's rowsum(dy y) reads it). `biases`:
    float32 arrays of (n_head * d,), (n_head * d,) and (n_head * e,) that every kernel adds to q's, k's and
    v's rows as it reads them, or NO_BIAS. The dropout mask's examples are rows_per_example rows each of the
    heads' T x S scores in order (masks.keep_mask's example axis is the scores' first). Keeps on ctx what
    _flash_backward reads."""
    xp = get_array_module(q)
    batch, n_queries, n_keys = q.shape[0], q.shape[1], k.shape[1]
    d, e = q.shape[2] // n_head, v.shape[2] // n_head
    out = xp.empty((batch, n_queries, n_head * e), q.dtype)
    seed, step, site, first, threshold = generator.next_key(dropout_p) if dropout_p > 0 else (0, 0, 0, 0, 0)
    ctx.dtype, ctx.width, ctx.n_head, ctx.n_heads = q.dtype, _kernel_width(d, e), n_head, batch * n_head
    ctx.kind = _kind(xp, q.dtype, ctx.width)
    ctx.args = (
        *biases,
        *_layout(q, n_head),
        *_layout(k, n_head),
        *_layout(v, n_head),
        *_layout(out, n_head),
        *map(np.int32, (n_head, n_queries, n_keys, d, e, causal)),
        np.float32(1 / math.sqrt(d)),
        np.float32(masks.keep_scale(dropout_p)),
        np.uint64(seed),
        *map(np.uint32, (step, site, threshold, first, rows_per_example)),
    )
    ctx.lse = xp.empty((batch * n_head, n_queries), np.float32)
    ctx.out_float = out if out.dtype == np.float32 else xp.empty(out.shape, np.float32)  # y in float32
    _launch(ctx, "attention_forward", "forward_queries", n_queries, (q, k, v, out, ctx.out_float, ctx.lse))
    ctx.q, ctx.k, ctx.v = q, k, v
    return out


def _flash_backward(ctx, grad, grad_q, grad_k, grad_v):
    """Writes the gradients of the forward's q, k and v into grad_q, grad_k and grad_v (laid out as those
    are) for y's gradient `grad` (laid out as y): D = rowsum(dy y) first, then dk and dv, then dq: three
    launches."""
    xp = get_array_module(grad)
    dot = xp.empty_like(ctx.lse)
    n_queries, e = ctx.out_float.shape[1], ctx.out_float.shape[2] // ctx.n_head
    args = (ctx.out_float, grad, dot, *_layout(ctx.out_float, ctx.n_head))
    args += (np.int32(ctx.n_head), np.int32(n_queries), np.int32(e), np.int64(dot.size))
    row_dot = sources.kernel("attention", "attention_row_dot", ctx.dtype)
    row_dot((launching.blocks(32 * dot.size),), (launching.THREADS,), args)  # a warp per row
    inputs = (ctx.q, ctx.k, ctx.v, grad, ctx.lse, dot)
    _launch(ctx, "attention_backward_keys", "backward_keys", ctx.k.shape[1], (*inputs, grad_k, grad_v))
    _launch(ctx, "attention_backward_queries", "backward_queries", n_queries, (*inputs, grad_q))


def scaled_dot_product_fits_gpu(q, k, v, causal, dropout_p, generator):
    """The kernels take heads up to 128 wide (_fits) and the heads of q k^T; not heads that v adds of its own
    (they would share a dropout mask), nor empty arrays."""
    heads = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    return (
        np.broadcast_shapes(q.shape[:-2], k.shape[:-2]) == heads
        and _fits(q, q.shape[-1], v.shape[-1])
        and 0 not in (q.size, k.size, v.size)
    )


def scaled_dot_product_forward_gpu(ctx, q, k, v, causal, dropout_p, generator):
    """The kernels take the heads of q k^T, broadcast (copied) where q or k shares them."""
    xp = get_array_module(q)
    heads = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    ctx.shapes, ctx.heads = (q.shape, k.shape, v.shape), heads
    q, k, v = (
        xp.ascontiguousarray(xp.broadcast_to(a, heads + a.shape[-2:])).reshape(-1, *a.shape[-2:])
        for a in (q, k, v)
    )
    rows_per_example = math.prod(heads[1:]) * q.shape[1] if heads else 1  # (T, S) scores: a row per example
    out = _flash_forward(ctx, q, k, v, 1, causal, dropout_p, generator, rows_per_example)
    return out.reshape(heads + out.shape[1:])


def scaled_dot_product_backward_gpu(ctx, grad):
    xp = get_array_module(grad)
    grads = tuple(xp.empty_like(a) for a in (ctx.q, ctx.k, ctx.v))
    _flash_backward(ctx, xp.ascontiguousarray(grad).reshape(ctx.out_float.shape), *grads)
    return tuple(
        unbroadcast(g.reshape(ctx.heads + g.shape[1:]), shape) if need else None
        for g, shape, need in zip(grads, ctx.shapes, ctx.needs_input_grad)
    )


def multi_head_fits_gpu(qkv, bias, n_head, dropout_p, generator):
    """The kernels take heads up to 128 wide (_fits), of a qkv that is not empty."""
    width = qkv.shape[-1] // 3 // n_head
    return _fits(qkv, width, width) and qkv.size > 0


def multi_head_forward_gpu(ctx, qkv, bias, n_head, dropout_p, generator):
    """q, k and v read straight out of qkv (batch, time, 3 * width), the bias's thirds (as float32: a
    bfloat16 one widened) added by the kernels as they read them."""
    xp = get_array_module(qkv)
    width = qkv.shape[2] // 3

    def thirds(a):  # q's, k's and v's part of the last axis
        return tuple(a[..., i * width : (i + 1) * width] for i in range(3))

    q, k, v = thirds(xp.ascontiguousarray(qkv))
    biases = NO_BIAS if bias is None else thirds(launching.float32_or_null(xp, bias))
    ctx.bias_dtype = None if bias is None else bias.dtype
    # the mask is drawn as the reference draws it, (batch, head, time, time): a head's rows per example
    return _flash_forward(ctx, q, k, v, n_head, True, dropout_p, generator, n_head * qkv.shape[1], biases)


def multi_head_backward_gpu(ctx, grad):
    """The gradients of q, k and v written straight into one array like qkv; the bias's, the sums of its
    columns (linear.column_sums: one launch)."""
    xp = get_array_module(grad)
    batch, time, width = grad.shape
    grad_qkv = xp.empty((batch, time, 3 * width), ctx.dtype)
    grads = (grad_qkv[:, :, i * width : (i + 1) * width] for i in range(3))
    _flash_backward(ctx, xp.ascontiguousarray(grad), *grads)
    if not ctx.needs_input_grad[1]:
        return grad_qkv, None
    grad_bias = linear_kernels.column_sums(grad_qkv.reshape(batch * time, 3 * width))
    return grad_qkv, grad_bias.astype(ctx.bias_dtype, copy=False)
