"""The count of what a step costs a GPU (autograd/gpu_costs.py), made on the emulated device: the gpt1
preset's training step pinned, launch by launch and byte by byte, so that a change to it shows in review;
the bf16 step against what an H100's profiler saw; and the counting itself: a known sequence of
operations, run=False, counting off, the categories of the names a GPU profiler shows, the comparison
with a profile."""

import functools
import json
from pathlib import Path

import numpy as np
import pytest

import autograd as ag
from autograd import backend, emulator, gpu_costs, products
from autograd import functional as F
from autograd.emulator import kernels as emulator_kernels
from autograd.gpu_costs import Launch
from autograd.optim import Adam, clip_grad_norm
from tinygpt import GPT, GPTConfig

EMULATED = emulator.NAME
RESULTS = Path(__file__).parents[2] / "bench" / "results"  # what GPUs measured

# ----- the gpt1 preset's training step at batch 8 x 512, as bench/gpu_check.py measures it on a GPU

FP32 = (  # kernels, launches per category (memcpys in "copies"), (bytes read, bytes written) per category
    300,
    {
        "attention": 48,
        "matrix products": 147,
        "layer norm": 48,  # the residual layer norm, a launch each way: bias, dropout, residual, norm, sums
        "elementwise": 28,  # GELU with its bias each way; the embeddings' sum and the gradients' sum there
        "reductions": 13,  # the QKV biases' column sums, the loss's, clipping's, the positions' cupy_sum
        "optimizer": 4,
        "embedding": 4,  # a launch each way for each table: no sort
        "loss": 3,  # the rows' losses, their mean, the gradient
        "dropout": 2,  # the embeddings'; the blocks' are drawn in the residual layer norm and attention
        "copies": 5,
    },
    {
        "attention": (1972703232, 759693312),
        "layer norm": (1800511488, 1036155744),
        "elementwise": (2100252672, 1379164864),
        "reductions": (465567744, 17838096),
        "optimizer": (2796948888, 1864556552),
        "embedding": (140150784, 140077056),
        "loss": (1326530568, 663240712),
        "dropout": (28311552, 28311552),
        "copies": (65536, 67876),
    },
)
BF16 = (
    300,
    FP32[1],  # the weights' bfloat16 copies kept, written by Adam: no casts
    {
        "attention": (1066733568, 457703424),
        "layer norm": (900833280, 583170912),
        "elementwise": (1174622208, 762602176),
        "reductions": (232783872, 17051664),
        "optimizer": (2796948888, 2096600072),
        "embedding": (133072896, 132999168),
        "loss": (663339016, 331644936),
        "dropout": (15728640, 15728640),
        "copies": (65536, 67876),
    },
)
PINNED = {"fp32": FP32, "tf32": FP32, "bf16": BF16}  # TF32: other attention kernels, as many, reading as much


@pytest.fixture(scope="module")
def gpt1_step():
    """A function that counts, with run=False, one training step of the gpt1 preset on the emulated
    device in a precision (once each): forward, loss, backward, clipping, Adam. A first step, not
    counted, uploads Adam's tables, as the profiler's step comes after a first one. The fp32 and tf32
    steps are counted first; then a first bf16 step, not counted, casts the weights to the bfloat16
    copies they keep from then on (and Adam writes in every later step)."""
    ag.manual_seed(0)
    model = GPT(GPTConfig.gpt1()).to(EMULATED).train()
    optimizer = Adam(model.parameters(), lr=2.5e-4, l2=0.01)
    ids = backend.to_device(np.random.default_rng(0).integers(0, 40478, (8, 513)), EMULATED)

    @functools.cache
    def counted(precision, clip=True):
        with gpu_costs.count_launches(run=False) as cost:
            with ag.use_precision(precision), ag.random.use_masks(ag.random.MaskStream(0)):
                loss = F.cross_entropy(model(ids[:, :-1]), ids[:, 1:])
                optimizer.zero_grad()
                loss.backward()
                if clip:
                    clip_grad_norm(model.parameters(), 1.0)
                optimizer.step()
        return cost

    counted.__wrapped__("fp32")
    for precision in ("fp32", "tf32"):  # before the weights keep bfloat16 copies
        counted(precision)
    counted.__wrapped__("bf16")
    return counted


