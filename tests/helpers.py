"""What the test modules share: strategies and inputs, the gradient checks of functionals and layers,
the comparison of an op's fast path with its reference that the kernel tests make, a tokenizer of
whole words for the input transformations and the heads, and dropout's golden case. Test modules
import from here (and from tests/tf32.py, tests/fake_cuda.py), never from one another."""

import math
import re
from pathlib import Path

import ml_dtypes
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import autograd as ag
from autograd import backend
from autograd.gradcheck import jacobian_check
from autograd.kernels import compiling
from autograd.kernels import linear as linear_kernels
from autograd.nn import Parameter
from autograd.optim import Adam, clip_grad_norm
from autograd.testing import arrays, assert_fast_path_matches, assert_gradients, indices, shapes
from tests import tf32
from tinygpt.transformations import SPECIAL_TOKENS

ROOT = Path(__file__).parents[1]
SEEDS = st.integers(0, 2**32 - 1)
EXACT = dict(rtol=1e-10, atol=1e-12)  # float64 against a NumPy formula of the same arithmetic
JACOBIAN_MAX_ENTRIES = 64  # full Jacobian checks only below this many input entries: they cost O(n^2)
LAYER_JACOBIAN_MAX_ENTRIES = 128  # a layer's full Jacobian too when the input and parameters are this small
FENCED = re.compile(r"^```.*?^```", re.M | re.S)  # code blocks: commands and shapes, not references
INTERNALS = (ROOT / "docs" / "internals.md").read_text(encoding="utf-8")

# ----- inputs


def on_device(array, device):
    """A raw integer array (ids, targets) on `device`, as a caller would pass it."""
    return backend.to_device(array, backend.parse_device(device))


def fresh_stream(seed):
    """A new mask stream: one per call, so that each call with a seed draws the same dropout
    masks, on any device."""
    return ag.random.MaskStream(seed)


@st.composite
def linear_inputs(draw):
    """x (..., n_in) with 1 to 3 axes, weight (n_in, n_out), and bias (n_out,) or None."""
    x = draw(arrays(shapes(min_dims=1, max_dims=3)))
    n_in, n_out = x.shape[-1], draw(st.integers(1, 4))
    return x, draw(arrays((n_in, n_out))), draw(st.none() | arrays((n_out,)))


@st.composite
def logits_and_targets(draw, logits=None):
    """Logits (N, C) or (B, T, C), integer targets, and an ignore_index that some targets (never
    all) equal."""
    if logits is None:
        logits = draw(arrays(shapes(min_dims=2, max_dims=3, max_side=5)))
    n_classes = logits.shape[-1]
    targets = draw(indices(n_classes, logits.shape[:-1]))
    ignore_index = draw(st.sampled_from([-100, -1]))
    ignored = draw(hnp.arrays(np.bool_, targets.shape))
    ignored.flat[0] = False
    return logits, np.where(ignored, ignore_index, targets), ignore_index


@st.composite
def attention_inputs(draw, causal=st.booleans()):
    """q (..., T, d), k (..., S, d), v (..., S, e), causal: 0 to 2 leading head axes, each of
    which q, k or v may share (size 1, broadcast); S = T when causal, any S otherwise."""
    causal = draw(causal)
    heads = draw(shapes(min_dims=0, max_dims=2, max_side=3))
    n_queries, d, e = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    n_keys = n_queries if causal else draw(st.integers(1, 4))

    def heads_of_one_input():
        shared = draw(st.lists(st.booleans(), min_size=len(heads), max_size=len(heads)))
        return tuple(1 if s else n for s, n in zip(shared, heads))

    q = draw(arrays(heads_of_one_input() + (n_queries, d)))
    k = draw(arrays(heads_of_one_input() + (n_keys, d)))
    v = draw(arrays(heads_of_one_input() + (n_keys, e)))
    return q, k, v, causal


@st.composite
def packed_heads(draw):
    """qkv (batch, time, 3 * width) as c_attn makes it, and the number of heads."""
    batch, time, n_head, head_width = (draw(st.integers(1, n)) for n in (2, 4, 3, 3))
    return draw(arrays((batch, time, 3 * n_head * head_width))), n_head


WORDS = "the cat sat on a mat dog ran far yes no".split()


class WordTokenizer:
    """One id per word of a fixed list, then the three special tokens: easy to read by hand."""

    def __init__(self, words=WORDS):
        self.ids = {word: i for i, word in enumerate(words)}
        self.special_tokens = {name: len(words) + i for i, name in enumerate(SPECIAL_TOKENS)}
        self.vocab_size = len(words) + len(SPECIAL_TOKENS)

    def encode(self, text):
        return [self.ids[word] for word in text.split()]


