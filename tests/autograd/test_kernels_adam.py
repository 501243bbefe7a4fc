"""Adam and clip_grad_norm on their multi-tensor kernels (autograd/kernels/adam.py) give the numbers of
optim.py's own code, the reference: over several steps, in both L2 modes, with vector_l2 on and off,
with parameters left without a gradient, strided gradients, and clipping above and below the limit;
and the bfloat16 copy a parameter keeps under bf16, written by Adam's kernel as astype would round it.

The comparisons run on the GPU devices alone: on the CPU both runs would take the reference. The chunk
layout the kernels read and the rule that picks the path are checked here too."""

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import autograd as ag
from autograd import backend
from autograd.kernels import adam as adam_kernels
from autograd.nn import Parameter
from autograd.optim import Adam, clip_grad_norm
from tests.helpers import assert_adam_close, global_norm, train_with_adam

CHUNK = adam_kernels.CHUNK
SIDES = st.sampled_from([1, 2, 3, 7, 63, 64, 65]) | st.integers(1, 100)  # 64 x 64 is one CHUNK
LENGTHS = st.sampled_from([1, 5, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17]) | st.integers(1, 5000)
SHAPES = st.one_of(st.just(()), st.tuples(LENGTHS), st.tuples(SIDES, SIDES))
GPT1 = [(768,), (768, 2304), (768, 768), (3072,), (768, 3072), (512, 768), (40478, 7)]  # (40478, 7): odd
CLIPS = [None, 0.5, 2.0]  # no clipping; max_norm half the gradients' norm (clipped); twice it (left alone)


def options():
    return st.fixed_dictionaries(
        dict(
            lr=st.floats(1e-3, 0.1),
            betas=st.tuples(st.floats(0.0, 0.95), st.floats(0.5, 0.9999)),
            eps=st.sampled_from([1e-8, 1e-3]),
            l2=st.sampled_from([0.0, 0.01, 0.3]),
        )
    )


@pytest.mark.parametrize("clip", CLIPS)
@pytest.mark.parametrize("vector_l2", [False, True])
@pytest.mark.parametrize("l2_mode", ["decoupled", "coupled"])
@given(st.lists(SHAPES, min_size=1, max_size=6), st.integers(0, 2**32 - 1), st.integers(2, 4), options())
@example(GPT1, 0, 3, dict(lr=6.25e-5, betas=(0.9, 0.999), eps=1e-8, l2=0.01))
def test_adam_and_clipping_on_the_kernels_equal_the_reference(
    gpu_device, l2_mode, vector_l2, clip, shapes, seed, steps, opts
):
    """Parameters, moments and returned norms after several steps: kernels == reference."""
    runs = [
        train_with_adam(
            shapes, seed, steps, gpu_device, reference, clip, l2_mode=l2_mode, vector_l2=vector_l2, **opts
        )
        for reference in (False, True)
    ]
    (params, moments, norms), (ref_params, ref_moments, ref_norms) = runs
    assert_adam_close(params, ref_params, "parameter")
    assert_adam_close(moments, ref_moments, "moment")
    assert_adam_close(norms, ref_norms, "norm")


@pytest.mark.parametrize("l2_mode", ["decoupled", "coupled"])
@given(st.lists(SHAPES, min_size=1, max_size=4), st.integers(0, 2**32 - 1), options())
def test_adam_on_the_kernels_after_load_state_dict(gpu_device, l2_mode, shapes, seed, opts):
    """A restored optimizer holds new moment arrays: the kernels read their pointers, not stale ones."""
    runs = [
        train_with_adam(shapes, seed, 4, gpu_device, reference, restart_at=2, l2_mode=l2_mode, **opts)
        for reference in (False, True)
    ]
    assert_adam_close(runs[0][0], runs[1][0], "parameter")
    assert_adam_close(runs[0][1], runs[1][1], "moment")


