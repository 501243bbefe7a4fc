"""The basic ops behind Tensor's operators and methods, each forward beside its backward.

Every op works on raw numpy or cupy arrays (`xp` is whichever module the data belongs to).
Binary ops broadcast like numpy; `unbroadcast` sums a gradient back to its input's shape.
"""

import math
from itertools import accumulate

from . import backend, products
from .backend import get_array_module, scatter_add
from .precision import bfloat16, widened
from .tensor import Function


def unbroadcast(grad, shape):
    """Sum `grad` over the axes that broadcasting added or stretched, so it has `shape` again."""
    if grad.shape == shape:
        return grad
    added = grad.ndim - len(shape)
    stretched = tuple(added + i for i, n in enumerate(shape) if n == 1 and grad.shape[added + i] != 1)
    return grad.sum(axis=tuple(range(added)) + stretched).reshape(shape)


def _shape(x):
    """The shape of an array, or () for a plain number."""
    return getattr(x, "shape", ())


class Add(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.shapes = _shape(a), _shape(b)
        return a + b

    @staticmethod
    def backward(ctx, grad):
        need_a, need_b = ctx.needs_input_grad
        return (
            unbroadcast(grad, ctx.shapes[0]) if need_a else None,
            unbroadcast(grad, ctx.shapes[1]) if need_b else None,
        )


class Sub(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.shapes = _shape(a), _shape(b)
        return a - b

    @staticmethod
    def backward(ctx, grad):
        need_a, need_b = ctx.needs_input_grad
        return (
            unbroadcast(grad, ctx.shapes[0]) if need_a else None,
            unbroadcast(-grad, ctx.shapes[1]) if need_b else None,
        )


class Mul(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.a, ctx.b = a, b
        return a * b

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.a, ctx.b
        need_a, need_b = ctx.needs_input_grad
        return (
            unbroadcast(grad * b, _shape(a)) if need_a else None,
            unbroadcast(grad * a, _shape(b)) if need_b else None,
        )


class Div(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.a, ctx.b = a, b
        return a / b

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.a, ctx.b
        need_a, need_b = ctx.needs_input_grad
        grad_over_b = grad / b
        return (
            unbroadcast(grad_over_b, _shape(a)) if need_a else None,
            unbroadcast(-grad_over_b * a / b, _shape(b)) if need_b else None,
        )


class Pow(Function):
    """a ** b. The gradient for b needs a > 0 (it holds log(a))."""

    @staticmethod
    def forward(ctx, a, b):
        out = a**b
        ctx.a, ctx.b, ctx.out = a, b, out
        return out

    @staticmethod
    def backward(ctx, grad):
        a, b, out = ctx.a, ctx.b, ctx.out
        need_a, need_b = ctx.needs_input_grad
        xp = get_array_module(grad)
        grad_a = grad_b = None
        if need_a:  # b * a ** (b - 1), taken as 0 where b == 0 (also at a == 0, where a ** -1 is inf)
            if isinstance(b, (int, float)):
                slope = b * a ** (b - 1) if b != 0 else xp.zeros_like(a)
            else:
                slope = b * a ** xp.where(b == 0, 1, b - 1)
            grad_a = unbroadcast(grad * slope, _shape(a))
        if need_b:
            grad_b = unbroadcast(grad * out * xp.log(xp.asarray(a, dtype=grad.dtype)), _shape(b))
        return grad_a, grad_b


class Neg(Function):
    @staticmethod
    def forward(ctx, a):
        return -a

    @staticmethod
    def backward(ctx, grad):
        return -grad


class MatMul(Function):
    """a @ b with numpy's rules: 1-D operands are promoted, leading (batch) axes broadcast."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.a, ctx.b = a, b
        return _matmul(a, b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.a, ctx.b
        xp = get_array_module(grad)
        # Promote 1-D operands to matrices as the forward did, so one rule serves all cases.
        a2 = a[None, :] if a.ndim == 1 else a
        b2 = b[:, None] if b.ndim == 1 else b
        g2 = grad
        if b.ndim == 1:
            g2 = xp.expand_dims(g2, -1)
        if a.ndim == 1:
            g2 = xp.expand_dims(g2, -2)
        need_a, need_b = ctx.needs_input_grad
        grad_a = grad_b = None
        if need_a:
            grad_a = unbroadcast(_matmul(g2, xp.swapaxes(b2, -1, -2)), a2.shape).reshape(a.shape)
        if need_b:
            if b2.ndim == 2:  # (..., n, k) @ (k, m): one product of two matrices for b
                grad_b = products.matmul(_rows(a2).T, _rows(g2))
            else:
                grad_b = unbroadcast(_matmul(xp.swapaxes(a2, -1, -2), g2), b2.shape)
            grad_b = grad_b.reshape(b.shape)
        return grad_a, grad_b


def _matmul(a, b):
    """a @ b, numpy's matmul; a stack of matrices times a matrix as one product of two matrices (its
    rows stacked), and stacks of bfloat16 on a GPU multiplied in float32: CuPy's products of stacks
    take no bfloat16 and ignore TF32 (products.matmul)."""
    if a.ndim >= 2 and b.ndim == 2:
        return products.matmul(_rows(a), b).reshape(*a.shape[:-1], b.shape[1])
    if a.dtype == bfloat16 and backend.on_gpu(a):
        return (widened(a) @ widened(b)).astype(bfloat16)
    return a @ b


def _rows(a):
    """a (..., k) as the matrix of its rows, (rows, k); k may be 0, which reshape(-1, 0) refuses."""
    return a.reshape(math.prod(a.shape[:-1]), a.shape[-1])


def _normalize_axes(axis, ndim):
    """axis (None, int or tuple, negatives allowed) as a sorted tuple of non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    for ax in axes:
        if not -ndim <= ax < ndim:
            raise ValueError(f"axis {ax} is out of range for a tensor with {ndim} dimensions")
    return tuple(sorted(ax % ndim for ax in axes))


def _keepdims_shape(shape, axes):
    return tuple(1 if i in axes else n for i, n in enumerate(shape))


class Sum(Function):
    """The sum over some axes; bfloat16 adds up in float32 (autograd/precision.py)."""

    @staticmethod
    def forward(ctx, a, axis=None, keepdims=False):
        axes = _normalize_axes(axis, a.ndim)
        ctx.shape, ctx.kept = a.shape, _keepdims_shape(a.shape, axes)
        return widened(a).sum(axis=axes, keepdims=keepdims).astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        return get_array_module(grad).broadcast_to(grad.reshape(ctx.kept), ctx.shape)


class Mean(Function):
    """The mean over some axes; bfloat16 adds up in float32 (autograd/precision.py)."""

    @staticmethod
    def forward(ctx, a, axis=None, keepdims=False):
        axes = _normalize_axes(axis, a.ndim)
        count = 1
        for ax in axes:
            count *= a.shape[ax]
        if count == 0:
            raise ValueError(f"mean over an empty selection: shape {a.shape}, axis {axis}")
        ctx.shape, ctx.kept, ctx.count = a.shape, _keepdims_shape(a.shape, axes), count
        return widened(a).mean(axis=axes, keepdims=keepdims).astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx, grad):
        return get_array_module(grad).broadcast_to(grad.reshape(ctx.kept) / ctx.count, ctx.shape)


class Max(Function):
    """Maximum over axes. Where several entries tie for the maximum, they share its gradient equally."""

    @staticmethod
    def forward(ctx, a, axis=None, keepdims=False):
        axes = _normalize_axes(axis, a.ndim)
        if any(a.shape[ax] == 0 for ax in axes):
            raise ValueError(f"max over an empty selection: shape {a.shape}, axis {axis}")
        out = a.max(axis=axes, keepdims=True)
        ctx.a, ctx.out = a, out
        ctx.axes = axes
        return out if keepdims else out.reshape(tuple(n for i, n in enumerate(a.shape) if i not in axes))

    @staticmethod
    def backward(ctx, grad):
        is_max = ctx.a == ctx.out
        share = is_max / is_max.sum(axis=ctx.axes, keepdims=True, dtype=grad.dtype)
        return share * grad.reshape(ctx.out.shape)


class Exp(Function):
    """e^a, whose derivative is e^a itself: backward reads the output."""

    @staticmethod
    def forward(ctx, a):
        ctx.out = get_array_module(a).exp(a)
        return ctx.out

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.out


class Log(Function):
    """ln a, whose derivative is 1 / a."""

    @staticmethod
    def forward(ctx, a):
        ctx.a = a
        return get_array_module(a).log(a)

    @staticmethod
    def backward(ctx, grad):
        return grad / ctx.a


class Tanh(Function):
    """tanh a; its derivative, 1 - tanh^2 a, is made in the forward from the output."""

    @staticmethod
    def forward(ctx, a):
        out = get_array_module(a).tanh(a)
        ctx.slope = 1 - out * out
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.slope


class Reshape(Function):
    returns_view_of_grad = True

    @staticmethod
    def forward(ctx, a, shape):
        ctx.shape = a.shape
        return a.reshape(shape)

    @staticmethod
    def backward(ctx, grad):
        return grad.reshape(ctx.shape)


class Transpose(Function):
    """Permute axes; axes=None reverses them, as numpy does."""

    returns_view_of_grad = True

    @staticmethod
    def forward(ctx, a, axes=None):
        axes = tuple(reversed(range(a.ndim))) if axes is None else axes
        in_range = all(-a.ndim <= ax < a.ndim for ax in axes)
        if not in_range or sorted(ax % a.ndim for ax in axes) != list(range(a.ndim)):
            raise ValueError(f"transpose axes {axes} are not a permutation of {a.ndim} axes")
        axes = tuple(ax % a.ndim for ax in axes)
        ctx.inverse = tuple(sorted(range(a.ndim), key=axes.__getitem__))
        return a.transpose(axes)

    @staticmethod
    def backward(ctx, grad):
        return grad.transpose(ctx.inverse)


def _may_repeat(index):
    """True when an index holds an integer array or list, which may name a position twice."""
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, list) or getattr(p, "ndim", 0) > 0 and p.dtype.kind in "iu" for p in parts)