@pytest.mark.parametrize("precision", PINNED)
def test_the_gpt1_step_costs_what_was_pinned(gpt1_step, precision):
    """A change to these numbers is a change to what a step costs a GPU: pin the new ones on purpose."""
    cost = gpt1_step(precision)
    assert (cost.kernels, cost.by_category(), cost.bytes_by_category()) == PINNED[precision]
    assert cost.total - cost.kernels == 2  # the gradients' pointers uploaded for clipping and for Adam


def test_the_gpt1_steps_glue_is_fused(gpt1_step):
    """Where the H100's profile of the bf16 step (2026-11-26) saw 48 bias adds, 49 weight casts, 50
    dropouts, 24 residual adds and layer norms in four launches each, 96 launches of column sums, a sort
    for each embedding's gradient and nine launches around the loss: each block's two sublayers end in a
    residual layer norm (a launch each way, its column sums finished in the same launch), GELU adds
    c_fc's bias and sums its gradient in its backward, attention adds c_attn's, whose gradient is one
    launch of column sums; the weights keep bfloat16 copies that Adam writes, the residual layer norm
    adds the two gradients of its output in its own backward, the embeddings' gradients take a launch
    each, and the mean loss two forward and one back. What is left of the glue: the embeddings' sum and
    the sum of the two gradients of the dropout after it, the position embedding's cupy_sum."""
    names = gpt1_step("bf16").by_name()
    assert (
        names["residual_layer_norm_forward_warps_bf16"]
        == names["residual_layer_norm_backward_warps_bf16"]
        == 24
    )
    assert names["gelu_forward_bf16"] == names["gelu_backward_bf16"] == names["column_sums_bf16"] == 12
    gone = ("cupy_copy__float32_bfloat16", "layer_norm_", "column_partials", "cub::", "cupy_searchsorted")
    assert not any(name.startswith(gone) for name in names)
    assert (
        names["cupy_add__bfloat16_bfloat16_bfloat16"] == 2
        and "cupy_add__bfloat16_float32_bfloat16" not in names
    )
    assert names["embedding_forward_f32_bf16"] == names["embedding_backward_bf16_f32"] == 2
    loss = ("cross_entropy_forward_bf16", "cross_entropy_reduce_f32", "cross_entropy_backward_bf16")
    assert [names[name] for name in loss] == [1, 1, 1]
    assert names["dropout_forward_bf16"] == names["cupy_sum"] == names["adam_step_f32"] == 1


# What the model of today's bf16 step (no clipping) counts beside what the H100's profiler saw before the
# glue was fused: (model, profiler) where they differ. Until a GPU profiles the step again, the two agree
# everywhere else, every kernel of the products, attention and Adam by name.
FUSED_SINCE_THE_PROFILE = {
    "total": (297, 653),
    "casts": (0, 49),
    "elementwise": (28, 131),
    "loss": (3, 2),
    "other": (0, 15),
    "reductions": (13, 100),
    "dropout": (2, 50),
    "layer norm": (48, 96),
    "copies": (3, 10),
    "column_partials_bf16": (0, 48),
    "dropout_forward_bf16": (1, 25),
    "column_sums_f32": (0, 48),
    "residual_layer_norm_backward_warps_bf16": (24, 0),
    "residual_layer_norm_forward_warps_bf16": (24, 0),
    "layer_norm_forward_warps_bf16": (0, 24),
    "layer_norm_column_partials_bf16": (0, 24),
    "layer_norm_column_sums_f32": (0, 24),
    "layer_norm_backward_warps_bf16": (0, 24),
    "dropout_backward_bf16": (1, 25),
    "column_sums_bf16": (12, 0),
    "cross_entropy_reduce_f32": (1, 0),
}


# the tensor cores' attention kernels, named without "mma" when the H100 profiled them
RENAMED = {
    f"attention_{k}_d64_bf16": f"attention_{k}_mma_d64_bf16"
    for k in ("forward", "backward_keys", "backward_queries")
}


