"""Precision policies: which floating type the activations and the matrix products use.

    fp32   float32 throughout (the default)
    tf32   float32 values; on a GPU, float32 matrix products run on TF32 tensor cores (inputs
           rounded to 10 bits of mantissa, float32 accumulation); everything else float32
    bf16   activations, and so the inputs of matrix products, in bfloat16 (ml_dtypes); the
           weights, their gradients, Adam's moments, and the statistics of layer norm, softmax,
           cross-entropy and reductions in float32

Under bf16 a model's activations become bfloat16 where they start, at the embedding: its output
is bfloat16, and every op after it follows its input's type. An op that holds float32 weights
(linear, layer norm) reads them in its input's type and gives them float32 gradients; an op
that needs statistics (layer norm, softmax, cross-entropy, attention's softmax, GELU) computes
them in float32 and gives its output in its input's type; cross-entropy's loss is float32.

A policy holds inside `with use_precision("bf16"): ...`, or for the forward pass of a Module whose
`precision` is set. A training step holds it around the backward pass too, which is where TF32
matters as much as in the forward pass.
"""

import contextlib

import ml_dtypes
import numpy as np

from . import backend, products

bfloat16 = np.dtype(ml_dtypes.bfloat16)
POLICIES = ("fp32", "tf32", "bf16")
_policy = "fp32"


def current():
    """The policy in force: "fp32", "tf32" or "bf16"."""
    return _policy


@contextlib.contextmanager
def use_precision(policy):
    """`with use_precision("bf16"): ...`: the policy holds inside the block (None: the one in force)."""
    global _policy
    if policy is not None and policy not in POLICIES:
        raise ValueError(f"precision must be one of {', '.join(POLICIES)}, got {policy!r}")
    before = _policy
    _policy = before if policy is None else policy
    tf32_before = products.set_tf32(_policy == "tf32")
    try:
        yield _policy
    finally:
        _policy = before
        products.set_tf32(tf32_before)


def is_floating(dtype):
    """True for float16/32/64 and bfloat16 (whose NumPy kind is not "f", but "V")."""
    return dtype.kind == "f" or dtype == bfloat16


def is_numeric(dtype):
    """True for what a tensor may hold: bool, integers and the floating types (not None, text,
    objects or complex numbers)."""
    return isinstance(dtype, np.dtype) and (dtype.kind in "biu" or is_floating(dtype))


def activation_dtype(dtype):
    """The type of the activations that start from values of `dtype` (an embedding's weights):
    bfloat16 under bf16 for float32 weights, else `dtype` itself."""
    return bfloat16 if _policy == "bf16" and dtype == np.float32 else np.dtype(dtype)


def kept_cast(tensor, dtype):
    """The tensor's array in `dtype`, as a product with activations of that type reads it (Linear).

    Under bf16 a float32 weight would be cast at every use; instead it keeps a bfloat16 copy
    (`tensor._kept`) with the version it was made from, used while the tensor keeps that version and
    cast anew once it changed. Setting or reading `.data` lets the copy go (a write may follow), so a
    kept copy is always of the tensor's own array. Adam's GPU kernel writes it in the pass that updates
    the weight (autograd/kernels/adam.py): a step casts no weight at all.
    """
    array = tensor._data
    if dtype != bfloat16 or array.dtype != np.float32:
        with backend.device_scope(array):
            return array.astype(dtype, copy=False)
    if tensor._kept is None or tensor._kept[0] != tensor._version:
        with backend.device_scope(array):
            tensor._kept = (tensor._version, array.astype(bfloat16))
    return tensor._kept[1]


def widened(array):
    """A bfloat16 array as float32, for statistics and elementwise math (any other array as it
    is): NumPy computes on bfloat16 slowly, and sums of bfloat16 lose what float32 keeps."""
    return array.astype(np.float32) if array.dtype == bfloat16 else array
