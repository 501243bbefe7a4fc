"""The fast paths of the heavy ops, and the one rule that picks which path an op runs.

A heavy Function's own `forward` and `backward` are its reference: whole-array formulas that
read as the math. Beside them, as in Chainer, it may name fast paths that take the same
arguments and give the same numbers:

    forward_cpu, backward_cpu    NumPy: cache-sized blocks, all cores, in place (a module here)
    forward_gpu, backward_gpu    CuPy: fused CUDA kernels

`choose` is the one rule that picks: the fast path of the arrays' device where the Function has
one, takes the arrays' floating types, and its predicate `fits_cpu` / `fits_gpu` (if it names one)
takes the call's arguments; else the reference. A launcher never falls back on its own.
`use_reference(True)`, or the environment variable AUTOGRAD_REFERENCE=1, makes every op run its
reference, to check a result or to read what runs.
"""

import collections
import os

fast_path_calls = collections.Counter()  # Function name -> calls that ran its fast path (autograd.testing)
_reference_only = os.environ.get("AUTOGRAD_REFERENCE", "0") not in ("", "0")


class use_reference:
    """use_reference(True) makes every op run its reference path from now on, use_reference(False)
    its fast paths again; as a context manager, the choice holds inside the block only."""

    def __init__(self, on=True):
        global _reference_only
        self._before, _reference_only = _reference_only, bool(on)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        global _reference_only
        _reference_only = self._before


def reference_only():
    """True while every op runs its reference path."""
    return _reference_only


FAST_DTYPES = {"cpu": {"float32", "float64"}, "gpu": {"float32", "bfloat16"}}


def choose(function, on_gpu, float_dtypes=(), args=(), attrs=None):
    """(forward, backward) for one call of `function` on arrays of the CPU or of a GPU: its fast
    pair for that device when it has one, `fast_path_allowed` and its `fits_<device>(*args, **attrs)`,
    if any, says the call fits; else its own pair. The two are chosen together: a backward reads what
    its own forward saved."""
    device = "gpu" if on_gpu else "cpu"
    forward = getattr(function, f"forward_{device}")
    fits = getattr(function, f"fits_{device}")
    if forward is not None and fast_path_allowed(device, float_dtypes):
        if fits is None or fits(*args, **(attrs or {})):
            fast_path_calls[function.__name__] += 1
            if (backward := getattr(function, f"backward_{device}")) is None:
                raise TypeError(f"{function.__name__}: forward_{device} without backward_{device}")
            return forward, backward
    return function.forward, function.backward


def fast_path_allowed(device, float_dtypes):
    """Whether a fast path of `device` ("cpu" or "gpu") may run on arrays of `float_dtypes`: unless the
    reference is asked for, the CPU's take float32 and float64, the GPU's float32 and bfloat16 (float64
    on a GPU, as the gradient tests use, runs the reference)."""
    return not _reference_only and all(str(dtype) in FAST_DTYPES[device] for dtype in float_dtypes)
