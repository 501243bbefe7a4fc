"""Counter-based random numbers for dropout: Philox4x32-10, and the streams of masks made from it.

Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC11; the Random123
library) turns a 128-bit counter and a 64-bit key into 128 random bits with no state in between:
any number can be computed alone, on any device, in any order. Ten rounds, each

    (c0, c1, c2, c3) -> (hi(M1 c2) ^ c1 ^ k0,  lo(M1 c2),  hi(M0 c0) ^ c3 ^ k1,  lo(M0 c0))

with M0 = 0xD2511F53, M1 = 0xCD9E8D57, hi and lo the two 32-bit halves of a 32 x 32 -> 64-bit
product, and the key (k0, k1) bumped by (0x9E3779B9, 0xBB67AE85) modulo 2^32 between rounds.

A dropout mask comes from a MaskStream(seed, step, first_example). Its n-th draw (n = 0, 1, ...:
the dropout site) gives the mask of an array whose first axis is the example axis, every other
axis flattened (C order) into the position j within an example; an array of fewer than 2 axes is
one example. Entry (b, j) of a draw at site n, for p the probability of dropping, is

    key     = (seed mod 2^32, step mod 2^32)
    counter = (j // 8, first_example + b, n, seed // 2^32)
    (w0, w1, w2, w3) = philox4x32_10(counter, key)
    u       = the 16-bit half j % 2 (0: the low 16 bits) of word w[(j % 8) // 2]
    kept    = u >= round(p * 65536)            (p = 0 keeps all, p = 1 keeps none)

So a mask depends on (seed, step, site, global example index, position) alone, never on the
device, the batch size, how a batch is split over ranks or into gradient-accumulation parts: the
part that starts at example 4 of a step's batch is given first_example=4. A training loop makes
one stream per forward pass and makes it current with `use_masks`; dropout without a stream of
its own draws from `current()`, by default a stream seeded by autograd.manual_seed.
"""

import contextlib
import secrets

import numpy as np

from . import backend, emulator, threads

MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)  # M0, M1
WEYL = (0x9E3779B9, 0xBB67AE85)  # the key's increments (the golden ratio and sqrt(3) - 1, in 32 bits)
LOW32, THIRTY_TWO = np.uint64(0xFFFFFFFF), np.uint64(32)


def philox4x32_10(counter, key, xp=np):
    """Philox4x32-10 of the counter (4 arrays of 32-bit integers, broadcast together) under the
    key (2 integers below 2^32): 4 uint32 arrays of the broadcast shape.

    The words go in two pairs, (c0, c2), which are multiplied, and (c1, c3), which are carried,
    so that a round is five whole-array operations, in place, on uint64 arrays (where a 32 x
    32-bit product fits whole):

        product = (M0 c0, M1 c2)
        (c0, c2) = hi(product), swapped, ^ (c1, c3) ^ (k0, k1)
        (c1, c3) = lo(product), swapped
    """
    shape = np.broadcast_shapes(*(np.shape(c) for c in counter))
    words = [xp.broadcast_to(xp.asarray(c, dtype=xp.uint64), shape) for c in counter]
    multiplied, carried = xp.stack(words[0::2]), xp.stack(words[1::2])  # (2, *shape) each
    pair = (2,) + (1,) * len(shape)  # (M0, M1), (k0, k1): one number per word of a pair, broadcast
    multipliers = xp.asarray(MULTIPLIERS, dtype=xp.uint64).reshape(pair)
    weyl = xp.asarray(WEYL, dtype=xp.uint64).reshape(pair)
    key = xp.asarray(key, dtype=xp.uint64).reshape(pair)
    product = xp.empty_like(multiplied)
    for round_ in range(10):
        if round_:
            key = (key + weyl) & LOW32
        xp.multiply(multiplied, multipliers, out=product)
        swapped = product[::-1]  # (M1 c2, M0 c0)
        xp.right_shift(swapped, THIRTY_TWO, out=multiplied)
        multiplied ^= carried
        multiplied ^= key
        xp.bitwise_and(swapped, LOW32, out=carried)
    (c0, c2), (c1, c3) = multiplied.astype(xp.uint32), carried.astype(xp.uint32)
    return c0, c1, c2, c3


