"""Attention's CPU path, for both attention Functions: stacks of heads, (heads, time, width)
arrays, go through a few heads at a time, so that each head's T x S scores stay in cache from the
matrix product through the softmax to the next product, and the pieces run on all the cores.
The scale goes on q (T x d) rather than on the scores (T x S)."""

import math

import numpy as np

from .. import buffers, masks, parallel
from ..ops import unbroadcast


def _dropped(ctx, heads, probs):
    """The attention weights of some heads after dropout (probs itself without dropout)."""
    if ctx.keep is None:
        return probs
    return masks.drop(probs, ctx.keep[heads], ctx.keep_scale)


def _attend(ctx, q, k, v, causal, keep, dropout_p):
    """softmax(q k^T / sqrt(d) + mask), dropped out where `keep` (n, T, S) is false (no dropout
    when it is None), times v, for q (n, T, d), k (n, S, d), v (n, S, e); keeps the softmax and
    the dropout mask on ctx for _attend_backward."""
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

    parallel.run(attend, parallel.blocks(n, n_queries * n_keys), multiplies=True)
    return out


def _attend_backward(ctx, grad, needs=(True, True, True)):
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

    parallel.run(backward, parallel.blocks(len(probs), probs.shape[1] * probs.shape[2]), multiplies=True)
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
    return _attend(ctx, q, k, v, causal, keep, dropout_p).reshape(heads + (q.shape[1], v.shape[2]))


def scaled_dot_product_backward_cpu(ctx, grad):
    grads = _attend_backward(ctx, grad.reshape(-1, *grad.shape[-2:]), ctx.needs_input_grad)
    return tuple(
        None if g is None else unbroadcast(g.reshape(ctx.heads + shape[-2:]), shape)
        for g, shape in zip(grads, ctx.shapes)
    )


def multi_head_forward_cpu(ctx, qkv, n_head, dropout_p, generator):
    batch, time, width3 = qkv.shape
    ctx.heads_shape = (batch, time, 3, n_head, width3 // (3 * n_head))
    # (3, batch * head, time, head width): one copy, which each head reads contiguously
    q, k, v = qkv.reshape(ctx.heads_shape).transpose(2, 0, 3, 1, 4).reshape(3, batch * n_head, time, -1)
    keep = None
    if dropout_p > 0:  # drawn as the reference does, (batch, head, time, time): the batch is the example axis
        keep = masks.keep_mask(generator, (batch, n_head, time, time), dropout_p, np).reshape(-1, time, time)
    y = _attend(ctx, q, k, v, True, keep, dropout_p)
    return y.reshape(batch, n_head, time, -1).transpose(0, 2, 1, 3).reshape(batch, time, width3 // 3)


def multi_head_backward_cpu(ctx, grad):
    batch, time, _, n_head, head_width = ctx.heads_shape
    grad = (
        grad.reshape(batch, time, n_head, head_width).transpose(0, 2, 1, 3).reshape(batch * n_head, time, -1)
    )
    grad_qkv = buffers.empty(ctx.heads_shape, grad.dtype)
    for i, g in enumerate(_attend_backward(ctx, grad)):
        grad_qkv[:, :, i] = g.reshape(batch, n_head, time, head_width).transpose(0, 2, 1, 3)
    return grad_qkv.reshape(batch, time, -1)