# The golden case of the keep rule u >= round(p * 2^16). MaskStream(0, 0)'s first draw, example 0,
# positions 0..7, draws Random123's first known answer (Philox at counter 0, key 0) as 16-bit numbers,
# the low half of each word first: E8D5 6627 C58D E169 AC4C BC57 DBD8 9B00. p = 0xBC57 / 2^16 sets
# the threshold to position 5's own number, which is kept.
GOLDEN_P, GOLDEN_KEEP = 0xBC57 / 2**16, [True, False, True, True, False, True, True, False]
ONE_ABOVE = [keep and j != 5 for j, keep in enumerate(GOLDEN_KEEP)]  # p = 0xBC58 / 2^16 drops it


def normal(rng, shape, scale=1.0, shift=0.0):
    return rng.standard_normal(shape) * scale + shift


GPT1_WIDTH = 768
# widths around a warp's and a block's registers (1024: a warp per row; 16384: a block per row; wider:
# the reference), GPT-1's, and odd ones
WIDTHS = [1, 2, 3, 31, 32, 33, 767, GPT1_WIDTH, 1023, 1024, 1025, 3000, 16384, 16385]
# leading axes: one row, rows around a block of 8 warps and a chunk of 32 rows of dw and db, two axes
LEADS = [(), (1,), (3,), (8,), (9,), (31,), (33,), (65,), (2, 5), (3, 33)]


def layer_norm_dtypes(dtype, n_params):
    """x in `dtype`; the weight and bias float32 for bfloat16 x (the bf16 policy), else `dtype`."""
    return [dtype] + [np.float32 if dtype == ag.bfloat16 else dtype] * n_params


# ----- gradients against finite differences, NumPy references


def check_gradients_at(fn, inputs):
    """The gradients along a random direction, the full Jacobian too when the inputs are small."""
    assert_gradients(fn, *inputs)
    if sum(x.size for x in inputs if x.requires_grad) <= JACOBIAN_MAX_ENTRIES:
        jacobian_check(fn, inputs)


def on(device):
    return backend.parse_device(device)


def with_values(module, seed, device):
    """`module` on `device` with float64 parameters drawn from U(-1, 1): generic values, so that
    (unlike the near-zero init) every path through the layer shows in its output."""
    rng = np.random.default_rng(seed)
    module.to(device)
    for p in module.parameters():
        p.data = backend.to_device(rng.uniform(-1.0, 1.0, p.shape), on(device))
    return module


def host(module):
    """{name: host copy} of the module's parameters."""
    return {name: p.numpy() for name, p in module.named_parameters()}


def check_layer_gradients(module, x, seed=0):
    """Finite-difference checks of module(x) with respect to x (when a Tensor) and every
    parameter; the dropout masks are reseeded on each call so every call computes the same function."""

    def fn(x, *params):
        ag.manual_seed(seed)
        return module(x)

    named = dict(module.named_parameters())
    inputs = [x, *named.values()]
    assert_gradients(fn, *inputs, names=["x", *named])
    if sum(t.size for t in inputs if isinstance(t, ag.Tensor)) <= LAYER_JACOBIAN_MAX_ENTRIES:
        jacobian_check(fn, inputs)


def ref_gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


# ----- the compiled kernels


def ptx_of(name):
    """The PTX of autograd/kernels/cuda/<name>.cu for compute_90, compiled once for all the tests:
    the kernel cache holds it for the next test and the next process."""
    return compiling.cached(compiling.text(name), name, "compute_90").decode()


# ----- fast paths against their references

TOLERANCE = {  # (rtol, atol)
    np.dtype(np.float32): (2e-5, 2e-6),
    np.dtype(np.float64): (1e-10, 1e-12),
    ag.bfloat16: (2**-7, 2**-7),  # one bfloat16 rounding apart at most
}
WITH_BF16 = [np.float32, np.float64, ag.bfloat16]  # the GPU's fast paths take bfloat16 too


def upstream(shape):
    """The fixed random gradient sent into an output of `shape`: assert_fast_path_matches's for seed 0."""
    return np.random.default_rng(0).standard_normal(shape)