class MaskStream:
    """The dropout masks of one forward pass (see the module's docstring for the layout): draw n
    is the mask of the n-th dropout site reached, for the examples numbered from first_example."""

    def __init__(self, seed, step=0, first_example=0):
        if not 0 <= seed < 2**64:
            raise ValueError(f"MaskStream: seed must lie in [0, 2^64), got {seed}")
        if step < 0:
            raise ValueError(f"MaskStream: step must be at least 0, got {step}")
        if not 0 <= first_example < 2**32:
            raise ValueError(f"MaskStream: first_example must lie in [0, 2^32), got {first_example}")
        self.seed, self.step, self.first_example = int(seed), int(step), int(first_example)
        self.site = 0  # the next draw's
        self.rows_per_example = 1  # rows of a drawn array per example (see rows_per_example)

    def next_key(self, p):
        """The next draw, used up, as the numbers it is drawn from (a CUDA kernel that draws it
        itself takes them: autograd/kernels/cuda/common.cuh): (seed, step mod 2^32, site, the
        first example's index, the threshold round(p * 65536) of the 16-bit numbers kept)."""
        site, self.site = self.site, self.site + 1
        first = self.first_example * self.rows_per_example
        return self.seed, self.step & 0xFFFFFFFF, site, first, round(p * 65536)

    def keep_mask(self, shape, p, xp=np):
        """The next draw: a boolean array of `shape` that keeps each entry with probability 1 - p.
        On the CPU the work is cut into pieces of rows and counters, run on all the cores."""
        seed, step, site, first, threshold = self.next_key(p)
        shape = tuple(shape)
        n_examples = shape[0] if len(shape) >= 2 else 1
        n_positions = int(np.prod(shape[1:] if len(shape) >= 2 else shape))
        if threshold > 0xFFFF:  # p = 1: no 16-bit number is kept
            return xp.zeros(shape, dtype=bool)
        n_counters = -(-n_positions // 8)  # 8 positions per Philox output
        key = (seed & 0xFFFFFFFF, step)
        counters = xp.arange(n_counters, dtype=xp.uint32)  # j // 8
        examples = xp.arange(n_examples, dtype=xp.uint32)[:, None] + xp.uint32(first)
        keep = xp.empty((n_examples, 8 * n_counters), dtype=bool)

        def draw(piece):
            rows, columns = piece
            words = philox4x32_10((counters[columns], examples[rows], site, seed >> 32), key, xp)
            # (rows, columns, 4) words seen as 8 16-bit numbers each, the low half first
            # (little-endian, as on every machine NumPy and CuPy run on)
            numbers = xp.stack(words, axis=-1).view(xp.uint16).reshape(len(words[0]), -1)
            xp.greater_equal(numbers, threshold, out=keep[rows, 8 * columns.start : 8 * columns.stop])

        pieces = [
            (rows, columns)
            for rows in threads.blocks(n_examples, 8 * n_counters, xp)
            for columns in threads.blocks(n_counters, 8, xp)
        ]
        threads.for_each(draw, pieces)
        return keep[:, :n_positions].reshape(shape)


_current = None  # the stream of the innermost use_masks block
_default = None  # the stream dropout draws from outside any: restarted by autograd.manual_seed


@contextlib.contextmanager
def use_masks(stream):
    """`with use_masks(MaskStream(seed, step, first_example)):` dropout inside the block (that
    is given no stream of its own) draws its masks from `stream`."""
    global _current
    before, _current = _current, stream
    try:
        yield stream
    finally:
        _current = before


@contextlib.contextmanager
def rows_per_example(rows):
    """Inside the block, the current stream's draws have `rows` rows per example: the model
    under a task head that reads several sequences per example (both orderings of a pair, every
    answer of a question) sees one row per sequence, numbered first_example * rows onwards."""
    stream = current()
    before, stream.rows_per_example = stream.rows_per_example, rows
    try:
        yield stream
    finally:
        stream.rows_per_example = before


def current():
    """The stream dropout draws from: the innermost use_masks block's, else the default stream
    (seeded by autograd.manual_seed; from a random seed until it is called)."""
    global _default
    if _current is not None:
        return _current
    if _default is None:
        _default = MaskStream(secrets.randbits(64))
    return _default


def restart_default(seed):
    """Make the default stream MaskStream(seed) at its first site (autograd.manual_seed does)."""
    global _default
    _default = MaskStream(seed)


# Random numbers: one generator per device (the weights' initial values), seeded together by
# manual_seed, which also restarts dropout's default mask stream (autograd/random.py).
_generators = {}
_seed = None


def manual_seed(seed):
    """Seed every device's default generator and dropout's default mask stream, so that init
    and dropout are reproducible."""
    global _seed
    _seed = int(seed)
    _generators.clear()
    restart_default(_seed)


def default_generator(device):
    """The default random generator of a device (any name parse_device takes), numpy's (also the
    emulated device's) or cupy's, seeded by manual_seed (the weights' initial values are drawn
    from the CPU's)."""
    device = backend.parse_device(device)
    if device not in _generators:
        if device in ("cpu", emulator.NAME):
            _generators[device] = np.random.default_rng(_seed)
        else:
            with backend.cupy.cuda.Device(backend.gpu_index(device)):
                _generators[device] = backend.cupy.random.default_rng(_seed)
    return _generators[device]
