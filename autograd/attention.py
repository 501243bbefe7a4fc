"""Attention as fused Functions: scaled dot-product attention over given q, k, v, and the
multi-head self-attention of GPT's blocks, which takes q, k and v packed in one array.

Both share one forward and one backward on stacks of heads, (heads, time, width) arrays. They
go through the heads a few at a time, so each head's T x S scores stay in cache from the matrix
product through the softmax to the next product, and the pieces run on all the CPU's cores.
Import them from autograd.functional.
"""
import math

import numpy as np

from . import backend, buffers, parallel
from .backend import get_array_module
from .functional import _check_probability, _keep_mask
from .ops import unbroadcast
from .tensor import Function


def _dropped(ctx, heads, probs):
    """The attention weights of some heads after dropout: probs where kept, times 1 / (1 - p),
    0 elsewhere, in a new array (probs itself without dropout)."""
    if ctx.keep is None:
        return probs
    weights = probs * ctx.keep[heads]
    weights *= ctx.drop_scale
    return weights


def _attend(ctx, q, k, v, causal, dropout_p, generator):
    """softmax(q k^T / sqrt(d) + mask), dropped out, times v, for q (n, T, d), k (n, S, d),
    v (n, S, e); keeps on ctx what _attend_backward needs: the softmax and the dropout mask.
    The scale goes on q (T x d) rather than on the scores (T x S)."""
    xp = get_array_module(q)
    n, n_queries, n_keys = q.shape[0], q.shape[1], k.shape[1]
    if causal and n_queries > n_keys:
        raise ValueError(f"attention: causal with {n_queries} queries but only {n_keys} keys")
    ctx.scale = 1 / math.sqrt(q.shape[-1])
    scaled_q = q * ctx.scale
    ctx.scaled_q, ctx.k, ctx.v = scaled_q, k, v
    # query i sees keys up to i + S - T: the rest are hidden
    hidden = ~xp.tri(n_queries, n_keys, n_keys - n_queries, dtype=bool) if causal else None
    ctx.probs = probs = buffers.empty((n, n_queries, n_keys), q.dtype, xp)
    ctx.keep = _keep_mask(generator, probs.shape, dropout_p) if dropout_p > 0 else None
    ctx.drop_scale = 0.0 if dropout_p == 1 else 1 / (1 - dropout_p)
    out = buffers.empty((n, n_queries, v.shape[-1]), q.dtype, xp)

    def attend(heads):
        scores = xp.matmul(scaled_q[heads], xp.swapaxes(k[heads], -1, -2), out=probs[heads])
        if hidden is not None:
            xp.copyto(scores, -xp.inf, where=hidden)
        scores -= scores.max(axis=-1, keepdims=True)
        xp.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        xp.matmul(_dropped(ctx, heads, scores), v[heads], out=out[heads])

    parallel.run(attend, parallel.blocks(n, n_queries * n_keys, xp), multiplies=True)
    return out


def _attend_backward(ctx, grad, needs=(True, True, True)):
    """Gradients of q, k, v (None where not needed) for the output gradient `grad` (n, T, e).

    With w the dropped weights and G = grad v^T, the scores' gradient is w G - probs rowsum(w G).
    The probabilities kept by the forward are used up."""
    xp = get_array_module(grad)
    scaled_q, k, v, probs = ctx.scaled_q, ctx.k, ctx.v, ctx.probs
    grad_q, grad_k, grad_v = (buffers.empty(a.shape, a.dtype, xp) if need else None
                              for a, need in zip((scaled_q, k, v), needs))

    def backward(heads):
        p = probs[heads]
        weights = _dropped(ctx, heads, p)
        if grad_v is not None:
            xp.matmul(xp.swapaxes(weights, -1, -2), grad[heads], out=grad_v[heads])
        grad_scores = grad[heads] @ xp.swapaxes(v[heads], -1, -2)
        grad_scores *= weights
        p *= grad_scores.sum(axis=-1, keepdims=True)  # without dropout, p is the weights: not needed now
        grad_scores -= p
        if grad_q is not None:
            xp.matmul(grad_scores, k[heads], out=grad_q[heads])
            grad_q[heads] *= ctx.scale
        if grad_k is not None:
            xp.matmul(xp.swapaxes(grad_scores, -1, -2), scaled_q[heads], out=grad_k[heads])

    parallel.run(backward, parallel.blocks(len(probs), probs.shape[1] * probs.shape[2], xp), multiplies=True)
    return grad_q, grad_k, grad_v