def forward_and_backward(fn, inputs, device, dtype, reference):
    """fn's output and its inputs' gradients for the fixed upstream, as host arrays, on the reference path
    or on the fast ones; the inputs of `dtype`, or each of its own type where `dtype` is a list of them."""
    dtypes = dtype if isinstance(dtype, list) else [dtype] * len(inputs)
    with ag.use_reference(reference):
        tensors = [ag.tensor(a, requires_grad=True, dtype=t, device=device) for a, t in zip(inputs, dtypes)]
        out = fn(*tensors)
        out.backward(upstream(out.shape))
    return [out.numpy()] + [backend.to_host(t.grad) for t in tensors]


def assert_paths_agree(fn, inputs, dtypes, device, slack=(), scale=0.0, reference=None):
    """autograd.testing.assert_fast_path_matches, each input of its own type and requiring grad, with the
    project's TOLERANCE: the output within the least precise of its type and its inputs', each gradient
    within its input's. Rounding follows the largest values an entry is computed from, so the absolute part
    scales with the largest entry of the result (a small entry next to large ones may come out of a
    cancellation), or with `scale` where larger, plus slack[i] for the output or gradient i."""
    options = dict(tolerances=TOLERANCE, scale=scale, slack=slack, reference=reference)
    assert_fast_path_matches(fn, *inputs, device=device, dtype=list(dtypes), **options)


def assert_fast_equals_reference(fn, inputs, device, dtype, reference_without_tf32=False, terms=0.0):
    """assert_paths_agree's comparison for inputs of one type, the absolute tolerance scaled by the
    inputs and by `terms` (the largest term of a sum inside the op) too. A float32 result whose products
    ran in TF32 is held to TF32's error (tests/tf32.py)."""
    rtol, atol = TOLERANCE[np.dtype(dtype)]
    if np.dtype(dtype) == np.float32:
        atol = tf32.tolerance(device, rtol, atol)["atol"]  # max(atol, tf32.RELATIVE_ERROR) where TF32 is on
    # a fast path with products of its own (attention's kernels: float32's on CUDA cores, whatever
    # CUPY_TF32 says, or TF32's on tensor cores under the tf32 policy) is held to a reference whose
    # float32 products are float32's, and to TF32's error where TF32 was asked for
    reference = tf32.off(device) if reference_without_tf32 else None
    floats = [x for x in inputs if isinstance(x, np.ndarray) and x.dtype.kind == "f"]
    scale = max([terms] + [np.abs(x[np.isfinite(x)]).max(initial=0) for x in floats])
    options = dict(tolerances=TOLERANCE | {np.dtype(dtype): (rtol, atol)}, scale=scale, reference=reference)
    assert_fast_path_matches(fn, *inputs, device=device, dtype=dtype, **options)


def summation_slack(ids, table_shape, out_dtype, dtype):
    """How far apart two sums of a table row's m gradient vectors g, added in different orders, may
    be: each is within (m - 1) u sum|g| of the exact sum (u: the unit roundoff of `dtype`, in which
    the reference adds), so 2 m u sum|g|, per entry of the table; g, upstream()'s gradient of the rows
    as it arrives in their type, `out_dtype`."""
    unit_roundoff = ml_dtypes.finfo(dtype).eps / 2
    (n_rows, width), ids = table_shape, np.asarray(ids)
    flat = upstream((ids.size, width)).astype(out_dtype).astype(np.float64)
    magnitudes = np.zeros((n_rows, flat.shape[1]))
    np.add.at(magnitudes, ids.reshape(-1), np.abs(flat))
    repeats = np.bincount(ids.reshape(-1), minlength=n_rows)[:, None]
    return 2 * repeats * unit_roundoff * magnitudes


MEAN_CHAIN = 40  # the most additions in a chain of either path's sum of a row: a lane's 32 entries,
# then 5 shuffles; NumPy's pairwise sum, 8 accumulators over blocks of 128


def mean_rounding_slack(x, weight, affine, dtype, eps=1e-5):
    """How far apart the rounding of a row's mean alone may put the two paths' y, dx, dw and db. Each
    path sums the row in its own order, its mean within (k + 1) u max|x| of the exact one (k additions
    in a chain, u the unit roundoff of the float32 math, float64's for float64). A mean off by delta
    moves n = (x - mean) rstd by delta rstd, so, to first order, y by delta rstd |w|, dx by
    delta rstd^2 |mean(g n) + n mean(g)| (g = dy w), dw by the sum over rows of delta rstd |dy|, and
    db not at all: nothing in most rows, much where a row's spread is tiny beside its values."""
    u = np.finfo(np.float32 if dtype == ag.bfloat16 else dtype).eps / 2
    x = x.astype(dtype).astype(np.float64)
    delta = 2 * (min(x.shape[-1] - 1, MEAN_CHAIN) + 1) * u * np.abs(x).max(axis=-1, keepdims=True)
    centered = x - x.mean(axis=-1, keepdims=True)
    rstd = 1 / np.sqrt((centered * centered).mean(axis=-1, keepdims=True) + eps)
    n, w, dy = centered * rstd, weight if "weight" in affine else 1.0, upstream(x.shape)
    g, moved_n = dy * w, delta * rstd  # moved_n: how far every n of a row may move
    mean_gn, mean_g = (g * n).mean(axis=-1, keepdims=True), g.mean(axis=-1, keepdims=True)
    dx = moved_n * rstd * (np.abs(mean_gn) + np.abs(n * mean_g))
    dw = (moved_n * np.abs(dy)).reshape(-1, x.shape[-1]).sum(axis=0)
    return [moved_n * np.abs(w), dx] + [dw if name == "weight" else 0.0 for name in affine]