def test_the_bf16_step_launches_what_the_profiler_saw_on_an_h100_but_the_fused_glue(gpt1_step):
    """Every kernel the H100's profiler saw in the bf16 step of bench/gpu/gpu_profile.py (no clipping),
    counted by name for the project's kernels and by category for all, against the model of the step
    as it is now: the same but for FUSED_SINCE_THE_PROFILE."""
    measured = json.loads((RESULTS / "gpu-profile-bf16-nvidia-h100-80gb-hbm3.json").read_text())
    seen = measured["precisions"]["bf16"]["tinygpt"]["launches_by_name"]
    names = [RENAMED.get(name, name) for name, count in seen.items() for _ in range(count)]
    agreement = gpu_costs.compare(gpt1_step("bf16", clip=False), names)
    rows = {"total": agreement["total"], **agreement["categories"], **agreement["kernels"]}
    assert {what: row for what, row in rows.items() if row[0] != row[1]} == FUSED_SINCE_THE_PROFILE


# ----- the counting itself


def test_a_known_sequence_of_operations_gives_its_launches_and_bytes():
    host = np.arange(32, dtype=np.float32).reshape(4, 8)
    x = ag.tensor(host, device=EMULATED)
    w = backend.to_device(np.ones((8, 3), np.float32), EMULATED)
    with gpu_costs.count_launches() as cost:
        y = emulator.xp.asarray(host)
        y = y * 2
        y += x.data
        y.sum(axis=0), y.sum()
        y.astype(ag.bfloat16), y.astype(np.float32, copy=False)
        y.T.reshape(32), y[1:].reshape(-1)  # a transpose cannot be flattened in place; rows can
        y[np.array([0, 2])]
        emulator.xp.zeros(5, np.float32), emulator.xp.ones(3, np.float32)
        F.gelu(x)
        products.matmul(y, w), products.matmul(y.astype(ag.bfloat16), w.astype(ag.bfloat16), np.float32)
        backend.to_host(y)
    assert cost.launches == [
        Launch("Memcpy HtoD", "copies", 0, 128),
        Launch("cupy_multiply__float32_float_float32", "elementwise", 128, 128),
        Launch("cupy_add__float32_float32_float32", "elementwise", 256, 128),
        Launch("cupy_sum", "reductions", 128, 32),
        Launch("cub::DeviceReduceSingleTileKernel", "reductions", 128, 4),
        Launch("cupy_copy__float32_bfloat16", "casts", 128, 64),
        Launch("cupy_copy__float32_float32", "copies", 128, 128),
        Launch("cupy_take", "copies", 64 + 16, 64),  # the rows and the index
        Launch("Memset", "copies", 0, 20),
        Launch("cupy_fill", "copies", 0, 12),
        Launch("gelu_forward_f32", "elementwise", 128, 128),
        Launch("cublas_gemm__float32_float32_float32", "matrix products"),
        Launch("cupy_copy__float32_bfloat16", "casts", 128, 64),
        Launch("cupy_copy__float32_bfloat16", "casts", 96, 48),
        Launch("cublas_gemm__bfloat16_bfloat16_float32", "matrix products"),  # gemmEx: one call, no cast
        Launch("Memcpy DtoH", "copies", 128, 0),
    ]
    assert (cost.total, cost.kernels) == (16, 13)  # less the two memcpys and the memset


def test_a_reduction_or_a_scatter_costs_the_same_however_it_is_written():
    """xp.sum(y) is y.sum(), as in CuPy; y[ids] = v writes the entries it names and reads v and ids."""
    xp, y = emulator.xp, backend.to_device(np.ones((4, 8), np.float32), EMULATED)
    for axis in (None, 0, -1):
        with gpu_costs.count_launches() as method:
            y.max(axis=axis), y.sum(axis=axis)
        with gpu_costs.count_launches() as function:
            xp.max(y, axis=axis), xp.sum(y, axis)
        assert method.launches == function.launches
    with gpu_costs.count_launches() as cost:
        y[np.array([0, 3])] = 0.0
        y[np.array([1])] = xp.full(8, 2.0, np.float32)
    assert cost.launches == [
        Launch("cupy_scatter_update", "copies", 16, 64),
        Launch("cupy_fill", "copies", 0, 32),
        Launch("cupy_scatter_update", "copies", 32 + 8, 32),
    ]


