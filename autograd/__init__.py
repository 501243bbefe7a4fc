"""A small tensor and autograd engine on NumPy arrays or CuPy GPU arrays."""

from . import backend, functional, nn, ops, optim, precision, random
from .backend import cuda_available
from .gradcheck import GradcheckError, gradcheck, jacobian_check  # ag.gradcheck: the function, as in torch
from .kernels import use_reference
from .kernels.sources import CudaSource
from .precision import bfloat16, use_precision
from .random import manual_seed
from .tensor import Function, Tensor, is_grad_enabled, no_grad, tensor


def concat(tensors, axis=0):
    """Join tensors along an existing axis."""
    return ops.Concat.apply(*tensors, axis=axis)


def stack(tensors, axis=0):
    """Join tensors along a new axis."""
    return ops.Stack.apply(*tensors, axis=axis)


def where(condition, a, b):
    """a where condition holds, else b (elementwise, broadcasting); a or b may be numbers."""
    like = a if isinstance(a, Tensor) else b
    if not isinstance(like, Tensor):
        raise TypeError("where: a or b must be a Tensor")
    condition = condition.data if isinstance(condition, Tensor) else backend.to_device(condition, like.device)
    return ops.Where.apply(condition, like._operand(a), like._operand(b))


__all__ = [
    "Function",
    "Tensor",
    "tensor",
    "no_grad",
    "is_grad_enabled",
    "concat",
    "stack",
    "where",
    "functional",
    "nn",
    "optim",
    "gradcheck",
    "jacobian_check",
    "GradcheckError",
    "ops",
    "random",
    "manual_seed",
    "cuda_available",
    "use_reference",
    "CudaSource",
    "precision",
    "use_precision",
    "bfloat16",
]
