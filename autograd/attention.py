"""Attention as Functions: scaled dot-product attention over given q, k, v, and the multi-head
self-attention of GPT's blocks, which takes q, k and v packed in one array as one projection
makes them. Both rest on one reference formula, `_attend`, and its backward. Import them from
autograd.functional.
"""

import math

import numpy as np

from . import masks, random
from .backend import get_array_module
from .kernels import attention as attention_kernels
from .ops import unbroadcast
from .precision import widened
from .tensor import Function, Tensor


def _attend(ctx, q, k, v, causal, dropout_p, generator):
    """softmax(q k^T / sqrt(d) + mask), dropped out, times v, for q (..., T, d), k (..., S, d),
    v (..., S, e); keeps on ctx what _attend_backward needs. The arithmetic is float32 for
    bfloat16 inputs (autograd/precision.py), the result in their type."""
    xp, ctx.dtype = get_array_module(q), q.dtype
    q, k, v = widened(q), widened(k), widened(v)
    probs, ctx.scale = _probabilities(q, k, causal)  # (..., T, S)
    ctx.keep = masks.keep_mask(generator, probs.shape, dropout_p, xp) if dropout_p > 0 else None
    ctx.keep_scale = masks.keep_scale(dropout_p)
    weights = probs if ctx.keep is None else masks.drop(probs, ctx.keep, ctx.keep_scale)  # (..., T, S)
    ctx.q, ctx.k, ctx.v, ctx.probs, ctx.weights = q, k, v, probs, weights
    return (weights @ v).astype(ctx.dtype, copy=False)  # (..., T, e)


def _probabilities(q, k, causal):
    """softmax(q k^T / sqrt(d) + mask) over the keys, (..., T, S), and the scale 1 / sqrt(d)."""
    xp, n_queries, n_keys = get_array_module(q), q.shape[-2], k.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1])
    scores = (q @ xp.swapaxes(k, -1, -2)) * scale  # (..., T, S)
    if causal:  # query i sees keys 0 .. i + S - T: the queries are the last T of the S positions
        scores = xp.where(xp.tri(n_queries, n_keys, n_keys - n_queries, dtype=bool), scores, -xp.inf)
    probs = xp.exp(scores - scores.max(axis=-1, keepdims=True))
    return probs / probs.sum(axis=-1, keepdims=True), scale


def attention_weights(q, k, causal=True):
    """The weights attention puts on each key (before dropout) for q (..., T, d) and k (..., S, d):
    (..., T, S), float32 for bfloat16 inputs. A look inside, outside the graph."""
    return Tensor(_probabilities(widened(q._data), widened(k._data), causal)[0])


def _attend_backward(ctx, grad):
    """Gradients of q, k and v for the output's gradient (..., T, e), with P the softmax and W
    the weights after dropout."""
    xp, grad = get_array_module(grad), widened(grad)
    grad_v = xp.swapaxes(ctx.weights, -1, -2) @ grad  # dv = W^T dy: (..., S, e)
    grad_weights = grad @ xp.swapaxes(ctx.v, -1, -2)  # dW = dy v^T: (..., T, S)
    if ctx.keep is not None:
        grad_weights = masks.drop(grad_weights, ctx.keep, ctx.keep_scale)  # dP: through the same mask
    # dS = P (dP - rowsum(dP P)): softmax's backward, row by row
    grad_scores = ctx.probs * (grad_weights - (grad_weights * ctx.probs).sum(axis=-1, keepdims=True))
    grad_q = (grad_scores @ ctx.k) * ctx.scale  # (..., T, d)
    grad_k = (xp.swapaxes(grad_scores, -1, -2) @ ctx.q) * ctx.scale  # (..., S, d)
    return tuple(g.astype(ctx.dtype, copy=False) for g in (grad_q, grad_k, grad_v))


class ScaledDotProductAttention(Function):
    """Attention of queries over keys and values, heads in the leading axes (broadcast):

        S = q k^T / sqrt(d), with -inf where the causal mask hides a key
        P = softmax(S) over the keys,   W = dropout(P),   y = W v

    and back, with dy the output's gradient and dP = dropout(dW) through the same mask:

        dv = W^T dy,   dW = dy v^T,   dS = P (dP - rowsum(dP P)),
        dq = dS k / sqrt(d),   dk = dS^T q / sqrt(d)
    """

    @staticmethod
    def forward(ctx, q, k, v, causal, dropout_p, generator):
        ctx.shapes = q.shape, k.shape, v.shape
        return _attend(ctx, q, k, v, causal, dropout_p, generator)

    @staticmethod
    def backward(ctx, grad):
        grads = _attend_backward(ctx, grad)
        return tuple(
            unbroadcast(g, shape) if need else None  # back to each input's own heads
            for g, shape, need in zip(grads, ctx.shapes, ctx.needs_input_grad)
        )

    forward_cpu = attention_kernels.scaled_dot_product_forward_cpu
    backward_cpu = attention_kernels.scaled_dot_product_backward_cpu
    forward_gpu = attention_kernels.scaled_dot_product_forward_gpu
    fits_gpu = attention_kernels.scaled_dot_product_fits_gpu
    backward_gpu = attention_kernels.scaled_dot_product_backward_gpu


