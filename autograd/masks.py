"""Dropout's masks: which entries a dropout keeps, and by how much it scales them.

Inverted dropout keeps each entry with probability 1 - p and scales it by 1 / (1 - p), so the
expected value is unchanged and evaluation needs no rescaling. Dropout on activations
(functional.dropout) and on attention weights (attention.py and its CPU path) all draw their
masks here, each call the next draw of a counter-based stream (autograd/random.py): the array's
first axis is the example axis.
"""

from .random import MaskStream


def check_probability(name, p):
    if not 0 <= p <= 1:
        raise ValueError(f"{name} must be a probability in [0, 1], got {p}")


def keep_mask(stream, shape, p, xp):
    """A boolean mask of `shape` on xp's device that keeps each entry with probability 1 - p: the
    next draw of `stream`."""
    if not isinstance(stream, MaskStream):
        given = type(stream).__name__
        raise TypeError(f"dropout's generator must be an autograd.random.MaskStream, got {given}")
    return stream.keep_mask(shape, p, xp)


def keep_scale(p):
    """The factor on the entries kept: 1 / (1 - p); 0 when p == 1 and nothing is kept."""
    return 0.0 if p == 1 else 1 / (1 - p)


def drop(x, keep, scale):
    """x where keep is true, times scale; zero elsewhere (a new array)."""
    out = x * keep
    out *= scale
    return out