def column_sums_in_their_order(x, rows_per_chunk):
    """The column sums of a (rows, width) array as column_sums.cu and partial_sums.cuh add them, in
    float32: each chunk's rows one after another, then FAN_IN of the chunks' sums at a time, one after
    another, and so on up a tree of such groups to one."""
    x = x.astype(np.float32)

    def in_order(rows):
        total = np.zeros(x.shape[1], np.float32)
        for row in rows:
            total += row
        return total

    firsts = range(0, max(len(x), 1), rows_per_chunk)
    level = [in_order(x[first : first + rows_per_chunk]) for first in firsts]
    fan_in = linear_kernels.FAN_IN
    while True:
        level = [in_order(level[first : first + fan_in]) for first in range(0, len(level), fan_in)]
        if len(level) == 1:
            return level[0]


# ----- Adam on its kernels


def adam_gradients(rng, shapes, device):
    """One step's gradients, about one in four None; 2-D ones sometimes strided (a transposed copy)."""
    grads = []
    for shape in shapes:
        if rng.random() < 0.25:
            grads.append(None)
            continue
        g = (rng.standard_normal(shape) * rng.uniform(0.1, 10)).astype(np.float32)
        strided = len(shape) == 2 and rng.random() < 0.3
        grads.append(backend.to_device(g.T.copy(), device).T if strided else backend.to_device(g, device))
    return grads


def global_norm(grads):
    return float(
        np.sqrt(sum((backend.to_host(g).astype(np.float64) ** 2).sum() for g in grads if g is not None))
    )


def train_with_adam(shapes, seed, steps, device, reference, clip=None, restart_at=None, **options):
    """Float32 parameters of `shapes` stepped `steps` times by Adam(**options) on the kernels or on the
    reference: lr rising each step as a schedule would, clip_grad_norm(max_norm = clip x the norm)
    before each step when `clip`, and the optimizer rebuilt from its saved state at step
    `restart_at` (new moment arrays). Returns host copies of the parameters, the moments and the norms."""
    rng = np.random.default_rng(seed)
    device = backend.parse_device(device)
    params = [Parameter(backend.to_device(rng.standard_normal(s).astype(np.float32), device)) for s in shapes]
    lr, norms = options.pop("lr"), []
    with ag.use_reference(reference):
        opt = Adam(params, lr=lr, **options)
        for step in range(steps):
            if step == restart_at:
                state, opt = opt.state_dict(), Adam(params)
                opt.load_state_dict(state)  # copies of the moments: new arrays
            for p, g in zip(params, adam_gradients(rng, shapes, device)):
                p.grad = g
            if clip is not None:
                norms.append(
                    backend.to_host(clip_grad_norm(params, clip * global_norm([p.grad for p in params])))
                )
            opt.lr = lr * (step + 1) / steps
            opt.step()
    return [p.numpy() for p in params], [backend.to_host(a) for a in opt.m + opt.v], norms


def assert_adam_close(fast, reference, what):
    rtol, atol = TOLERANCE[np.dtype(np.float32)]
    assert len(fast) == len(reference)
    for i, (a, b) in enumerate(zip(fast, reference)):
        assert a.dtype == b.dtype == np.float32 and a.shape == b.shape, f"{what} {i}"
        np.testing.assert_allclose(a, b, rtol, atol, err_msg=f"{what} {i}")


def join_pair(pieces, left, right):
    """BPE's merge of one pair by its definition: each adjacent (left, right), left to right, joined."""
    joined, i = [], 0
    while i < len(pieces):
        if pieces[i : i + 2] == [left, right]:
            joined.append(left + right)
            i += 2
        else:
            joined.append(pieces[i])
            i += 1
    return joined
