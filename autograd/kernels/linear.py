"""Linear's CPU path: the matrix products cut into one run of rows per core (parallel.matmul),
the bias added while each run is still in cache."""

from .. import parallel


def forward_cpu(ctx, x, weight, bias):
    n_in, n_out = weight.shape
    x2 = x.reshape(-1, n_in)
    ctx.x2, ctx.weight, ctx.x_shape = x2, weight, x.shape
    return parallel.matmul(x2, weight, bias).reshape(*x.shape[:-1], n_out)


def backward_cpu(ctx, grad):
    need_x, need_w, need_b = ctx.needs_input_grad
    x2, weight = ctx.x2, ctx.weight
    g2 = grad.reshape(-1, weight.shape[1])
    grad_weight = None
    if need_w:  # in the weight's own memory order: a transposed table (the tied LM head) gets a
        # transposed gradient, so the table's own gradient comes out contiguous, not strided
        grad_weight = parallel.matmul(g2.T, x2).T if _is_transposed(weight) else parallel.matmul(x2.T, g2)
    return (
        parallel.matmul(g2, weight.T).reshape(ctx.x_shape) if need_x else None,
        grad_weight,
        g2.sum(axis=0) if need_b else None,
    )


def _is_transposed(a):
    """True for a 2-D array laid out column by column (the .T of a row-major one)."""
    return a.flags.f_contiguous and not a.flags.c_contiguous
