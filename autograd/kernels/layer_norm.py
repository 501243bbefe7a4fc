"""Layer norm's fast paths, and those of the residual layer norm that ends a post-LN sublayer,
ln(x + dropout(y + bias)). The CPU's: rows normalised in cache-sized blocks, on all cores, each
block's passes made while it is in cache. The GPU's (autograd/kernels/cuda/layer_norm.cu): a warp
per row (a block for wide rows) holding the row in registers, the residual's sum and its dropout
mask made as the row is read, and the column sums (dw, db, dbias) in a fixed order."""

import functools

import numpy as np

from .. import backend, buffers, masks, threads
from . import launching, sources
from . import linear as linear_kernels


def _row_dot(a, b):
    """sum(a * b) over the last axis, kept as an axis of 1, without an a * b temporary."""
    return np.einsum("...i,...i->...", a, b)[..., None]


def _normalise(ctx, shape, dtype, weight, bias, eps, fill):
    """Layer norm of the rows that fill(rows, into) writes into `into`, a block of rows at a time,
    each block's passes made while it is in cache; keeps the normalised rows and rstd on ctx."""
    width = shape[-1]
    n_rows = int(np.prod(shape[:-1], dtype=np.int64))
    normed, out = buffers.empty((n_rows, width), dtype), buffers.empty((n_rows, width), dtype)
    rstd = np.empty((n_rows, 1), dtype)

    def normalise(rows):
        n = normed[rows]
        fill(rows, n)
        n -= n.mean(axis=1, keepdims=True)
        rstd[rows] = 1 / np.sqrt(_row_dot(n, n) / width + eps)
        n *= rstd[rows]
        if weight is not None:
            np.multiply(n, weight, out=out[rows])
        else:
            out[rows] = n
        if bias is not None:
            out[rows] += bias

    threads.for_each(normalise, threads.blocks(n_rows, width))
    ctx.normed, ctx.rstd, ctx.weight = normed, rstd, weight
    return out.reshape(shape)


def forward_cpu(ctx, x, weight, bias, eps):
    x2 = x.reshape(-1, x.shape[-1])
    return _normalise(ctx, x.shape, x.dtype, weight, bias, eps, lambda rows, into: np.copyto(into, x2[rows]))


def backward_cpu(ctx, grad):
    return _backward_cpu(ctx, grad, *ctx.needs_input_grad)


def _backward_cpu(ctx, grad, need_x, need_w, need_b):
    normed, rstd, weight = ctx.normed, ctx.rstd, ctx.weight
    width = normed.shape[1]
    grad2 = grad.reshape(-1, width)
    grad_weight = np.einsum("ni,ni->i", grad2, normed) if need_w else None
    grad_x = buffers.empty(normed.shape, grad.dtype) if need_x else None

    def input_gradient(rows):  # rstd (g - mean(g) - normed mean(g normed)), g = grad * weight
        g = grad2[rows] * weight if weight is not None else grad2[rows]
        gx = np.subtract(g, g.mean(axis=1, keepdims=True), out=grad_x[rows])
        n = normed[rows]
        n *= _row_dot(g, n) / width  # normed is not needed after this
        gx -= n
        gx *= rstd[rows]

    if need_x:
        threads.for_each(input_gradient, threads.blocks(len(normed), width))
    return (
        None if grad_x is None else grad_x.reshape(grad.shape),
        grad_weight,
        grad2.sum(axis=0) if need_b else None,
    )


def residual_fits_cpu(x, y, bias, weight, ln_bias, eps, dropout_p, generator):
    """Every array in one type (the NumPy blocks add them in place, and sum in it)."""
    return all(a.dtype == x.dtype for a in (y, bias, weight, ln_bias) if a is not None)


def residual_forward_cpu(ctx, x, y, bias, weight, ln_bias, eps, dropout_p, generator):
    width = x.shape[-1]
    x2, y2 = x.reshape(-1, width), y.reshape(-1, width)
    ctx.keep = masks.keep_mask(generator, y.shape, dropout_p, np) if dropout_p > 0 else None
    ctx.scale = masks.keep_scale(dropout_p)
    keep2 = None if ctx.keep is None else ctx.keep.reshape(-1, width)

    def residual(rows, into):  # x + dropout(y + bias)
        np.add(y2[rows], bias, out=into) if bias is not None else np.copyto(into, y2[rows])
        if keep2 is not None:
            into *= keep2[rows]
            into *= ctx.scale
        into += x2[rows]

    return _normalise(ctx, x.shape, x.dtype, weight, ln_bias, eps, residual)


