"""Philox4x32-10 against Random123's known answers, and dropout's mask streams: the documented
counter layout, masks that do not depend on how a batch is split, their statistics, and the
current and default streams."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import autograd as ag
from autograd import backend, threads
from autograd import functional as F
from autograd.random import MaskStream, current, default_generator, manual_seed, philox4x32_10, use_masks
from autograd.testing import arrays, leaf
from tests.helpers import GOLDEN_KEEP, GOLDEN_P, ONE_ABOVE, assert_fast_equals_reference

SEEDS = st.integers(0, 2**64 - 1)
STEPS = st.integers(0, 2**40)
PROBABILITIES = st.floats(0.0, 1.0)

# Random123's tests/kat_vectors (github.com/DEShawResearch/random123), the "philox4x32 10" lines:
# counter (4 words), key (2 words), expected output (4 words).
KNOWN_ANSWERS = [
    ((0x00000000,) * 4, (0x00000000,) * 2, (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


def on(device):
    """The array module of the device `device` names."""
    return backend.get_array_module(backend.to_device(np.zeros(1), backend.parse_device(device)))


@pytest.mark.parametrize("counter, key, expected", KNOWN_ANSWERS, ids=["zeros", "ones", "pi"])
def test_philox_gives_random123s_known_answers(device, counter, key, expected):
    xp = on(device)
    words = philox4x32_10([xp.asarray(c, dtype=xp.uint32) for c in counter], key, xp)
    assert all(w.dtype == np.uint32 for w in words)
    assert [int(w) for w in words] == list(expected)


def test_philox_broadcasts_its_counter_words(device):
    """Arrays of counters give, entry by entry, what each counter gives alone."""
    xp = on(device)
    first = xp.arange(5, dtype=xp.uint32)
    second = xp.asarray([[7], [0xFFFFFFFF]], dtype=xp.uint32)
    words = [backend.to_host(w) for w in philox4x32_10((first, second, 3, 9), (11, 12), xp)]
    assert words[0].shape == (2, 5)
    for i in range(2):
        for j in range(5):
            alone = philox4x32_10((j, int(second[i, 0]), 3, 9), (11, 12))
            assert [w[i, j] for w in words] == [int(w) for w in alone]


def layout_mask(seed, step, first_example, site, shape, p):
    """The mask of the module docstring's layout, one entry at a time."""
    n_examples = shape[0] if len(shape) >= 2 else 1
    n_positions = math.prod(shape[1:] if len(shape) >= 2 else shape)
    keep = np.empty((n_examples, n_positions), dtype=bool)
    key = (seed % 2**32, step % 2**32)
    for b in range(n_examples):
        for j in range(n_positions):
            words = philox4x32_10((j // 8, first_example + b, site, seed // 2**32), key)
            number = (int(words[(j % 8) // 2]) >> (16 * (j % 2))) & 0xFFFF
            keep[b, j] = number >= round(p * 65536)
    return keep.reshape(shape)


@st.composite
def mask_cases(draw, max_dims=3):
    """(seed, step, first_example, shape, p) for a small mask."""
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=0, max_size=max_dims)))
    return draw(SEEDS), draw(STEPS), draw(st.integers(0, 2**32 - 6)), shape, draw(PROBABILITIES)


@given(mask_cases(), st.integers(0, 3))
def test_masks_follow_the_documented_counter_layout(device, case, site):
    """Entry (b, j) of draw `site` is the 16-bit half j % 2 of word (j % 8) // 2 of Philox at
    counter (j // 8, first_example + b, site, seed >> 32), key (seed, step), kept when >= p 2^16."""
    seed, step, first_example, shape, p = case
    stream = MaskStream(seed, step, first_example)
    for _ in range(site):
        stream.keep_mask(shape, p, on(device))
    keep = backend.to_host(stream.keep_mask(shape, p, on(device)))
    assert keep.shape == shape and keep.dtype == bool
    np.testing.assert_array_equal(keep, layout_mask(seed, step, first_example, site, shape, p))


@pytest.mark.parametrize("shape", [(3, 300_001), (1, 12, 64, 512), (5000, 9)], ids=["rows", "heads", "many"])
def test_large_masks_cut_into_pieces_follow_the_layout(shape):
    """Masks cut into pieces (rows cut along their counters, or many rows at once) and run on
    threads: the same as one thread draws, and entries sampled across the pieces follow the
    layout."""
    seed, step, first_example, p = 2**40 + 17, 5, 3, 0.25
    before = threads.get_num_threads()
    try:
        threads.set_num_threads(4)
        keep = MaskStream(seed, step, first_example).keep_mask(shape, p)
        threads.set_num_threads(1)
        np.testing.assert_array_equal(MaskStream(seed, step, first_example).keep_mask(shape, p), keep)
    finally:
        threads.set_num_threads(before)
    rows, positions = keep.reshape(shape[0], -1).shape
    rng = np.random.default_rng(0)
    for b, j in zip(rng.integers(0, rows, 50), rng.integers(0, positions, 50)):
        words = philox4x32_10((j // 8, first_example + b, 0, seed >> 32), (seed % 2**32, step))
        number = (int(words[(j % 8) // 2]) >> (16 * (j % 2))) & 0xFFFF
        assert keep.reshape(rows, -1)[b, j] == (number >= 0.25 * 65536)


@given(SEEDS, STEPS, st.lists(st.integers(1, 4), min_size=1, max_size=3), PROBABILITIES, st.data())
def test_a_batch_split_in_two_draws_the_same_masks(device, seed, step, example_shape, p, data):
    """Gradient accumulation and ranks: the masks of a batch of 8 equal, row by row, those of its
    two parts, each drawn from a stream that starts at its first example; site after site."""
    xp = on(device)
    split = data.draw(st.integers(1, 7))
    shape = (8, *example_shape)
    whole = MaskStream(seed, step, first_example=0)
    front, back = MaskStream(seed, step, first_example=0), MaskStream(seed, step, first_example=split)
    for _ in range(3):  # three dropout sites
        keep = backend.to_host(whole.keep_mask(shape, p, xp))
        np.testing.assert_array_equal(
            backend.to_host(front.keep_mask((split, *example_shape), p, xp)), keep[:split]
        )
        np.testing.assert_array_equal(
            backend.to_host(back.keep_mask((8 - split, *example_shape), p, xp)), keep[split:]
        )


@given(SEEDS, STEPS, st.floats(0.05, 0.95))
def test_a_fraction_one_minus_p_is_kept(device, seed, step, p):
    """On 2^20 entries the fraction kept is within 6 standard deviations of 1 - p (p counted in
    steps of 2^-16)."""
    keep = backend.to_host(MaskStream(seed, step).keep_mask((4, 2**18), p, on(device)))
    p = round(p * 65536) / 65536
    assert abs(keep.mean() - (1 - p)) <= 6 * math.sqrt(p * (1 - p) / keep.size)


# The golden case of the keep rule (tests/helpers.py): p = 0xBC57 / 2^16 is position 5's own number.
@pytest.mark.parametrize(
    "p, expected", [(GOLDEN_P, GOLDEN_KEEP), (GOLDEN_P + 2**-16, ONE_ABOVE)], ids=["at", "above"]
)
def test_a_number_equal_to_the_threshold_is_kept(device, p, expected):
    """The golden case, in MaskStream's masks and in dropout itself (on a GPU device, its CUDA
    kernel draws the mask)."""
    assert backend.to_host(MaskStream(0, 0).keep_mask((1, 8), p, on(device))).tolist() == [expected]
    y = F.dropout(ag.tensor(np.ones((1, 8)), device=device), p, generator=MaskStream(0, 0))
    assert (y.numpy() != 0).tolist() == [expected]


@given(SEEDS, STEPS, st.integers(0, 2**32 - 3), st.integers(0, 3), st.integers(0, 40))
def test_a_drawn_number_is_kept_at_its_own_threshold_and_dropped_above_it(seed, step, first, site, j):
    """p = u / 2^16, u the number drawn for entry (1, j) of draw `site`: the entry is kept; at one
    step of 2^-16 more it is dropped."""
    words = philox4x32_10((j // 8, first + 1, site, seed >> 32), (seed % 2**32, step % 2**32))
    u = (int(words[(j % 8) // 2]) >> (16 * (j % 2))) & 0xFFFF
    for above in (0, 1):
        stream = MaskStream(seed, step, first)
        stream.site = site
        assert stream.keep_mask((3, 41), (u + above) / 2**16)[1, j] == (not above), (u, above)


@given(mask_cases())
def test_p_zero_keeps_everything_and_p_one_nothing(device, case):
    seed, step, first_example, shape, _ = case
    stream = MaskStream(seed, step, first_example)
    assert backend.to_host(stream.keep_mask(shape, 0.0, on(device))).all()
    assert not backend.to_host(stream.keep_mask(shape, 1.0, on(device))).any()
    assert stream.site == 2  # p = 1 took a site, as any p does


@given(SEEDS, STEPS)
def test_the_same_seed_step_and_site_draw_the_same_mask_and_others_another(device, seed, step):
    xp = on(device)

    def mask(seed, step, site):
        stream = MaskStream(seed, step)
        for _ in range(site + 1):
            keep = stream.keep_mask((4, 64), 0.5, xp)
        return backend.to_host(keep)

    first = mask(seed, step, 1)
    np.testing.assert_array_equal(mask(seed, step, 1), first)
    for other in (
        mask(seed ^ 1, step, 1),
        mask(seed ^ 2**40, step, 1),
        mask(seed, step + 1, 1),
        mask(seed, step, 0),
    ):
        assert not np.array_equal(other, first)


@pytest.mark.parametrize(
    "seed, step, first_example, message",
    [(-1, 0, 0, "seed"), (2**64, 0, 0, "seed"), (0, -1, 0, "step"), (0, 0, 2**32, "first_example")],
)
def test_stream_arguments_out_of_range_are_refused(seed, step, first_example, message):
    with pytest.raises(ValueError, match=message):
        MaskStream(seed, step, first_example)


def test_dropout_names_a_generator_that_is_not_a_mask_stream():
    """The former argument, a NumPy Generator, is refused with a message that says what to pass."""
    with pytest.raises(TypeError, match="MaskStream, got Generator"):
        F.dropout(ag.tensor(np.ones((2, 3))), 0.5, generator=np.random.default_rng(0))


# ----- the current stream


def test_use_masks_makes_a_stream_current_inside_the_block(device):
    """Dropout given no stream draws from the innermost use_masks block's, then from the one
    outside it again."""
    x = ag.tensor(np.ones((4, 50)), device=device)
    outer, inner = MaskStream(1, 2), MaskStream(3, 4)
    with use_masks(outer):
        first = F.dropout(x, 0.5).numpy()
        with use_masks(inner):
            assert current() is inner
            np.testing.assert_array_equal(
                F.dropout(x, 0.5).numpy(), F.dropout(x, 0.5, generator=MaskStream(3, 4)).numpy()
            )
        assert current() is outer and outer.site == 1
    expected = MaskStream(1, 2)
    np.testing.assert_array_equal(first, F.dropout(x, 0.5, generator=expected).numpy())


def test_manual_seed_restarts_the_default_stream(device):
    """Outside any use_masks block dropout draws from the default stream, MaskStream(seed) after
    manual_seed(seed), which moves on from site to site."""
    x = ag.tensor(np.ones((4, 50)), device=device)
    ag.manual_seed(1234)
    first, second = F.dropout(x, 0.5).numpy(), F.dropout(x, 0.5).numpy()
    assert not np.array_equal(first, second)
    reference = MaskStream(1234)
    np.testing.assert_array_equal(first, F.dropout(x, 0.5, generator=reference).numpy())
    np.testing.assert_array_equal(second, F.dropout(x, 0.5, generator=reference).numpy())
    ag.manual_seed(1234)
    np.testing.assert_array_equal(F.dropout(x, 0.5).numpy(), first)


@pytest.mark.usefixtures("each_path")
@given(arrays((4, 3, 12)), SEEDS, STEPS)
def test_a_model_step_in_two_parts_drops_as_the_whole_batch(device, qkv, seed, step):
    """Attention (its weights' dropout) then dropout, on a batch of 4, gives row by row what its
    parts of 1 and 3 give, each in a stream that starts at its first example: on the fast and the
    reference paths."""

    def forward(qkv, first_example):
        with use_masks(MaskStream(seed, step, first_example)):
            y = F.multi_head_attention(leaf(qkv, device, requires_grad=False), 2, dropout_p=0.5)
            return F.dropout(y, 0.5).numpy()

    whole = forward(qkv, 0)
    np.testing.assert_allclose(forward(qkv[:1], 0), whole[:1], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(forward(qkv[1:], 1), whole[1:], rtol=1e-12, atol=1e-12)


# ----- a stream that starts past example 0 (a rank's part of a batch, a later accumulation step's),
# on the paths that draw its masks themselves: a GPU device's kernels take its first example

FIRST_EXAMPLES = [1, 6, 2**32 - 9]  # the last: the examples' numbers near the top of 32 bits
WIDE_SEED = 2**63 + 2**40 + 11  # its upper 32 bits in the counter, its lower ones in the key


@pytest.mark.parametrize("first_example", FIRST_EXAMPLES)
@pytest.mark.parametrize("dtype", [np.float32, ag.bfloat16])
def test_dropout_keeps_what_its_streams_numpy_mask_keeps(device, dtype, first_example):
    """Two draws (sites 0 and 1) of a stream from first_example over x = 1: y and x's gradient are
    1 / (1 - p) exactly where MaskStream's NumPy mask of the same draw keeps, 0 elsewhere."""
    shape, p = (3, 4, 37), 0.4
    stream, numpy_masks = MaskStream(WIDE_SEED, 5, first_example), MaskStream(WIDE_SEED, 5, first_example)
    for _ in range(2):
        keep = numpy_masks.keep_mask(shape, p, np)
        x = ag.tensor(np.ones(shape), requires_grad=True, dtype=dtype, device=device)
        y = F.dropout(x, p, generator=stream)
        y.backward(np.ones(shape))
        for kept in (y.numpy(), backend.to_host(x.grad)):
            np.testing.assert_array_equal(kept != 0, keep)
            np.testing.assert_allclose(kept[keep].astype(np.float64), 1 / (1 - p), rtol=2**-8)


@pytest.mark.parametrize("first_example", FIRST_EXAMPLES)
def test_attention_drops_the_weights_its_streams_numpy_mask_drops(device, first_example):
    """With v the identity, y is the weights after dropout: zero exactly where MaskStream's NumPy
    mask of the scores drops (or the causal mask hides), for both attention Functions and a stream
    from first_example; and the gradients are the reference's, whose mask that is too (on a GPU
    device, the backward kernels draw it again)."""
    rng, p, (batch, heads, time, keys) = np.random.default_rng(first_example % 7), 0.3, (2, 3, 20, 24)
    q, k = (
        rng.standard_normal((batch, heads, time, 16)) / 2,
        rng.standard_normal((batch, heads, keys, 16)) / 2,
    )
    inputs = [q, k, np.broadcast_to(np.eye(keys), (batch, heads, keys, keys)).copy()]  # v: the identity

    def attend(q, k, v):
        stream = MaskStream(WIDE_SEED, 4, first_example)
        return F.scaled_dot_product_attention(q, k, v, causal=False, dropout_p=p, generator=stream)

    qkv = rng.standard_normal((batch, time, 3 * heads * time)) / 2
    qkv[:, :, 2 * heads * time :] = np.tile(np.eye(time), heads)  # each head's v: the identity

    def attend_packed(qkv):
        return F.multi_head_attention(
            qkv, heads, dropout_p=p, generator=MaskStream(WIDE_SEED, 4, first_example)
        )

    weights = attend(*(ag.tensor(a, dtype=np.float32, device=device) for a in inputs)).numpy()
    keep = MaskStream(WIDE_SEED, 4, first_example).keep_mask(weights.shape, p, np)
    np.testing.assert_array_equal(weights != 0, keep)
    packed = attend_packed(ag.tensor(qkv, dtype=np.float32, device=device)).numpy()
    packed = packed.reshape(batch, time, heads, time).transpose(0, 2, 1, 3)  # (batch, head, T, T)
    keep = MaskStream(WIDE_SEED, 4, first_example).keep_mask(packed.shape, p, np)
    np.testing.assert_array_equal(packed != 0, keep & np.tri(time, dtype=bool))
    assert_fast_equals_reference(attend, inputs, device, np.float32, reference_without_tf32=True)
    assert_fast_equals_reference(attend_packed, [qkv], device, np.float32, reference_without_tf32=True)


@given(mask_cases())
def test_numpy_and_cupy_draw_the_same_masks(gpu_device, case):
    seed, step, first_example, shape, p = case
    cupy = on(gpu_device)
    for xp in (np, cupy):
        assert backend.get_array_module(MaskStream(seed).keep_mask(shape, p, xp)) is xp
    np.testing.assert_array_equal(
        backend.to_host(MaskStream(seed, step, first_example).keep_mask(shape, p, cupy)),
        MaskStream(seed, step, first_example).keep_mask(shape, p, np),
    )


def test_manual_seed_makes_the_default_generator_repeat(device):
    device = backend.parse_device(device)
    manual_seed(1234)
    first = backend.to_host(default_generator(device).random(5))
    manual_seed(1234)
    again = backend.to_host(default_generator(device).random(5))
    manual_seed(4321)
    other = backend.to_host(default_generator(device).random(5))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
