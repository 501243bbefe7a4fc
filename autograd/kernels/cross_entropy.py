"""Cross-entropy's fast paths.

CPU: the forward goes through the logits in blocks of rows, so its exp lands in a small buffer,
and keeps only each row's maximum and log-sum-exp; the backward writes softmax(logits) -
onehot(target) straight into the one array it returns, block by block.

CUDA (autograd/kernels/cuda/cross_entropy.cu): one block per row reduces the row's maximum and
sum of exp in float32 and keeps only those two numbers (the log-sum-exp, in the reference's two
parts), and one more block reduces the losses to their sum or mean; the backward writes
softmax(logits) - onehot(target), weighted, from the logits and them, in the logits' type.
A mean loss costs two launches forward and one back.
"""

import numpy as np

from .. import backend, buffers, threads
from . import launching, sources

REDUCE_THREADS = 1024  # the one block that adds the rows' losses


def reduced(ctx, losses, reduction, shape):
    """The losses (rows,) of the rows ctx.counted as `reduction` asks: of `shape` ("none"), their sum,
    or their sum over the number of rows counted, at least 1 ("mean"). ctx.divisor keeps what the
    loss's gradient is divided by before it reaches the rows: that number for a mean, else 1."""
    xp = backend.get_array_module(losses)
    ctx.divisor = xp.maximum(ctx.counted.sum(dtype=losses.dtype), 1) if reduction == "mean" else 1.0
    return losses.reshape(shape) if reduction == "none" else losses.sum() / ctx.divisor


def forward_cpu(ctx, logits, targets, ignore_index, reduction):
    n_classes = logits.shape[-1]
    logits2, flat_targets = logits.reshape(-1, n_classes), targets.reshape(-1)
    counted = flat_targets != ignore_index
    rows = np.arange(len(flat_targets))
    row_max = logits2.max(axis=1, keepdims=True) if len(rows) else np.zeros((0, 1), logits.dtype)
    log_sum = np.empty_like(row_max)

    def log_sum_exp(rows):
        shifted = logits2[rows] - row_max[rows]  # the largest is 0, so exp never overflows
        log_sum[rows] = np.log(np.exp(shifted, out=shifted).sum(axis=1, keepdims=True))

    threads.for_each(log_sum_exp, threads.blocks(len(rows), n_classes))
    safe_targets = np.where(counted, flat_targets, 0)
    losses = (log_sum[:, 0] - (logits2[rows, safe_targets] - row_max[:, 0])) * counted
    ctx.logits2, ctx.row_max, ctx.log_sum = logits2, row_max, log_sum
    ctx.rows, ctx.targets, ctx.counted, ctx.shape = rows, safe_targets, counted, logits.shape
    return reduced(ctx, losses, reduction, targets.shape)


def backward_cpu(ctx, grad):
    weight = (grad.reshape(-1) / ctx.divisor * ctx.counted)[:, None]
    grad_logits = buffers.empty(ctx.logits2.shape, ctx.logits2.dtype)

    def softmax_times_weight(rows):
        probs = np.subtract(ctx.logits2[rows], ctx.row_max[rows], out=grad_logits[rows])
        probs -= ctx.log_sum[rows]
        np.exp(probs, out=probs)
        probs *= weight[rows]

    threads.for_each(softmax_times_weight, threads.blocks(*grad_logits.shape))
    grad_logits[ctx.rows, ctx.targets] -= weight[:, 0]
    return grad_logits.reshape(ctx.shape), None


def forward_gpu(ctx, logits, targets, ignore_index, reduction):
    xp = backend.get_array_module(logits)
    n_classes = logits.shape[-1]
    if n_classes == 0:
        raise ValueError("cross_entropy: logits with no classes have no log-sum-exp")
    ctx.logits = xp.ascontiguousarray(logits)  # the input itself (a copy only if it is strided)
    ctx.targets = xp.ascontiguousarray(targets.reshape(-1), dtype=xp.int64)
    ctx.ignore_index, rows = ignore_index, len(ctx.targets)
    losses = xp.empty(rows, xp.float32)
    ctx.row_max, ctx.log_sum = xp.empty(rows, xp.float32), xp.empty(rows, xp.float32)  # for the backward
    if rows:
        kernel = sources.kernel("cross_entropy", "cross_entropy_forward", logits.dtype)
        written = (losses, ctx.row_max, ctx.log_sum)
        kernel(
            (rows,),
            (launching.THREADS,),
            (ctx.logits, ctx.targets, *written, np.int64(n_classes), np.int64(ignore_index)),
        )
    ctx.divisor = None  # the gradient is one per row
    if reduction == "none":
        return losses.reshape(targets.shape)
    total, ctx.divisor = xp.empty((), xp.float32), xp.empty((), xp.float32)
    args = (losses, ctx.targets, total, ctx.divisor, np.int64(rows), np.int64(ignore_index))
    sources.kernel("cross_entropy", "cross_entropy_reduce", np.float32)(
        (1,), (REDUCE_THREADS,), (*args, np.int32(reduction == "mean"))
    )
    return total


def backward_gpu(ctx, grad):
    xp = backend.get_array_module(grad)
    grad = xp.ascontiguousarray(grad.reshape(-1), dtype=xp.float32)  # one loss gradient per row, or one
    grad_logits = xp.empty(ctx.logits.shape, ctx.logits.dtype)
    rows, n_classes = len(ctx.targets), ctx.logits.shape[-1]
    if rows:
        kernel = sources.kernel("cross_entropy", "cross_entropy_backward", grad_logits.dtype)
        saved = (ctx.logits, ctx.targets, ctx.row_max, ctx.log_sum)
        divisor = np.uintp(0) if ctx.divisor is None else ctx.divisor
        kernel(
            (rows,),
            (launching.THREADS,),
            (*saved, grad, divisor, grad_logits, np.int64(n_classes), np.int64(ctx.ignore_index)),
        )
    return grad_logits, None
