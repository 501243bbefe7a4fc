"""Check backward passes against central finite differences, in float64.

`gradcheck` works at any size: it compares the derivative along one random direction per input.
`jacobian_check` compares every entry of the Jacobian, so it says exactly where two disagree;
it costs two forward passes per input entry and one backward per output entry, so keep it small.
"""

import math
import numbers
import reprlib

import numpy as np

from .backend import to_device, to_host
from .tensor import Tensor, no_grad


class GradcheckError(AssertionError):
    """The backward pass disagrees with finite differences."""


def _checked_settings(caller, eps, atol, rtol):
    """Refuse a step or tolerance out of its range: a zero or NaN step divides by nothing, a
    negative tolerance fails every op however right, an infinite one passes every op."""
    for name, value, least in (("eps", eps, "> 0"), ("atol", atol, ">= 0"), ("rtol", rtol, ">= 0")):
        finite = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
        if not finite or value < 0 or (value == 0 and name == "eps"):
            raise ValueError(f"{caller}: {name} must be a finite number {least}, got {value!r}")


def _checked_inputs(fn, inputs, names, caller):
    if not isinstance(inputs, (list, tuple)):
        raise TypeError(
            f"{caller}: inputs must be a list of fn's arguments ([x] for one), not a {type(inputs).__name__}"
        )
    if not callable(fn):
        raise TypeError(f"{caller}: fn must be callable, got a {type(fn).__name__}")
    if names is not None and len(names) != len(inputs):
        raise ValueError(f"{caller}: {len(names)} names for {len(inputs)} inputs")
    inputs = list(inputs)
    if not any(isinstance(x, Tensor) and x.requires_grad for x in inputs):
        raise ValueError(f"{caller}: no input requires grad, so there is nothing to check")
    for i, x in enumerate(inputs):
        if isinstance(x, Tensor) and x.requires_grad and x.dtype != np.float64:
            raise TypeError(f"{caller}: input {i} is {x.dtype}; finite differences need float64")
    with no_grad():
        out = fn(*inputs)
    if not isinstance(out, Tensor):
        raise TypeError(f"{caller}: fn returned {reprlib.repr(out)} ({type(out).__name__}), not a Tensor")
    if out.dtype != np.float64:
        raise TypeError(f"{caller}: fn returned {out.dtype}, not float64")
    return inputs, out.shape


def _backward(fn, inputs, weights):
    """The gradient of sum(weights * fn(inputs)) for every input, as host arrays."""
    for x in inputs:
        if isinstance(x, Tensor):
            x.grad = None
    fn(*inputs).backward(weights)
    return [None if not isinstance(x, Tensor) or x.grad is None else to_host(x.grad) for x in inputs]


def _weighted_sum(fn, inputs, weights):
    with no_grad():
        return float(to_host((fn(*inputs).data * weights).sum()))


def _close(analytic, numeric, atol, rtol):
    return abs(analytic - numeric) <= atol + rtol * abs(numeric)


def _name(i, names):
    return f"input {names[i] if names else i}"


def gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-5, seed=0, names=None):
    """Check the gradient of fn(*inputs) for each float64 input that requires grad.

    The output is weighted by random numbers w, and for each input x a random direction u is
    drawn: the backward's <dL/dx, u> must equal (L(x + eps u) - L(x - eps u)) / (2 eps), where
    L = sum(w * fn(...)). fn must compute the same function on every call (fix dropout's seed).
    Raises GradcheckError naming every input that disagrees (by `names`, else by position).
    """
    _checked_settings("gradcheck", eps, atol, rtol)
    inputs, out_shape = _checked_inputs(fn, inputs, names, "gradcheck")
    rng = np.random.default_rng(seed)
    device = next(x.device for x in inputs if isinstance(x, Tensor))
    weights = to_device(rng.standard_normal(out_shape), device)
    grads = _backward(fn, inputs, weights)

    failures = []
    for i, x in enumerate(inputs):
        if not (isinstance(x, Tensor) and x.requires_grad):
            continue
        direction = rng.standard_normal(x.shape)
        direction /= max(np.linalg.norm(direction), 1e-300)
        analytic = float((grads[i] * direction).sum()) if grads[i] is not None else 0.0
        original, step = x.data, to_device(eps * direction, device)
        try:
            x.data = original + step
            plus = _weighted_sum(fn, inputs, weights)
            x.data = original - step
            minus = _weighted_sum(fn, inputs, weights)
        finally:
            x.data = original
        numeric = (plus - minus) / (2 * eps)
        if not _close(analytic, numeric, atol, rtol):
            failures.append(
                f"{_name(i, names)} of shape {x.shape}: backward gives {analytic:.10g} along a "
                f"random direction, finite differences {numeric:.10g} "
                f"(difference {abs(analytic - numeric):.3g})"
            )
    if failures:
        raise GradcheckError("gradients disagree with finite differences:\n  " + "\n  ".join(failures))


def jacobian_check(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-5, max_entries=10, names=None):
    """Compare the whole Jacobian of fn(*inputs) with central differences, entry by entry.

    Raises GradcheckError listing up to `max_entries` disagreeing entries as
    input[index] -> output[index]: backward value, finite-difference value; an input is named by
    `names`, else by its position.
    """
    _checked_settings("jacobian_check", eps, atol, rtol)
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
        raise ValueError(f"jacobian_check: max_entries must be an integer >= 1, got {max_entries!r}")
    inputs, out_shape = _checked_inputs(fn, inputs, names, "jacobian_check")
    device = next(x.device for x in inputs if isinstance(x, Tensor))
    out_size = int(np.prod(out_shape))
    checked = [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x.requires_grad]

    # analytic[i][j] is the gradient of output entry j with respect to input i
    analytic = {i: np.zeros((out_size,) + inputs[i].shape) for i in checked}
    for j in range(out_size):
        one_hot = np.zeros(out_size)
        one_hot[j] = 1
        grads = _backward(fn, inputs, to_device(one_hot.reshape(out_shape), device))
        for i in checked:
            if grads[i] is not None:
                analytic[i][j] = grads[i]

    bad = []
    for i in checked:
        x = inputs[i]
        original = x.data
        for index in np.ndindex(*x.shape):
            step = np.zeros(x.shape)
            step[index] = eps
            step = to_device(step, device)
            try:
                with no_grad():
                    x.data = original + step
                    plus = to_host(fn(*inputs).data).reshape(-1)
                    x.data = original - step
                    minus = to_host(fn(*inputs).data).reshape(-1)
            finally:
                x.data = original
            numeric = (plus - minus) / (2 * eps)
            for j in range(out_size):
                a, n = analytic[i][(j,) + index], numeric[j]
                if not _close(a, n, atol, rtol):
                    output = [int(k) for k in np.unravel_index(j, out_shape)]
                    bad.append(
                        f"{_name(i, names)}{list(index)} -> output {output}: "
                        f"backward {a:.10g}, finite differences {n:.10g}"
                    )
    if bad:
        shown = "\n  ".join(bad[:max_entries])
        more = f"\n  ... and {len(bad) - max_entries} more" if len(bad) > max_entries else ""
        raise GradcheckError(
            f"{len(bad)} Jacobian {'entry disagrees' if len(bad) == 1 else 'entries disagree'} "
            f"with finite differences:\n  {shown}{more}"
        )