def test_the_count_goes_on_after_an_operation_fails_and_ends_with_its_block():
    """An error inside the block (an operation's own, or the block's) stops nothing but that
    operation: the next one is counted, and the counter is gone once the block is left."""
    y = backend.to_device(np.ones(4, np.float32), EMULATED)
    with pytest.raises(ValueError), gpu_costs.count_launches() as cost:
        with pytest.raises(ValueError):
            y.reshape(3)
        emulator.xp.zeros(4, np.float32)
        raise ValueError("the block's own error")
    assert [launch.name for launch in cost.launches] == ["Memset"]
    assert emulator.counter is None


def test_kernels_that_reach_tensors_through_tables_count_the_tensors():
    """Adam's kernel reads p, its gradient, m and v and writes p, m and v: 16 and 12 bytes a number,
    and 2 more written for a number of a parameter that keeps a bfloat16 copy (here the first)."""
    params = [ag.tensor(np.ones(shape), requires_grad=True, device=EMULATED) for shape in ((3, 4), (5,))]
    for p in params:
        p.grad = p.data * 0.5
    ag.precision.kept_cast(params[0], ag.bfloat16)
    with gpu_costs.count_launches() as cost:
        Adam(params, lr=1e-3).step()
    assert [launch for launch in cost.launches if launch.name == "adam_step_f32"] == [
        Launch("adam_step_f32", "optimizer", 16 * 17, 12 * 17 + 2 * 12)
    ]


def test_with_run_false_the_kernels_and_products_are_checked_but_not_run():
    x = ag.tensor(np.ones((4, 8)), device=EMULATED)
    with gpu_costs.count_launches(run=False) as cost:
        y = F.gelu(x)
        z = products.matmul(x.data, x.data.T)
    assert [launch.name for launch in cost.launches] == [
        "gelu_forward_f32",
        "cublas_gemm__float32_float32_float32",
    ]
    assert not np.isclose(y.numpy(), F.gelu(x).numpy()).any()  # what the kernel would have written
    assert z.shape == (4, 4) and not (backend.to_host(z) == 8).all()
    kernel = emulator_kernels.kernel("gelu", "gelu_forward", np.float32)
    with gpu_costs.count_launches(run=False), pytest.raises(emulator_kernels.EmulatorError, match="int32"):
        kernel((1,), (32,), (x.data, y.data, np.int32(32)))  # n is a long long


def tiny_step():
    """The loss, the weights and their gradients after one training step of a small GPT on the emulated
    device, as host arrays."""
    ag.manual_seed(0)
    model = GPT(GPTConfig.tiny(n_layer=1, vocab_size=64, n_ctx=16)).to(EMULATED).train()
    optimizer = Adam(model.parameters(), lr=1e-3, l2=0.01)
    ids = np.random.default_rng(0).integers(0, 64, (2, 17))
    with ag.random.use_masks(ag.random.MaskStream(0)):
        loss = F.cross_entropy(model(ids[:, :-1]), ids[:, 1:])
        loss.backward()
        clip_grad_norm(model.parameters(), 1.0)
        optimizer.step()
    params = model.parameters()
    return [loss.numpy(), *(p.numpy() for p in params), *(backend.to_host(p.grad) for p in params)]


def test_counting_changes_no_number_and_counts_inside_its_block_alone():
    plain = tiny_step()
    with gpu_costs.count_launches() as cost:
        counted = tiny_step()
    assert cost.by_name()["adam_step_f32"] == 1 and emulator.counter is None
    for a, b in zip(plain, counted, strict=True):
        np.testing.assert_array_equal(a, b)
    with gpu_costs.count_launches() as outer:
        with gpu_costs.count_launches() as inner:
            emulator.xp.zeros(3)
        emulator.xp.zeros(4)
    assert [launch.written for launch in inner.launches] == [24]
    assert [launch.written for launch in outer.launches] == [32]