def residual_backward_cpu(ctx, grads):
    need_x, need_y, need_bias, need_w, need_b = ctx.needs_input_grad
    grad_h, grad_w, grad_b = _backward_cpu(ctx, functools.reduce(np.add, grads), True, need_w, need_b)
    grad_y = grad_h.copy() if ctx.keep is None else masks.drop(grad_h, ctx.keep, ctx.scale)
    grad_bias = grad_y.reshape(-1, grad_y.shape[-1]).sum(axis=0) if need_bias else None
    return grad_h if need_x else None, grad_y if need_y else None, grad_bias, grad_w, grad_b


# ----- the CUDA path (autograd/kernels/cuda/layer_norm.cu)

WARP, WARP_PER_THREAD, BLOCK_PER_THREAD = 32, 32, 16  # as in layer_norm.cu
WARP_WIDTH = WARP * WARP_PER_THREAD  # rows up to 1024 wide: a warp per row, in registers
BLOCK_WIDTH = 1024 * BLOCK_PER_THREAD  # up to 16384 wide: a block per row; wider ones take the reference
ROWS_PER_CHUNK = 8  # the backward: each warp (or block) takes this many rows in order, summing dw, db, dbias


def _row_kernel(name, direction, items, width, dtype):
    """The kernel ("forward" or "backward") of layer_norm.cu's `name` kernels for this width, with its
    grid and block for `items` (the forward's rows, the backward's chunks of rows): blocks of THREADS
    threads with a warp per item, or a block per item of just enough warps."""
    if width <= WARP_WIDTH:
        kernel = sources.kernel("layer_norm", f"{name}_{direction}_warps", dtype)
        return kernel, (-(-items // (launching.THREADS // WARP)),), (launching.THREADS,)
    kernel = sources.kernel("layer_norm", f"{name}_{direction}_blocks", dtype)
    return kernel, (items,), (WARP * -(-width // (WARP * BLOCK_PER_THREAD)),)


def fits_gpu(x, weight, bias, eps):
    """The kernels take rows up to BLOCK_WIDTH wide, of an x that is not empty."""
    return x.size > 0 and x.shape[-1] <= BLOCK_WIDTH


def forward_gpu(ctx, x, weight, bias, eps):
    """The forward kernel keeps mean and rstd (float32, one of each per row) and the backward reads
    x again with them, where the reference keeps the float32 normalised values: x is kept by the
    graph anyway."""
    xp, width = backend.get_array_module(x), x.shape[-1]
    rows, x = x.size // width, xp.ascontiguousarray(x)
    out = xp.empty_like(x)
    ctx.mean, ctx.rstd = xp.empty(rows, np.float32), xp.empty(rows, np.float32)
    ctx.x, ctx.weight = x, launching.float32_or_null(xp, weight)
    ctx.param_dtype = next((p.dtype for p in (weight, bias) if p is not None), x.dtype)
    kernel, grid, block = _row_kernel("layer_norm", "forward", rows, width, x.dtype)
    args = (x, ctx.weight, launching.float32_or_null(xp, bias), out, ctx.mean, ctx.rstd, np.int64(rows))
    kernel(grid, block, args + (np.int32(width), np.float32(eps)))
    return out


def backward_gpu(ctx, grad):
    """dx a row at a time, each chunk of rows summing its dw and db as it goes, and the chunks' sums."""
    need_x, need_w, need_b = ctx.needs_input_grad
    xp, x = backend.get_array_module(grad), ctx.x
    rows, width = x.size // x.shape[-1], x.shape[-1]
    chunks = -(-rows // ROWS_PER_CHUNK)
    grad = xp.ascontiguousarray(grad, dtype=x.dtype)
    grad_x = xp.empty_like(x)
    *scratch, sums = linear_kernels.partial_sums(xp, chunks, 2 * width)
    kernel, grid, block = _row_kernel("layer_norm", "backward", chunks, width, x.dtype)
    args = (x, grad, ctx.weight, ctx.mean, ctx.rstd, grad_x, *scratch, sums)
    kernel(grid, block, args + (np.int64(rows), np.int32(width), np.int32(ROWS_PER_CHUNK)))
    sums = sums.reshape(2, width).astype(ctx.param_dtype, copy=False)
    return grad_x if need_x else None, sums[0] if need_w else None, sums[1] if need_b else None


def residual_fits_gpu(x, y, bias, weight, ln_bias, eps, dropout_p, generator):
    """As layer norm's, with the residual and the branch in one type, of one shape."""
    return x.dtype == y.dtype and x.shape == y.shape and fits_gpu(x, weight, ln_bias, eps)


def _mask_arguments(generator, p, shape, rows):
    """The dropout mask's arguments of the residual kernels: the key of the generator's next draw
    (common.cuh's MaskKey), the rows of one example (the first axis is the example axis) and the
    scale of the entries kept; with p == 0 no draw and a threshold of 0, which keeps every entry."""
    seed, step, site, first, threshold = generator.next_key(p) if p > 0 else (0, 0, 0, 0, 0)
    rows_per_example = rows // shape[0] if len(shape) >= 2 and shape[0] else rows
    key = (np.uint64(seed), np.uint32(step), np.uint32(site), np.uint32(first), np.uint32(threshold))
    return key + (np.int64(max(rows_per_example, 1)), np.float32(masks.keep_scale(p)))


def residual_forward_gpu(ctx, x, y, bias, weight, ln_bias, eps, dropout_p, generator):
    xp, width = backend.get_array_module(x), x.shape[-1]
    rows = x.size // width
    ctx.x, ctx.y = xp.ascontiguousarray(x), xp.ascontiguousarray(y)
    ctx.bias, ctx.weight = launching.float32_or_null(xp, bias), launching.float32_or_null(xp, weight)
    ctx.mask = _mask_arguments(generator, dropout_p, x.shape, rows)
    ctx.mean, ctx.rstd = xp.empty(rows, np.float32), xp.empty(rows, np.float32)
    ctx.bias_dtype = None if bias is None else bias.dtype
    ctx.param_dtype = next((p.dtype for p in (weight, ln_bias) if p is not None), x.dtype)
    out = xp.empty_like(ctx.x)
    kernel, grid, block = _row_kernel("residual_layer_norm", "forward", rows, width, x.dtype)
    args = (ctx.x, ctx.y, ctx.bias, ctx.weight, launching.float32_or_null(xp, ln_bias), out, ctx.mean)
    kernel(grid, block, args + (ctx.rstd, np.int64(rows), np.int32(width), np.float32(eps)) + ctx.mask)
    return out


def residual_backward_gpu(ctx, grads):
    """dout = the sum of the last two gradients of the output's uses (any before them added first),
    dx = dh and dy = dropout(dh) a row at a time, each chunk of rows summing its dw, db and dbias as it
    goes, and the chunks' sums."""
    need_x, need_y, need_bias, need_w, need_b = ctx.needs_input_grad
    xp, x = backend.get_array_module(grads[0]), ctx.x
    rows, width = x.size // x.shape[-1], x.shape[-1]
    chunks = -(-rows // ROWS_PER_CHUNK)
    first, second = (grads[0], None) if len(grads) == 1 else (functools.reduce(xp.add, grads[:-1]), grads[-1])
    first = xp.ascontiguousarray(first, dtype=x.dtype)
    second = np.uintp(0) if second is None else xp.ascontiguousarray(second, dtype=x.dtype)
    grad_x, grad_y = xp.empty_like(x), xp.empty_like(x)
    *scratch, sums = linear_kernels.partial_sums(xp, chunks, 3 * width)
    kernel, grid, block = _row_kernel("residual_layer_norm", "backward", chunks, width, x.dtype)
    args = (x, ctx.y, ctx.bias, first, second, ctx.weight, ctx.mean, ctx.rstd, grad_x, grad_y, *scratch, sums)
    kernel(grid, block, args + (np.int64(rows), np.int32(width), np.int32(ROWS_PER_CHUNK)) + ctx.mask)
    sums = sums.reshape(3, width)
    return (
        grad_x if need_x else None,
        grad_y if need_y else None,
        sums[2].astype(ctx.bias_dtype, copy=False) if need_bias else None,
        sums[0].astype(ctx.param_dtype, copy=False) if need_w else None,
        sums[1].astype(ctx.param_dtype, copy=False) if need_b else None,
    )