class ScaledDotProductAttention(Function):
    """softmax(q k^T / sqrt(d) + mask) v, with optional dropout on the attention weights.

    q: (..., T, d), k: (..., S, d), v: (..., S, e). The queries are the last T of the S
    positions, so the causal mask lets query i see keys 0 .. i + S - T (with T == S: 0 .. i).
    """

    @staticmethod
    def forward(ctx, q, k, v, causal, dropout_p, generator):
        xp = get_array_module(q)
        try:
            heads = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
            fits = q.shape[-1] == k.shape[-1] and k.shape[-2] == v.shape[-2]
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f"attention: shapes q {q.shape}, k {k.shape}, v {v.shape} do not fit together")
        ctx.shapes, ctx.heads = (q.shape, k.shape, v.shape), heads
        q, k, v = (xp.broadcast_to(a, heads + a.shape[-2:]).reshape(-1, *a.shape[-2:]) for a in (q, k, v))
        return _attend(ctx, q, k, v, causal, dropout_p, generator).reshape(heads + (q.shape[1], v.shape[2]))

    @staticmethod
    def backward(ctx, grad):
        grads = _attend_backward(ctx, grad.reshape(-1, *grad.shape[-2:]), ctx.needs_input_grad)
        return tuple(None if g is None else unbroadcast(g.reshape(ctx.heads + shape[-2:]), shape)
                     for g, shape in zip(grads, ctx.shapes))


def scaled_dot_product_attention(q, k, v, causal=True, dropout_p=0.0, generator=None):
    """Attention of queries q over keys k and values v, heads in the leading axes.

    dropout_p applies to the attention weights whenever it is above 0 (pass 0.0 in evaluation).
    """
    _check_probability("scaled_dot_product_attention: dropout_p", dropout_p)
    if dropout_p > 0 and generator is None:
        generator = backend.default_generator(q.device)
    return ScaledDotProductAttention.apply(q, k, v, causal=causal, dropout_p=dropout_p, generator=generator)


class MultiHeadAttention(Function):
    """Causal self-attention of the heads packed in qkv (batch, time, 3 * width), as one
    projection makes them: q, k and v are split into heads, attended, and merged back into
    (batch, time, width), all in one op. Splitting with three GetItems instead would give
    three backwards that each allocate and zero a buffer the size of qkv."""

    @staticmethod
    def forward(ctx, qkv, n_head, dropout_p, generator):
        batch, time, width3 = qkv.shape
        if width3 % (3 * n_head):
            raise ValueError(f"multi_head_attention: {width3} features are not 3 x {n_head} heads")
        ctx.heads_shape = (batch, time, 3, n_head, width3 // (3 * n_head))
        # (3, batch * head, time, head width): one copy, which each head reads contiguously
        q, k, v = qkv.reshape(ctx.heads_shape).transpose(2, 0, 3, 1, 4).reshape(3, batch * n_head, time, -1)
        y = _attend(ctx, q, k, v, True, dropout_p, generator)
        return y.reshape(batch, n_head, time, -1).transpose(0, 2, 1, 3).reshape(batch, time, width3 // 3)

    @staticmethod
    def backward(ctx, grad):
        xp = get_array_module(grad)
        batch, time, _, n_head, head_width = ctx.heads_shape
        grad = grad.reshape(batch, time, n_head, head_width).transpose(0, 2, 1, 3).reshape(batch * n_head, time, -1)
        grad_qkv = buffers.empty(ctx.heads_shape, grad.dtype, xp)
        for i, g in enumerate(_attend_backward(ctx, grad)):
            grad_qkv[:, :, i] = g.reshape(batch, n_head, time, head_width).transpose(0, 2, 1, 3)
        return grad_qkv.reshape(batch, time, -1)


def multi_head_attention(qkv, n_head, dropout_p=0.0, generator=None):
    """Causal self-attention over the heads packed in qkv (batch, time, 3 * width), q then k then
    v, each split into n_head heads; gives the heads' outputs side by side, (batch, time, width).
    The same numbers as splitting qkv and calling scaled_dot_product_attention, in one op."""
    _check_probability("multi_head_attention: dropout_p", dropout_p)
    if dropout_p > 0 and generator is None:
        generator = backend.default_generator(backend.device_of(qkv.data))
    return MultiHeadAttention.apply(qkv, n_head=n_head, dropout_p=dropout_p, generator=generator)