# as CUDA's profiler (torch.profiler, bench/gpu_check.py) names the kernels of a step
PROFILER_NAMES = {
    "attention_forward_mma_d64_bf16": "attention",
    "attention_backward_queries_d64_f32": "attention",
    "layer_norm_backward_warps_f32": "layer norm",
    "layer_norm_column_sums_f32": "layer norm",
    "gelu_forward_bf16": "elementwise",
    "dropout_backward_bf16": "dropout",
    "cross_entropy_forward_bf16": "loss",
    "embedding_backward_bf16_f32": "embedding",
    "adam_step_f32": "optimizer",
    "clip_factor_f32": "optimizer",
    "cupy_sum": "reductions",
    "cupy_sum_with_dtype": "reductions",
    "cupy_copy__bfloat16_float32": "casts",
    "cupy_copy__float32_bfloat16": "casts",
    "cupy_copy__int64_int64": "copies",
    "cupy_add__bfloat16_float32_bfloat16": "elementwise",
    "cupy_add__bfloat16_bfloat16_bfloat16": "elementwise",
    "cupy_maximum__float32_float_float32": "elementwise",
    "cupy_take": "copies",
    "cupy_searchsorted_kernel": "other",
    "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel"
    "__5x_cublas": "matrix products",
    "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(cutlass_80_"
    "tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8::Params)": "matrix products",
    "nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_TNT": "matrix products",
    "fmha_cutlassB_f32_aligned_64x64_k64_dropout_sm80(PyTorchMemEffAttention::AttentionBackwardKernel<"
    "cutlass::arch::Sm80, float, true, true, false, 64, 64, 64, false>::Params)": "attention",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0": (
        "attention"
    ),
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float, float "
    "const*, float const*, float const*, float*, float*, float*)": "layer norm",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
    "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)": "loss",
    "void at::native::(anonymous namespace)::fused_dropout_kernel_vec<c10::BFloat16, float, unsigned int, 1, "
    "4, bool>(at::cuda::detail::TensorInfo<c10::BFloat16 const, unsigned int>)": "dropout",
    "void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, "
    "true>(at::cuda::detail::TensorInfo<float, unsigned int>)": "embedding",
    "void at::native::multi_tensor_apply_kernel<at::native::TensorListMetadata<4>, "
    "at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4>>": "optimizer",
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda("
    "at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda(float)#1}>": "casts",
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
    "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)": "copies",
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl("
    "at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const>": "elementwise",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
    "at::native::sum_functor<float, float, float>::operator()>, unsigned int, float, 4> >": "reductions",
    "void splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>(cublasSplitKParams"
    "<float>, float const*, float const*, float*, float const*, float const*, float const*, float const*, "
    "float*, void*, long, float*, int*)": "matrix products",
    "void cub::CUB_200800_900_NS::DeviceReduceSingleTileKernel<cub::CUB_200800_900_NS::DeviceReducePolicy"
    "<float, float, int, cuda::std::plus<float> >::Policy600, float*, float*, int>(float*, float*, int)": (
        "reductions"
    ),
    "void cub::CUB_200800_900_NS::DeviceRadixSortOnesweepKernel<cub::CUB_200800_900_NS::DeviceRadixSortPolicy"
    "<long, long, unsigned int>::Policy800, false, long, long, unsigned int, int>(...)": "other",
    "Memcpy HtoD (Pageable -> Device)": "copies",
    "Memset (Device)": "copies",
}


@pytest.mark.parametrize("name", PROFILER_NAMES)
def test_a_kernel_name_as_the_profiler_shows_it_has_its_category(name):
    assert gpu_costs.category(name) == PROFILER_NAMES[name]


def test_compare_sets_the_model_beside_the_profiler_per_category_and_kernel():
    model = gpu_costs.Count()
    names = ["attention_forward_d64_f32", "cupy_sum", "cublas_gemm__float32_float32_float32", "Memcpy HtoD"]
    model.launches = [Launch(name, gpu_costs.category(name)) for name in names]
    profiler = [
        "attention_forward_d64_f32",
        "cupy_sum",
        "sm90_xmma_gemm_f32f32",
        "void splitKreduce_kernel<>",
    ]
    profiler += ["layer_norm_forward_warps_f32", "Memcpy HtoD (Pageable -> Device)", "Memset (Device)"]
    compared = gpu_costs.compare(model, profiler)
    assert compared["total"] == (3, 5)
    assert compared["categories"] == {
        "attention": (1, 1),
        "reductions": (1, 1),
        "matrix products": (1, 2),
        "layer norm": (0, 1),
    }
    assert compared["kernels"] == {
        "attention_forward_d64_f32": (1, 1),
        "layer_norm_forward_warps_f32": (0, 1),
    }
    assert sorted(compared["differences"]) == [
        "layer norm: model 0, profiler 1",
        "layer_norm_forward_warps_f32: model 0, profiler 1",
        "matrix products: model 1, profiler 2",
        "total: model 3, profiler 5",
    ]