def scaled_dot_product_attention(q, k, v, causal=True, dropout_p=0.0, generator=None):
    """Attention of queries q (..., T, d) over keys k (..., S, d) and values v (..., S, e), heads
    in the leading axes. The queries are the last T of the S positions, so the causal mask lets
    query i see keys 0 .. i + S - T (with T == S: 0 .. i). dropout_p applies to the attention
    weights whenever it is above 0 (pass 0.0 in evaluation), with a mask of the shape of the
    scores q k^T (their first axis the example axis) drawn from `generator`, an
    autograd.random.MaskStream, by default the current stream."""
    masks.check_probability("scaled_dot_product_attention: dropout_p", dropout_p)
    try:
        np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        fits = q.shape[-1] == k.shape[-1] and k.shape[-2] == v.shape[-2]
    except ValueError:
        fits = False
    if not fits or q.shape[-1] == 0 or (k.shape[-2] == 0 and q.shape[-2] > 0):  # heads of width 0, no keys
        raise ValueError(f"attention: shapes q {q.shape}, k {k.shape}, v {v.shape} do not fit together")
    if causal and q.shape[-2] > k.shape[-2]:
        raise ValueError(f"attention: causal with {q.shape[-2]} queries but only {k.shape[-2]} keys")
    if dropout_p > 0 and generator is None:
        generator = random.current()
    return ScaledDotProductAttention.apply(q, k, v, causal=causal, dropout_p=dropout_p, generator=generator)


class MultiHeadAttention(Function):
    """Causal self-attention of the heads packed in qkv + b (B, T, 3 D), as one projection makes
    them (b its bias, of (3 D,), or none): q, k and v, each split into H heads of width D / H, are
    attended head by head (ScaledDotProductAttention's formula) and the heads' outputs set side by
    side, (B, T, D). One op, so that the backward writes the three gradients straight into one array
    like qkv, dqkv; db = the sum of dqkv's rows."""

    mixes_floats = True  # bfloat16 qkv, float32 bias

    @staticmethod
    def forward(ctx, qkv, bias, n_head, dropout_p, generator):
        batch, time, width3 = qkv.shape
        ctx.n_head, ctx.bias, dtype = n_head, bias, qkv.dtype
        qkv = qkv if bias is None else widened(qkv) + bias  # float32 for bfloat16 qkv, not rounded
        heads = qkv.reshape(batch, time, 3, n_head, -1).transpose(2, 0, 3, 1, 4)  # (3, B, H, T, D / H)
        y = _attend(ctx, heads[0], heads[1], heads[2], True, dropout_p, generator)  # (B, H, T, D / H)
        ctx.dtype = dtype  # the output and dqkv in qkv's type
        return y.transpose(0, 2, 1, 3).reshape(batch, time, -1).astype(dtype, copy=False)  # (B, T, D)

    @staticmethod
    def backward(ctx, grad):
        xp = get_array_module(grad)
        batch, time, width = grad.shape
        grad = grad.reshape(batch, time, ctx.n_head, -1).transpose(0, 2, 1, 3)  # (B, H, T, D / H)
        grads = xp.stack(_attend_backward(ctx, grad))  # (3, B, H, T, D / H): q, k, v
        grad_qkv = grads.transpose(1, 3, 0, 2, 4).reshape(batch, time, 3 * width)  # (B, T, 3 D)
        db = None if ctx.bias is None else widened(grad_qkv).sum(axis=(0, 1)).astype(ctx.bias.dtype)
        return grad_qkv, db

    forward_cpu = attention_kernels.multi_head_forward_cpu
    backward_cpu = attention_kernels.multi_head_backward_cpu
    forward_gpu = attention_kernels.multi_head_forward_gpu
    fits_gpu = attention_kernels.multi_head_fits_gpu
    backward_gpu = attention_kernels.multi_head_backward_gpu


def multi_head_attention(qkv, n_head, dropout_p=0.0, generator=None, bias=None):
    """Causal self-attention over the heads packed in qkv + bias (batch, time, 3 * width), q then k
    then v, each split into n_head heads; gives the heads' outputs side by side, (batch, time, width).
    The same numbers as splitting qkv and calling scaled_dot_product_attention, in one op, dropout
    too: the weights' mask, (batch, head, time, time), is one draw of `generator` (by default the
    current stream). bias (3 * width,): the projection's that made qkv, added as the heads are read."""
    masks.check_probability("multi_head_attention: dropout_p", dropout_p)
    if qkv.shape[-1] % (3 * n_head) or qkv.shape[-1] == 0:
        raise ValueError(f"multi_head_attention: {qkv.shape[-1]} features are not 3 x {n_head} heads")
    if bias is not None and bias.shape != qkv.shape[-1:]:
        raise ValueError(f"multi_head_attention: bias has shape {bias.shape}, expected ({qkv.shape[-1]},)")
    if dropout_p > 0 and generator is None:
        generator = random.current()
    return MultiHeadAttention.apply(qkv, bias, n_head=n_head, dropout_p=dropout_p, generator=generator)