class GetItem(Function):
    """a[index] for ints, slices, None, Ellipsis and integer or boolean arrays.

    An integer array may name a position twice; its gradients then add up (a scatter-add, in
    the same order on every run: see backend.scatter_add).
    """

    @staticmethod
    def forward(ctx, a, index):
        ctx.shape, ctx.dtype, ctx.index = a.shape, a.dtype, index
        return a[index]

    @staticmethod
    def backward(ctx, grad):
        if _may_repeat(ctx.index):
            return scatter_add(ctx.shape, ctx.index, grad)
        out = get_array_module(grad).zeros(ctx.shape, dtype=ctx.dtype)
        out[ctx.index] = grad
        return out


class Concat(Function):
    @staticmethod
    def forward(ctx, *arrays, axis=0):
        ctx.axis = axis
        ctx.ends = list(accumulate(a.shape[axis] for a in arrays))[:-1]
        return get_array_module(*arrays).concatenate(arrays, axis=axis)

    @staticmethod
    def backward(ctx, grad):
        return tuple(get_array_module(grad).split(grad, ctx.ends, axis=ctx.axis))


class Stack(Function):
    @staticmethod
    def forward(ctx, *arrays, axis=0):
        ctx.axis = axis
        return get_array_module(*arrays).stack(arrays, axis=axis)

    @staticmethod
    def backward(ctx, grad):
        return tuple(get_array_module(grad).moveaxis(grad, ctx.axis, 0))


class Where(Function):
    """condition ? a : b, elementwise with broadcasting; the condition gets no gradient."""

    @staticmethod
    def forward(ctx, condition, a, b):
        xp = get_array_module(condition, a, b)
        ctx.condition, ctx.shapes = condition, (_shape(a), _shape(b))
        return xp.where(condition, a, b)

    @staticmethod
    def backward(ctx, grad):
        xp = get_array_module(grad)
        _, need_a, need_b = ctx.needs_input_grad
        zero = xp.zeros((), dtype=grad.dtype)
        return (
            None,
            unbroadcast(xp.where(ctx.condition, grad, zero), ctx.shapes[0]) if need_a else None,
            unbroadcast(xp.where(ctx.condition, zero, grad), ctx.shapes[1]) if need_b else None,
        )