@pytest.mark.parametrize("limit", [0.5, 1.0, 3.0])  # times the norm: clipped, at the limit, under it
def test_clipping_scales_down_to_the_limit_and_never_up(device, limit):
    """Gradients over max_norm come out with norm max_norm; those under it, as they were (the factor
    max_norm / norm is held at 1, not let above it)."""
    rng = np.random.default_rng(7)
    grads = [rng.standard_normal(shape).astype(np.float32) for shape in [(CHUNK + 3,), (9, 7), (1,)]]
    params = [Parameter(backend.to_device(np.zeros(g.shape, np.float32), device)) for g in grads]
    for p, g in zip(params, grads):
        p.grad = backend.to_device(g.copy(), device)
    norm = global_norm(grads)
    returned = float(backend.to_host(clip_grad_norm(params, limit * norm)))
    assert returned == pytest.approx(norm, rel=1e-6)
    clipped = [backend.to_host(p.grad) for p in params]
    np.testing.assert_allclose(global_norm(clipped), min(limit, 1.0) * norm, rtol=1e-5)
    if limit > 1:
        for after, before in zip(clipped, grads):
            np.testing.assert_array_equal(after, before)


@given(st.lists(st.integers(0, 3 * CHUNK + 5), min_size=1, max_size=8))
def test_chunks_cover_every_number_of_every_tensor_once(sizes):
    """Chunk b is numbers [start, start + CHUNK) of tensor b's tensor, cut at the tensor's end: the
    chunks cover each tensor in order, without gap or overlap, and an empty tensor has none."""
    tensor, start = adam_kernels.chunk_layout(tuple(sizes))
    assert tensor.dtype == np.int32 and start.dtype == np.int64
    for i, size in enumerate(sizes):
        starts = start[tensor == i]
        np.testing.assert_array_equal(starts, np.arange(0, size, CHUNK))
    assert np.all(np.diff(tensor) >= 0)


def test_the_kernels_take_float32_arrays_of_a_gpu_unless_the_reference_is_asked_for(device):
    on = backend.parse_device(device)
    float32, float64 = (backend.to_device(np.zeros(3, dtype), on) for dtype in (np.float32, np.float64))
    assert adam_kernels.takes([float32]) == (device != "cpu")
    assert not adam_kernels.takes([float32, float64])
    assert not adam_kernels.takes([])
    with ag.use_reference():
        assert not adam_kernels.takes([float32])


def special_values():
    """Float32 values where rounding to bfloat16 is delicate: halfway ties (to even, up and down),
    values just above and below them, the largest float32 (rounds to inf), subnormals, signed zeros,
    infinities and NaNs with payloads."""
    bits = [0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0x7F7FFFFF, 0x00000001, 0x807FFFFF]
    bits += [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7F800001, 0xFFFFFFFF, 0x7FC00000]
    return np.array(bits, dtype=np.uint32).view(np.float32)


def bfloat16_bits(array):
    """The bits of a bfloat16 array, every NaN as one NaN (which NaN a cast gives is the device's choice)."""
    return np.where(np.isnan(array.astype(np.float32)), 0x7FC0, array.view(np.uint16))


def test_adam_writes_the_bfloat16_copy_each_parameter_keeps(device):
    """Under bf16 a parameter keeps a bfloat16 copy (precision.kept_cast). After an Adam step the copy it
    gives is the new parameter rounded as astype(bfloat16) rounds it (a NaN as a NaN): on a GPU the
    kernel writes it in the same pass and marks it current, with no cast after the step. The copies are
    first spoiled, so that only a write can make them right; a parameter without a gradient keeps its copy
    as it was. Two steps: one with lr 0, which leaves the delicate values of special_values() in place,
    then an ordinary one."""
    rng = np.random.default_rng(0)
    on = backend.parse_device(device)
    values = [
        special_values(),
        *(rng.standard_normal(s).astype(np.float32) for s in [(CHUNK + 3,), (65, 64), (7,)]),
    ]
    params = [Parameter(backend.to_device(v, on)) for v in values]
    with np.errstate(invalid="ignore"):  # the NaNs, cast
        copies = [ag.precision.kept_cast(p, ag.bfloat16) for p in params]
        for copy in copies:
            copy[...] = 0
        for lr in (0.0, 1e-2):
            for p in params[:-1]:  # the last has no gradient
                p.grad = backend.to_device(rng.standard_normal(p.shape).astype(np.float32), on)
            Adam(params, lr=lr).step()
            for p, copy in zip(params, copies):
                kept = ag.precision.kept_cast(p, ag.bfloat16)
                assert (kept is copy) == (device != "cpu" or p.grad is None)  # the CPU's reference: cast anew
                if p.grad is None:
                    assert not backend.to_host(kept).astype(np.float32).any()  # left alone: still spoiled
                    continue
                expected = bfloat16_bits(p.numpy().astype(ag.bfloat16))
                np.testing.assert_array_equal(bfloat16_bits(backend.to_host(kept)), expected)
