"""The emulated CUDA device (autograd/emulator/kernels.py, autograd/emulator/): CUDA's semantics
on the CPU, shown with tiny kernels of the tests' own; the project's real kernels, run through their
launchers on it, giving their references' numbers (and masks, bit for bit) in every order of the
threads; and mutation tests: a copy of a source with one of the bugs the emulator exists to catch
fails its kernel's check, where the unmutated copy passes."""

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import autograd as ag
from autograd import backend, emulator
from autograd import functional as F
from autograd.emulator import kernels as emulator_kernels
from autograd.emulator.kernels import EmulatorError
from autograd.kernels import attention as attention_kernels
from autograd.kernels import compiling, sources
from autograd.kernels import linear as linear_kernels
from autograd.testing import assert_fast_path_matches
from tests import fake_cuda
from tests.helpers import (
    FENCED,
    INTERNALS,
    TOLERANCE,
    assert_adam_close,
    assert_fast_equals_reference,
    assert_paths_agree,
    column_sums_in_their_order,
    fresh_stream,
    layer_norm_dtypes,
    on_device,
    summation_slack,
    train_with_adam,
)

if not os.environ.get("CI"):  # CI installs NVRTC and g++: there a missing one must fail, not skip
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="pip install -e '.[nvrtc]'")
    if shutil.which("g++") is None:
        pytest.skip("needs g++ to build the kernels for the CPU", allow_module_level=True)

ALL_ORDERS = tuple(
    emulator_kernels.ORDERS
)  # as written, reversed, shuffled; a warp at a time as written, reversed

# ----- tiny kernels of the tests' own

SOURCE = r"""
// Every thread writes its entry of a tile; after the barrier each reads another thread's entry.
// Blocks and grids of three dimensions: each block takes n = its threads' count of x.
extern "C" __global__ void rotate(const float* x, float* y, int shift) {
    __shared__ float tile[1024];
    int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    int n = blockDim.x * blockDim.y * blockDim.z;
    long long base = (blockIdx.x + gridDim.x * (blockIdx.y + 1ll * gridDim.y * blockIdx.z)) * n;
    tile[t] = 2.0f * x[base + t];
    __syncthreads();
    y[base + t] = tile[(t + shift) % n];
}

// Each thread reads its right neighbour's entry and overwrites its own: without a barrier between
// the two, a thread may read an entry already overwritten (a race that no NaN shows).
#define SHIFT_LEFT(name, BETWEEN)                           \
    extern "C" __global__ void name(float* x) {             \
        __shared__ float tile[1024];                        \
        int t = threadIdx.x;                                \
        tile[t] = x[t];                                     \
        __syncthreads();                                    \
        float right = tile[(t + 1) % blockDim.x];           \
        BETWEEN;                                            \
        tile[t] = 2.0f * right;                             \
        __syncthreads();                                    \
        x[t] = tile[t];                                     \
    }
SHIFT_LEFT(shift_left, __syncthreads())
SHIFT_LEFT(shift_left_racing, (void)0)

// The block's sum of v in every thread: each warp's sum goes to shared memory and, after the barrier, every
// thread adds up the warps' sums. Called twice in a row, the second call's writes must wait until every
// warp has read the first call's: the barrier AFTER the read.
#define TWO_SUMS(name, AFTER)                                                                          \
    __device__ float name##_block_sum(float v) {                                                       \
        __shared__ float sums[32];                                                                     \
        for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);   \
        if (threadIdx.x % 32 == 0) sums[threadIdx.x / 32] = v;                                         \
        __syncthreads();                                                                               \
        float total = 0.0f;                                                                            \
        for (int w = 0; w < blockDim.x / 32; ++w) total += sums[w];                                    \
        AFTER;                                                                                         \
        return total;                                                                                  \
    }                                                                                                  \
    extern "C" __global__ void name(const float* x, float* out) {                                      \
        float v = x[threadIdx.x];                                                                      \
        out[threadIdx.x] = name##_block_sum(v);                                                        \
        out[blockDim.x + threadIdx.x] = name##_block_sum(v * v);                                       \
    }
TWO_SUMS(two_sums, __syncthreads())
TWO_SUMS(two_sums_racing, (void)0)

// Each shuffle of x at each width (1, 2, 4, ..., 32) and each offset (a lane, a delta or an xor mask) from
// -32 to 63: out[width][offset][kind][i], the kinds as SHUFFLE_KINDS has them.
extern "C" __global__ void shuffles(const float* x, float* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x, n = gridDim.x * blockDim.x;
    float v = x[i];
    float* at = out + i;
    for (int width = 1; width <= 32; width *= 2) {
        for (int offset = -32; offset < 64; ++offset, at += 4 * n) {
            at[0] = __shfl_sync(0xFFFFFFFFu, v, offset, width);
            at[n] = __shfl_up_sync(0xFFFFFFFFu, v, offset, width);
            at[2 * n] = __shfl_down_sync(0xFFFFFFFFu, v, offset, width);
            at[3 * n] = __shfl_xor_sync(0xFFFFFFFFu, v, offset, width);
        }
    }
}

extern "C" __global__ void xor_at_width(float* x, int width) {
    x[threadIdx.x] = __shfl_xor_sync(0xFFFFFFFFu, x[threadIdx.x], 1, width);
}

// Lanes below `early` leave before the warp's shuffle.
extern "C" __global__ void early_exit(float* x, int early) {
    if (threadIdx.x < early) return;
    x[threadIdx.x] = __shfl_xor_sync(0xFFFFFFFFu, x[threadIdx.x], 1);
}

// The odd lanes take one shuffle more than the even ones.
extern "C" __global__ void diverging(float* x) {
    float v = x[threadIdx.x];
    if (threadIdx.x % 2) v = __shfl_down_sync(0xFFFFFFFFu, v, 1);
    x[threadIdx.x] = __shfl_xor_sync(0xFFFFFFFFu, v, 1);
}

// Lane 3 waits at a barrier while the rest of its warp shuffles.
extern "C" __global__ void barrier_in_a_shuffle(float* x) {
    if (threadIdx.x == 3) __syncthreads();
    else x[threadIdx.x] = __shfl_xor_sync(0xFFFFFFFFu, x[threadIdx.x], 1);
}

// Every lane shuffles with a mask of lanes 0 to 15.
extern "C" __global__ void outside_the_mask(float* x) {
    x[threadIdx.x] = __shfl_xor_sync(0x0000FFFFu, x[threadIdx.x], 1);
}

// Threads below `early` leave before the barrier that the others wait at.
extern "C" __global__ void barrier_skipped(float* x, int early) {
    __shared__ float tile[1024];
    if (threadIdx.x < early) return;
    tile[threadIdx.x] = x[threadIdx.x];
    __syncthreads();
    x[threadIdx.x] = tile[threadIdx.x];
}

extern "C" __global__ void copy_shifted(const float* x, float* y, long long read_shift, long long write_shift,
                                        long long n) {
    long long i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i + write_shift] = x[i + read_shift];
}

// Thread 0 writes through one view; after the barrier every thread reads through another.
extern "C" __global__ void through_views(float* a, const float* b, float* out) {
    if (threadIdx.x == 0) a[5] = 42.0f;
    __syncthreads();
    out[threadIdx.x] = b[threadIdx.x];
}

extern "C" __global__ void scale(float* x, float factor, int n) {
    if (threadIdx.x < n) x[threadIdx.x] *= factor;
}

extern "C" __global__ void divide(int* x, int by) { x[threadIdx.x] /= by; }

__device__ float deep(int n) {
    volatile float frame[256];
    frame[0] = n;
    return n == 0 ? frame[0] : deep(n - 1) + frame[0];
}
extern "C" __global__ void recurse(float* x, int depth) { x[threadIdx.x] = deep(depth); }

extern "C" __global__ void __launch_bounds__(64) bounded(float* x) { x[threadIdx.x] = 1.0f; }

extern "C" __global__ void too_much_shared(float* x) {
    __shared__ float big[13000];  // 52,000 bytes
    big[threadIdx.x] = x[threadIdx.x];
    __syncthreads();
    x[threadIdx.x] = big[(threadIdx.x + 1) % blockDim.x];
}

// Every thread adds 1 to a counter and takes the larger of its index and a running maximum; old
// values come back: atomics, in the order the scheduler runs the threads.
extern "C" __global__ void atomics(int* counter, int* before, int* largest) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    before[t] = atomicAdd(counter, 1);
    atomicMax(largest, t);
}
extern "C" __global__ void arrivals(int* counter, int* blocks) {  // the blocks in the order they ran
    if (threadIdx.x == 0) blocks[atomicAdd(counter, 1)] = blockIdx.x + gridDim.x * blockIdx.y;
}
"""


# What shared memory holds before a thread of the block writes it, in a template's static array and a
# plain function's; then the block writes it, for the next block to find NaN again. A source of its own,
# so that its library's first launch is the test's.
SHARED_SOURCE = r"""
template <int N>
__device__ unsigned int seen_in_template() {
    __shared__ float tile[N];
    unsigned int seen = __float_as_uint(tile[threadIdx.x]);
    __syncthreads();
    tile[threadIdx.x] = 1.0f;
    return seen;
}
__device__ unsigned int seen_in_function() {
    __shared__ unsigned int words[64];
    unsigned int seen = words[threadIdx.x];
    __syncthreads();
    words[threadIdx.x] = 7u;
    return seen;
}
extern "C" __global__ void shared_at_start(unsigned int* seen) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    seen[2 * i] = seen_in_template<64>();
    seen[2 * i + 1] = seen_in_function();
}

"""


@pytest.fixture(scope="module")
def tiny():
    """The tests' own kernels, built for the emulated device."""
    return emulator_kernels.build(SOURCE, "emulator_test")


def floats(n, seed=0):
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


@pytest.mark.parametrize("block, grid", [((64,), (3,)), ((8, 4, 2), (2, 3, 2)), ((1024,), (1,))])
def test_a_barrier_waits_for_every_thread_of_the_block(tiny, block, grid):
    """Each thread reads, after __syncthreads(), an entry another thread wrote: in every order."""
    n = int(np.prod(block))
    x = floats(n * int(np.prod(grid)))
    y = np.zeros_like(x)
    with emulator_kernels.thread_orders(*ALL_ORDERS):
        tiny.kernel("rotate")(grid, block, (x, y, np.int32(5)))
    expected = np.roll(2 * x.reshape(-1, n), -5, axis=1).reshape(-1)
    np.testing.assert_array_equal(y, expected)


def test_a_race_between_barriers_shows_as_a_difference_between_orders(tiny):
    """A read and an overwrite of the same shared entry with no barrier between: each single order
    gives numbers (no NaN), different ones; thread_orders names the kernel. With the barrier, none."""
    x = floats(96)
    results = {}
    for order in ALL_ORDERS:
        results[order] = x.copy()
        with emulator_kernels.thread_orders(order):
            tiny.kernel("shift_left_racing")((1,), (96,), (results[order],))
    assert not np.isnan(results["written"]).any()
    assert not np.array_equal(results["written"], results["reversed"])
    with pytest.raises(EmulatorError, match=r"shift_left_racing: .*orders .* argument 0: a race"):
        with emulator_kernels.thread_orders(*ALL_ORDERS):
            tiny.kernel("shift_left_racing")((1,), (96,), (x.copy(),))
    fixed = x.copy()
    with emulator_kernels.thread_orders(*ALL_ORDERS):
        tiny.kernel("shift_left")((1,), (96,), (fixed,))
    np.testing.assert_array_equal(fixed, 2 * np.roll(x, -1))


def test_a_missing_barrier_after_a_shared_read_shows_when_warps_run_one_at_a_time(tiny):
    """two_sums_racing: where warps go through their shuffles in step, every warp reads the first sum's
    entries before any writes the second's, and the numbers are right; run one at a time, a warp writes
    its entry of the second sum before the warps after it (before it, in reversed order) have read the
    first's: other numbers, and thread_orders names the race."""
    x = floats(128)
    expected = np.repeat([x.sum(), (x * x).sum()], 128)
    in_step = ("written", "reversed", "shuffled")
    for kernel, orders in (("two_sums", ALL_ORDERS), ("two_sums_racing", in_step)):
        out = np.zeros(256, np.float32)
        with emulator_kernels.thread_orders(*orders):
            tiny.kernel(kernel)((1,), (128,), (x, out))
        np.testing.assert_allclose(out, expected, rtol=1e-5)
    for order in ("warps", "reversed warps"):
        out = np.zeros(256, np.float32)
        with emulator_kernels.thread_orders(order):
            tiny.kernel("two_sums_racing")((1,), (128,), (x, out))
        assert not np.allclose(out, expected, rtol=1e-5)
    race = r"^two_sums_racing: the threads in the orders 'written' and 'warps' .* argument 1: a race"
    with pytest.raises(EmulatorError, match=race):
        with emulator_kernels.thread_orders(*ALL_ORDERS):
            tiny.kernel("two_sums_racing")((1,), (128,), (x, np.zeros(256, np.float32)))


SHUFFLE_KINDS = ("idx", "up", "down", "bfly")  # PTX's modes of __shfl, _up, _down, _xor_sync


def ptx_shuffle(x, kind, b, width):
    """What the 32 lanes of a warp holding x receive from PTX's shfl.sync.<kind> with operand b, as the
    PTX ISA's pseudocode has it, given the c operand that CUDA's __shfl*_sync pass for a width:
    ((32 - width) << 8) | clamp, the clamp 0 for up and 31 for the others."""
    lane = np.arange(32)
    c = ((32 - width) << 8) | (0 if kind == "up" else 31)
    bval, cval, segmask = b & 31, c & 31, (c >> 8) & 31
    max_lane = (lane & segmask) | (cval & ~segmask)
    min_lane = lane & segmask
    j = {"idx": min_lane | (bval & ~segmask), "up": lane - bval, "down": lane + bval, "bfly": lane ^ bval}
    j = j[kind]
    pval = j >= max_lane if kind == "up" else j <= max_lane
    return x[np.where(pval, j, lane)]


def test_shuffles_give_ptxs_values_at_every_width_and_offset(tiny):
    """Every lane of 4 warps, every shuffle, every width and every offset from -32 to 63 (its low 5 bits
    count), against PTX's semantics. A width below 32 splits the warp into segments; a source lane past
    the caller's segment gives the caller its own value, but xor reads a lane of an earlier segment."""
    x = floats(128)
    out = np.zeros((6, 96, 4, 128), np.float32)  # width, offset, kind, thread: as the kernel writes them
    tiny.kernel("shuffles")((2,), (64,), (x, out))
    warps = x.reshape(4, 32)
    for w, width in enumerate(2 ** np.arange(6)):
        for o, offset in enumerate(range(-32, 64)):
            for k, kind in enumerate(SHUFFLE_KINDS):
                expected = np.concatenate([ptx_shuffle(warp, kind, offset, width) for warp in warps])
                np.testing.assert_array_equal(out[w, o, k], expected, err_msg=f"{kind} {offset} {width}")
    xor_8_at_width_8 = out[3, 32 + 8, 3]
    assert xor_8_at_width_8[9] == x[1] and xor_8_at_width_8[1] == x[1]  # lane 9 reads lane 1; 1 keeps its own


@pytest.mark.parametrize("width", [12, 64, 0])
def test_a_shuffle_width_other_than_a_power_of_2_up_to_32_is_an_error(tiny, width):
    with pytest.raises(EmulatorError, match=rf"^xor_at_width: .*: __shfl_xor_sync with width {width}: the"):
        tiny.kernel("xor_at_width")((1,), (32,), (floats(32), np.int32(width)))


@pytest.mark.parametrize("order", ALL_ORDERS)
def test_atomics_update_one_at_a_time(tiny, order):
    """128 threads each add 1: the counter ends at 128 and each thread got a different value before
    it, 0 to 127, in the order the threads ran; the maximum ends at the largest index."""
    counter, before, largest = np.zeros(1, np.int32), np.full(128, -1, np.int32), np.zeros(1, np.int32)
    with emulator_kernels.thread_orders(order):
        tiny.kernel("atomics")((2,), (64,), (counter, before, largest))
    assert counter[0] == 128 and largest[0] == 127
    np.testing.assert_array_equal(np.sort(before), np.arange(128))
    assert (before == np.arange(128)).all() == (order in ("written", "warps"))


def test_the_blocks_run_in_the_grids_order_reversed_or_shuffled(tiny):
    """A GPU runs a launch's blocks in any order: the emulator's orders run them as the grid lists them
    (x fastest), reversed, or shuffled, so that blocks that count on each other's order show."""
    ran = {}
    for order in ALL_ORDERS:
        counter, blocks = np.zeros(1, np.int32), np.full(12, -1, np.int32)
        with emulator_kernels.thread_orders(order, seed=5):
            tiny.kernel("arrivals")((4, 3), (64,), (counter, blocks))
        ran[order] = list(blocks)
    assert ran["written"] == ran["warps"] == list(range(12))
    assert ran["reversed"] == ran["reversed warps"] == list(range(11, -1, -1))
    assert sorted(ran["shuffled"]) == list(range(12))
    assert ran["shuffled"] not in (ran["written"], ran["reversed"])


MISSING = {  # kernel: its arguments after x, and what the error says
    "early_exit": (
        (np.int32(4),),
        r"lane 4 waits at __shfl_xor_sync \(mask 0xffffffff\) for lane 0, which has ended",
    ),
    "diverging": ((), r"the warp diverges: lane 0 waits at its shuffle #1 \(__shfl_xor.*#1 \(__shfl_down"),
    "barrier_in_a_shuffle": ((), r"for lane 3, which waits at __syncthreads\(\)"),
    "outside_the_mask": ((), r"16, 0, 0\): lane 16 calls __shfl_xor_sync with mask 0x0000ffff"),
    "barrier_skipped": ((np.int32(40),), r"waits at __syncthreads\(\) while thread \(0, 0, 0\) has ended"),
}


@pytest.mark.parametrize("kernel", MISSING)
def test_a_thread_missing_from_a_barrier_or_a_shuffle_is_an_error(tiny, kernel):
    args, message = MISSING[kernel]
    with pytest.raises(EmulatorError, match=rf"^{kernel}: block \(0, 0, 0\) thread \(.*{message}"):
        tiny.kernel(kernel)((1,), (64,), (floats(64), *args))


def test_shared_memory_starts_as_nan_in_every_block():
    """Every 32-bit word 0x7FC00000 before the block writes it, in each of three blocks, though the
    block before wrote it; also in a static array of a function template."""
    seen = np.zeros(2 * 3 * 64, np.uint32)
    emulator_kernels.build(SHARED_SOURCE, "emulator_test_shared").kernel("shared_at_start")(
        (3,), (64,), (seen,)
    )
    assert (seen == 0x7FC00000).all()


N = 1000  # floats: 4000 bytes, so 96 bytes of NaN lie between the guard page and the array


@pytest.mark.parametrize(
    "read_shift, write_shift, message",
    [
        (1, 0, r"block \(3, 0, 0\) thread \(231, 0, 0\): reads element 1000 of argument 0, past its end"),
        (0, 1, r"block \(3, 0, 0\) thread \(231, 0, 0\): writes element 1000 of argument 1, past its end"),
        (-25, 0, r"block \(0, 0, 0\) thread \(0, 0, 0\): reads element -25 of argument 0, before its start"),
        (0, -1, r"a thread writes element -1 of argument 1, before its start"),
    ],
)
def test_a_read_or_a_write_outside_an_array_is_caught_and_named(tiny, read_shift, write_shift, message):
    x, y = floats(N), np.zeros(N, np.float32)
    args = (x, y, np.int64(read_shift), np.int64(write_shift), np.int64(N))
    with pytest.raises(EmulatorError, match=rf"^copy_shifted: {message}"):
        tiny.kernel("copy_shifted")((4,), (256,), args)
    assert (y == 0).all()  # a failed launch writes nothing back


@pytest.mark.parametrize("host", ["ndarray", "memmap"])
def test_in_an_op_of_the_device_a_host_array_is_refused_as_cupy_refuses_it(tiny, tmp_path, host):
    """A GPU's kernel takes the device's arrays: a host NumPy array (of any subclass) passed in an op of
    the device is refused and left as it was; the device's own arrays are taken."""
    x, y = floats(N), np.zeros(N, np.float32)
    if host == "memmap":
        y = np.memmap(tmp_path / "y.bin", np.float32, "w+", shape=(N,))
    args = (emulator.on_device(x), y, np.int64(0), np.int64(0), np.int64(N))
    with emulator.Device(), pytest.raises(EmulatorError, match=r"^copy_shifted: argument 1: a host NumPy"):
        tiny.kernel("copy_shifted")((4,), (256,), args)
    assert (y == 0).all()
    with emulator.Device():
        tiny.kernel("copy_shifted")((4,), (256,), replaced(args, 1, emulator.on_device(np.asarray(y))))
    np.testing.assert_array_equal(y, x)


def test_a_write_into_a_read_only_array_is_named_and_a_read_of_one_is_not(tiny):
    x, y = floats(N), np.zeros(N, np.float32)
    y.flags.writeable = False
    with pytest.raises(
        EmulatorError, match=r"^copy_shifted: a thread writes element 0 of argument 1, a read-only"
    ):
        tiny.kernel("copy_shifted")((4,), (256,), (x, y, np.int64(0), np.int64(0), np.int64(N)))
    out = np.zeros(N, np.float32)
    tiny.kernel("copy_shifted")(
        (4,), (256,), (np.broadcast_to(x, (2, N))[0], out, np.int64(0), np.int64(0), np.int64(N))
    )
    np.testing.assert_array_equal(out, x)


def test_a_read_just_before_an_array_reads_nan_and_a_null_pointer_is_named(tiny):
    x, y = floats(N), np.zeros(N, np.float32)
    tiny.kernel("copy_shifted")((4,), (256,), (x, y, np.int64(-1), np.int64(0), np.int64(N)))
    assert np.isnan(y[0]) and (y[1:] == x[:-1]).all()
    with pytest.raises(EmulatorError, match=r"reads address 0x[0-9a-f]+: through a null pointer"):
        tiny.kernel("copy_shifted")((4,), (256,), (np.uintp(0), y, np.int64(0), np.int64(0), np.int64(N)))


def test_views_of_one_array_stay_views_of_one_copy(tiny):
    """a and b overlap: what thread 0 writes through a, the others read through b (and it is written
    back); a strided view's pointer is its first element."""
    memory = np.zeros(16, np.float32)
    out = np.zeros(8, np.float32)
    tiny.kernel("through_views")((1,), (8,), (memory[:8], memory[3:11], out))
    assert out[2] == 42 and memory[5] == 42
    strided = np.arange(24, dtype=np.float32)[2::3]  # 2, 5, ..., 23
    tiny.kernel("copy_shifted")((1,), (32,), (strided, out, np.int64(0), np.int64(0), np.int64(8)))
    np.testing.assert_array_equal(out, np.arange(2, 10))  # x[i]: the i-th float from its first element


def test_an_integer_division_by_zero_is_named(tiny):
    with pytest.raises(EmulatorError, match=r"^divide: block \(0, 0, 0\) thread \(0, 0, 0\): an arithmetic"):
        tiny.kernel("divide")((1,), (32,), (np.arange(32, dtype=np.int32), np.int32(0)))


def test_a_stack_overflow_is_named_and_the_next_launch_runs(tiny):
    x = floats(32)
    with pytest.raises(EmulatorError, match=r"^recurse: block \(0, 0, 0\) thread \(0, 0, 0\): its stack"):
        tiny.kernel("recurse")((1,), (32,), (x, np.int32(100_000)))
    tiny.kernel("recurse")((1,), (32,), (x, np.int32(10)))
    assert (x == 55).all()


@pytest.mark.parametrize(
    "kernel, grid, block, shared_mem, message",
    [
        ("bounded", (1,), (65,), 0, "65 threads per block, over 64"),
        ("scale", (1,), (1025,), 0, "1025 threads per block, over 1024"),
        ("scale", (1,), (1, 1, 65), 0, r"block \(1, 1, 65\) over CUDA's \(1024, 1024, 64\)"),
        ("scale", (1, 65536), (32,), 0, r"grid \(1, 65536, 1\) over CUDA's \(2147483647, 65535, 65535\)"),
        ("scale", (2**31,), (32,), 0, r"grid \(2147483648, 1, 1\) over"),
        ("scale", (0,), (32,), 0, r"grid \(0, 1, 1\)"),
        ("scale", (1,), (32,), 16, "shared_mem=16: no kernel here declares dynamic shared memory"),
        ("too_much_shared", (1,), (32,), 0, "52000 bytes of static shared memory, over 49152"),
    ],
)
def test_a_launch_over_a_gpus_limits_is_refused(tiny, kernel, grid, block, shared_mem, message):
    args = (floats(2048),) + ((np.float32(2), np.int32(32)) if kernel == "scale" else ())
    with pytest.raises(EmulatorError, match=f"^{kernel}: .*{message}"):
        tiny.kernel(kernel)(grid, block, args, shared_mem=shared_mem)
    if kernel == "bounded":
        tiny.kernel(kernel)(grid, (64,), args)


def replaced(args, i, value):
    return args[:i] + (value,) + args[i + 1 :]


# copy_shifted(const float* x, float* y, long long read_shift, long long write_shift, long long n)
WRONG_ARGUMENTS = {
    "an argument left out": (lambda a: a[:-1], "4 arguments for 5 parameters"),
    "np.int32 for a long long": (
        lambda a: replaced(a, 4, np.int32(N)),
        r"argument 4: int32 \(4 bytes\) for long long \(8",
    ),
    "np.int64 for a pointer": (
        lambda a: replaced(a, 0, np.int64(a[0].ctypes.data)),
        "argument 0: .* for the pointer float",
    ),
    "an array for a value": (
        lambda a: replaced(a, 2, np.zeros(1, np.int64)),
        "argument 2: an array for the value long long",
    ),
    "a Python int": (
        lambda a: replaced(a, 4, N),
        "argument 4: int 1000: only arrays and NumPy scalars have a fixed width",
    ),
    "a float64 array for a float*": (
        lambda a: replaced(a, 1, np.zeros(N)),
        r"argument 1: a float64 array for a float\*",
    ),
    "a bfloat16 array for a float*": (
        lambda a: replaced(a, 0, a[0].astype(ag.bfloat16)),
        "argument 0: a bfloat16 array for a float",
    ),
    "np.float64 for a long long": (
        lambda a: replaced(a, 2, np.float64(0)),
        "argument 2: float64 for long long: an integer and a floating",
    ),
}


@pytest.mark.parametrize("mistake", WRONG_ARGUMENTS)
def test_an_argument_that_does_not_fit_its_parameter_is_refused(tiny, mistake):
    alter, message = WRONG_ARGUMENTS[mistake]
    args = (floats(N), np.zeros(N, np.float32), np.int64(0), np.int64(0), np.int64(N))
    tiny.kernel("copy_shifted")((4,), (256,), args)
    with pytest.raises(EmulatorError, match=f"^copy_shifted: {message}"):
        tiny.kernel("copy_shifted")((4,), (256,), alter(args))


def test_an_integer_for_a_float_is_refused(tiny):
    with pytest.raises(EmulatorError, match="^scale: argument 1: int32 for float: an integer and a floating"):
        tiny.kernel("scale")((1,), (32,), (floats(32), np.int32(2), np.int32(32)))


def test_kernels_are_named_as_gpu_kernel_names_them():
    k = emulator_kernels.kernel("gelu", "gelu_forward", ag.bfloat16)
    # x, bias, out, rows, width, rows_per_chunk; bf16: unsigned short
    assert k.name == "gelu_forward_bf16" and k.params == ["pu2", "pf4", "pu2", "vi8", "vi8", "vi4"]
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        emulator_kernels.kernel("gelu", "gelu_forward", np.float64)
    with pytest.raises(EmulatorError, match="gelu.cu has no kernel nothing_f32"):
        emulator_kernels.kernel("gelu", "nothing", np.float32)


def test_a_build_is_kept_on_disk_and_an_unwritable_cache_only_means_building_again(monkeypatch, tmp_path):
    text = 'extern "C" __global__ void nothing(float* x) {}  // ' + str(tmp_path)
    monkeypatch.setattr(emulator_kernels, "CACHE", tmp_path / "cache")
    first = emulator_kernels._build.__wrapped__(text, "kept", False)
    assert first.path.parent == tmp_path / "cache" and first.path.is_file()
    source = first.path.with_suffix(".cu")
    written = source.stat().st_mtime_ns
    first.path.unlink()  # as a second process finds it while the first builds: it builds too
    again = emulator_kernels._build.__wrapped__(text, "kept", False)
    assert source.stat().st_mtime_ns == written <= again.path.stat().st_mtime_ns  # gdb: source not newer
    monkeypatch.setattr(
        emulator_kernels.subprocess, "Popen", None
    )  # a second build would fail: it loads the file
    assert emulator_kernels._build.__wrapped__(text, "kept", False).path == first.path
    monkeypatch.undo()
    (tmp_path / "a file").write_text("")
    monkeypatch.setattr(emulator_kernels, "CACHE", tmp_path / "a file" / "cache")
    elsewhere = emulator_kernels._build.__wrapped__(text, "kept", False)
    assert elsewhere.path.is_file() and tmp_path not in elsewhere.path.parents
    elsewhere.kernel("nothing")((1,), (1,), (np.zeros(1, np.float32),))
    shutil.rmtree(elsewhere.path.parent)


# ----- the real kernels, through their launchers, against their references


@pytest.fixture
def on_emulator(monkeypatch):
    """tests/fake_cuda.py's stand-in for CuPy, whose sources.kernel is the emulated one: the launchers run
    the real kernels; every launch in every order of the threads. Yields the device to use."""
    fake_cuda.install(monkeypatch)
    monkeypatch.setattr(sources, "kernel", emulator_kernels.kernel)
    with emulator_kernels.thread_orders(*ALL_ORDERS, seed=3):
        yield "cuda:0"


def normal(seed, *shapes):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) for shape in shapes]


DTYPES = [np.float32, ag.bfloat16]
# heads, T, S, d, e, causal: partial tiles, both head widths of the kernels (64, 128), T < S
ATTENTION = [
    (2, 37, 45, 8, 8, False),
    (3, 33, 70, 64, 40, True),
    (2, 20, 20, 128, 128, True),
    (1, 1, 7, 3, 2, False),
]


def in_precision(kind):
    """A kind of attention's kernels as the dtype its arrays take, in the block where they run: "tf32",
    float32 arrays under the tf32 policy (the tensor cores' tf32 kernels); float32 and bfloat16 as they
    are."""
    if kind == "tf32":
        return np.float32, ag.use_precision("tf32")
    return kind, contextlib.nullcontext()


ATTENTION_KINDS = [np.float32, "tf32", ag.bfloat16]


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
@pytest.mark.parametrize("case", ATTENTION, ids=str)
def test_scaled_dot_product_attention(on_emulator, kind, dropout_p, case):
    heads, n_queries, n_keys, d, e, causal = case
    q, k, v = normal(len(case), (heads, n_queries, d), (heads, n_keys, d), (heads, n_keys, e))

    def attend(q, k, v):
        return F.scaled_dot_product_attention(
            q, k, v, causal=causal, dropout_p=dropout_p, generator=fresh_stream(1)
        )

    dtype, precision = in_precision(kind)
    with precision:
        assert_fast_equals_reference(attend, [q, k, v], on_emulator, dtype)


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
@pytest.mark.parametrize("batch, time, n_head, width", [(2, 70, 2, 64), (1, 130, 3, 100), (2, 17, 1, 128)])
def test_multi_head_attention(on_emulator, kind, dropout_p, batch, time, n_head, width):
    (qkv,) = normal(time, (batch, time, 3 * n_head * width))

    def attend(qkv):
        return F.multi_head_attention(qkv, n_head, dropout_p=dropout_p, generator=fresh_stream(2))

    dtype, precision = in_precision(kind)
    with precision:
        assert_fast_equals_reference(attend, [qkv], on_emulator, dtype)


@pytest.mark.parametrize("capability, tensor_cores", [("90", True), ("80", True), ("75", False)])
def test_attention_takes_the_tensor_cores_from_sm_80_on(on_emulator, monkeypatch, capability, tensor_cores):
    """The tensor cores' kernels are built for sm_80 and later only: before, bfloat16 attention runs the
    reference and float32 under tf32 the CUDA cores' float32 kernels."""
    monkeypatch.setattr(fake_cuda.Device, "compute_capability", capability)
    launched = []

    def kernel(name, function, dtype):
        launched.append(function)
        return emulator_kernels.kernel(name, function, dtype)

    monkeypatch.setattr(sources, "kernel", kernel)
    q, k, v = normal(0, (2, 20, 16), (2, 30, 16), (2, 30, 16))

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, causal=True, dropout_p=0.3, generator=fresh_stream(1))

    assert_fast_equals_reference(attend, [q, k, v], on_emulator, ag.bfloat16)
    assert ("attention_forward_mma_d64" in launched) == tensor_cores
    launched.clear()
    with ag.use_precision("tf32"):
        assert_fast_equals_reference(attend, [q, k, v], on_emulator, np.float32)
    expected = "attention_forward_mma_tf32_d64" if tensor_cores else "attention_forward_d64"
    assert (
        expected in launched
        and len(set(launched) & {"attention_forward_mma_tf32_d64", "attention_forward_d64"}) == 1
    )


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_a_block_that_walks_several_tiles_keeps_each_tiles_numbers(on_emulator, monkeypatch, kind):
    """With one block per head (a grid y of 1), each kernel goes through every tile of its head in turn,
    reusing its shared memory: the barriers between tiles must hold, in every thread order."""
    monkeypatch.setattr(attention_kernels, "MAX_GRID_Y", 1)
    (qkv,) = normal(3, (1, 150, 3 * 2 * 64))  # 3 tiles of 64 rows, 5 to 10 of 16 or 32

    def attend(qkv):
        return F.multi_head_attention(qkv, 2, dropout_p=0.3, generator=fresh_stream(2))

    dtype, precision = in_precision(kind)
    with precision:
        assert_fast_equals_reference(attend, [qkv], on_emulator, dtype)


def attention_weights(fn, inputs, device, reference):
    """The output of attention whose values are the identity: its weights, dropped out."""
    with ag.use_reference(reference):
        return fn(*(ag.tensor(a, dtype=np.float32, device=device) for a in inputs)).numpy()


@pytest.mark.parametrize("causal", [False, True])
def test_attentions_dropout_mask_is_the_references_bit_for_bit(on_emulator, causal):
    """With v the identity, y is the weights after dropout: the kernel drops exactly the entries the
    reference drops, for both attention Functions."""
    q, k = normal(5, (3, 37, 16), (3, 45, 16))
    v = np.broadcast_to(np.eye(45), (3, 45, 45))

    def attend(q, k, v):
        return F.scaled_dot_product_attention(
            q, k, v, causal=causal, dropout_p=0.3, generator=fresh_stream(4)
        )

    (qkv,) = normal(6, (2, 20, 3 * 2 * 20))
    qkv[:, :, 80:] = np.tile(np.eye(20), 2)  # each head's v: the identity

    def attend_packed(qkv):
        return F.multi_head_attention(qkv, 2, dropout_p=0.3, generator=fresh_stream(4))

    for fn, inputs in ((attend, [q, k, v]), (attend_packed, [qkv])):
        fast, reference = (attention_weights(fn, inputs, on_emulator, on) for on in (False, True))
        assert 0.2 < (reference == 0).mean() < 0.8
        np.testing.assert_array_equal(fast == 0, reference == 0)
        np.testing.assert_allclose(fast, reference, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [48, 1000, 2000])  # a warp per row (up to 1024), a block per row
@pytest.mark.parametrize("affine", [("weight", "bias"), ("weight",), ()])
def test_layer_norm(on_emulator, dtype, width, affine):
    x, weight, bias = normal(width, (3, 35, width), width, width)  # 105 rows: dw, db in 4 chunks
    params = [{"weight": weight + 1, "bias": bias}[name] for name in affine]
    fn = lambda x, *p: F.layer_norm(x, **dict(zip(affine, p)))  # noqa: E731
    assert_paths_agree(fn, [x, *params], layer_norm_dtypes(dtype, len(params)), on_emulator)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu(on_emulator, dtype):
    (x,) = normal(0, (7, 300))
    assert_fast_equals_reference(F.gelu, [x * 3], on_emulator, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_with_a_bias(on_emulator, dtype):
    """10 chunks of rows (a tree of two levels for the bias's gradient) in 3 blocks of columns, each with
    its own tree: a block that finished a group of another column block's tree would show."""
    x, bias = normal(3, (289, 600), (600,))
    assert_fast_equals_reference(lambda x, b: F.gelu(x, bias=b), [x * 3, bias], on_emulator, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_column_sums(on_emulator, dtype):
    """75 chunks of rows (three levels of the tree) in 2 blocks of columns, the blocks in every order:
    the bits of the order written down in test_kernels."""
    x = normal(4, (2400, 300))[0].astype(dtype)
    with ag.use_precision("fp32"):
        sums = linear_kernels.column_sums(backend.to_device(x, on_emulator))
    expected = column_sums_in_their_order(x, linear_kernels.ROWS_PER_CHUNK)
    np.testing.assert_array_equal(backend.to_host(sums), expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dropout_drops_the_references_entries(on_emulator, dtype):
    (x,) = normal(1, (6, 301))
    rtol, _ = TOLERANCE[np.dtype(dtype)]  # no absolute part: an entry is zero on both sides or on neither
    options = dict(device=on_emulator, dtype=dtype, tolerances={dtype: (rtol, 0.0)})
    assert_fast_path_matches(lambda t: F.dropout(t, 0.3, generator=fresh_stream(7)), x, **options)


def test_dropout_of_a_0d_tensor(on_emulator):
    """A 0-d x keeps its shape (ascontiguousarray makes it 1-d, in CuPy as in NumPy): a bug it found."""
    assert_fast_equals_reference(
        lambda t: F.dropout(t, 0.1, generator=fresh_stream(0)), [np.array(1.5)], on_emulator, np.float32
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_classes", [50, 1500])
def test_cross_entropy(on_emulator, dtype, n_classes):
    (logits,) = normal(n_classes, (2, 3, n_classes))
    targets = np.array([[1, -100, 0], [n_classes - 1, 7, 3]])
    targets_on_device = on_device(targets, on_emulator)

    def loss(z):
        return F.cross_entropy(z * 4, targets_on_device, reduction="none")

    assert_paths_agree(loss, [logits], [dtype], on_emulator)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("policy", ["fp32", "bf16"])
def test_embedding(on_emulator, dtype, policy):
    """Ids over two tiles of the backward's positions, two blocks of its rows, two passes of its columns."""
    ids = np.random.default_rng(4).integers(0, 11, (2, 150)) % np.array([3, 11])[:, None]
    (table,) = normal(2, (11, 1030))
    ids_on_device = on_device(ids, on_emulator)

    def embed(weight):
        with ag.use_precision(policy):
            rows = F.embedding(ids_on_device, weight)
        np.testing.assert_array_equal(rows.numpy(), backend.to_host(weight.data).astype(rows.dtype)[ids])
        return rows

    out_dtype = ag.bfloat16 if policy == "bf16" else np.dtype(dtype)
    slack = [0.0, summation_slack(ids, table.shape, out_dtype, dtype)]
    assert_paths_agree(embed, [table], [dtype], on_emulator, slack)


@pytest.mark.parametrize("l2_mode", ["decoupled", "coupled"])
@pytest.mark.parametrize("clip", [None, 0.5])
def test_adam_and_clip_grad_norm(on_emulator, l2_mode, clip):
    """A parameter of two chunks, a matrix, a vector, some steps without a gradient. One order of the
    threads: the kernels write the parameters through pointer tables, which no copy holds."""
    shapes = [(5000,), (7, 9), (3,)]
    with emulator_kernels.thread_orders("written"):
        runs = [
            train_with_adam(shapes, 4, 3, on_emulator, reference, clip, l2_mode=l2_mode, lr=1e-2, l2=0.01)
            for reference in (False, True)
        ]
    for what, fast, reference in zip(("parameter", "moment", "norm"), *runs):
        assert_adam_close(fast, reference, what)


# ----- mutation tests: the emulator catches the bugs it exists to catch

# attention.cu is compiled with its float32 kernels of width 64 only, to build faster
ATTENTION_OTHERS = ["ATTENTION_KERNELS(64, bf16, bf16)", "ATTENTION_KERNELS(128, f32, float)",
                    "ATTENTION_KERNELS(128, bf16, bf16)", "ATTENTION_ROW_DOT(bf16, bf16)"]  # fmt: skip


def check_attention(device):
    q, k, v = normal(0, (2, 37, 16), (2, 37, 16), (2, 37, 16))
    for causal in (False, True):

        def attend(q, k, v, causal=causal):
            return F.scaled_dot_product_attention(q, k, v, causal=causal)

        assert_fast_equals_reference(attend, [q, k, v], device, np.float32)


def check_layer_norm(device, width=48):
    x, weight = normal(1, (5, width), width)
    assert_paths_agree(F.layer_norm, [x, weight], [np.float32] * 2, device)


def check_layer_norm_blocks(device):
    check_layer_norm(device, width=1100)  # a block of 3 warps per row


def check_cross_entropy(device):
    (logits,) = normal(2, (6, 50))
    targets = on_device(np.arange(6), device)
    assert_fast_equals_reference(lambda z: F.cross_entropy(z, targets), [logits], device, np.float32)


MUTATIONS = {
    # the next K and V tiles' loads no longer after the last tile's products: threads overwrite rows that
    # others still read (a read of rows not yet loaded would give NaN in every order, which the numbers show)
    "a: a barrier removed from the attention forward": (
        "attention",
        "            __syncthreads();  // the last tile's products are done with sk, sv, sp (and sq is "
        "written)\n",
        "",
        check_attention,
        (EmulatorError, r"attention_forward_d64_f32: the threads in the orders .* a race between two"),
    ),
    # V's tile read from its second row: the last rows read past it
    "b: a shared tile read one row off": (
        "attention",
        "multiply_add<RM, EN, BC, BC + 1, 1, D, 8>(acc, &sp[ty * RM][0], &sv[0][tx]);",
        "multiply_add<RM, EN, BC, BC + 1, 1, D, 8>(acc, &sp[ty * RM][0], &sv[1][tx]);",
        check_attention,
        (AssertionError, "output"),
    ),
    # the rows of the last tile past T are written too, past the end of y
    "c: a bound check dropped, a write past the array": (
        "attention",
        "            if (t >= a.n_queries) continue;\n            const float norm",
        "            const float norm",
        check_attention,
        (EmulatorError, r"attention_forward_d64_f32: block \(1, 0, 0\) .* writes element \d+ of argument 3,"),
    ),
    # xor 2, 4, ..., 32 (32: a lane's own value) in place of 1, 2, ..., 16: no longer the warp's sum. (Any
    # other 5 independent masks, such as offset + 1, would still give it, in another order.)
    "d: a shuffle's offset changed": (
        "layer_norm",
        "v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);",
        "v += __shfl_xor_sync(0xFFFFFFFFu, v, offset * 2);",
        check_layer_norm,
        (AssertionError, r"output \(float32 on [\w:-]+\): fast path and reference differ"),
    ),
    # lanes past the block's warps read the reduction's shared array where no warp wrote: NaN
    "e: a shared array read before it is written": (
        "cross_entropy",
        "value = lane < static_cast<int>(blockDim.x / 32) ? shared[lane] : identity;",
        "value = shared[lane];",
        check_cross_entropy,
        (AssertionError, "nan"),
    ),
    # a warp that goes on alone through the second block sum's shuffles writes its entry of warp_sums while
    # other warps have yet to read the first sum's: only the orders that run one warp at a time show it
    "f: the barrier after a block sum's shared read removed": (
        "layer_norm",
        "    __syncthreads();  // every warp has read warp_sums before the next call writes them\n",
        "",
        check_layer_norm_blocks,
        (EmulatorError, r"layer_norm_forward_blocks_f32: the threads in the orders 'written' and 'warps' "),
    ),
}  # fmt: skip


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_a_mutated_kernel_fails_its_check_and_the_unmutated_one_passes(on_emulator, monkeypatch, mutation):
    name, old, new, check, (failure, message) = MUTATIONS[mutation]
    text = compiling.text(name)
    for other in ATTENTION_OTHERS if name == "attention" else ():
        text = text.replace(f"\n{other}\n", "\n")
    assert text.count(old) == 1, "the mutation no longer applies: update it to the source"
    original = compiling.text
    for copy in (text, text.replace(old, new)):
        monkeypatch.setattr(compiling, "text", lambda n, copy=copy: copy if n == name else original(n))
        if copy is text:
            check(on_emulator)
        else:
            with pytest.raises(failure, match=message):
                check(on_emulator)


# ----- debugging: gdb and the compilers name the repository's files, and each library's coordinates

ROOT = Path(__file__).parents[2]

# a launch of embedding.cu's kernel, then one of gelu.cu's: two libraries loaded
TWO_LIBRARIES = """
import numpy as np
from autograd.emulator import kernels as emulator_kernels

table, rows = np.ones((3, 4), np.float32), np.arange(3, dtype=np.int64)
embedding = emulator_kernels.kernel("embedding", "embedding_forward_f32", np.float32)
embedding((2,), (32,), (table, rows, np.empty_like(table), np.int64(3), np.int64(3), np.int64(4)))
x = np.linspace(-3, 3, 1000, dtype=np.float32)
args = (x, np.uintp(0), np.empty_like(x), np.int64(1), np.int64(x.size), np.int32(32))  # one row, no bias
emulator_kernels.kernel("gelu", "gelu_forward", np.float32)((1, 4), (256,), args)
"""


def line_of(file, start):
    """The number of the line of autograd/kernels/cuda/<file> that starts with `start`."""
    lines = (compiling.SOURCES / file).read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if line.lstrip().startswith(start))


@pytest.mark.skipif(shutil.which("gdb") is None, reason="needs gdb")
def test_gdb_stops_a_second_library_on_its_own_coordinates_at_the_real_line(tmp_path):
    """A debug build under gdb: in gelu's kernel, loaded after embedding's, the condition reads gelu's
    launch's blockIdx and threadIdx (each library has its own), and gdb names gelu.cu's own line."""
    (tmp_path / "two.py").write_text(TWO_LIBRARIES)
    stop = "break gelu_forward<float> if blockIdx.y == 1 && threadIdx.x == 3"
    show = 'printf "at %u %u %u %u\\n", blockIdx.y, threadIdx.x, blockDim.x, gridDim.y'
    commands = ["set breakpoint pending on", stop, "run", show]
    env = {**os.environ, "AUTOGRAD_EMULATOR_DEBUG": "1", "PYTHONPATH": str(ROOT)}
    gdb = ["gdb", "-batch", "-nx", *(part for c in commands for part in ("-ex", c))]
    script = [sys.executable, str(tmp_path / "two.py")]
    done = subprocess.run([*gdb, "--args", *script], capture_output=True, text=True, env=env, timeout=600)
    if "ptrace: Operation not permitted" in done.stderr:
        pytest.skip("gdb may not trace a process here")
    first = line_of("gelu.cu", "__device__ void gelu_forward(") + 2  # its first statement (2-line signature)
    assert f") at {compiling.SOURCES / 'gelu.cu'}:{first}\n" in done.stdout, done.stdout + done.stderr
    assert "\nat 1 3 256 4\n" in done.stdout  # blockIdx.y, threadIdx.x, blockDim.x, gridDim.y


# The gdb sessions of docs/internals.md, section 9: a block that starts `$ AUTOGRAD_EMULATOR_DEBUG=1 gdb`,
# its -ex commands, then what gdb printed and, after each `(gdb) `, what was typed; the script it debugs is
# the page's python block that starts with `# <name>`.
def page_blocks():
    """The bodies of the fenced blocks of docs/internals.md, without their fences."""
    return [block.split("\n", 1)[1].rsplit("\n", 1)[0] for block in FENCED.findall(INTERNALS)]


def gdb_session(script):
    """(the script's text, the environment, the -ex commands, the commands typed, the transcript) of the
    page's gdb session of `script`."""
    (text,) = (b for b in page_blocks() if b.startswith(f"# {script}\n"))
    (session,) = (b for b in page_blocks() if b.startswith("$ ") and f" {script}\n" in b)
    command, transcript = re.match(r"\$ ((?:[^\n]*\\\n)*[^\n]*)\n(.*)", session, re.S).groups()
    words = shlex.split(command.replace("\\\n", " "))
    environment = dict(w.split("=", 1) for w in words[: words.index("gdb")])
    options = [words[i + 1] for i, word in enumerate(words) if word == "-ex"]
    assert words[-3:] == ["--args", ".venv/bin/python", script], command
    typed = re.findall(r"^\(gdb\) (.*)$", transcript, re.M)
    return text, environment, options, typed, transcript


def gdb_shows(transcript):
    """What a transcript shows, as the test compares it: the functions of the frames gdb announces, their
    files and lines, the source lines (number, and text without its spacing) and the values of `print`.
    gdb names the thread that hit a breakpoint only where the process has several (OMP_NUM_THREADS=1: one)."""
    transcript = re.sub(r"^\(gdb\) .*\n", "", transcript, flags=re.M)
    hit = r'(?:(?:Thread \d+ "\w+" hit )?Breakpoint [\d.]+, )?'
    names = re.findall(rf"^{hit}([A-Za-z_][\w:]*(?:<[^<>\n]*>)?) \(", transcript, re.M)
    places = re.findall(r" at \S*?/(autograd/\S+):(\d+)$", transcript, re.M)
    lines = [(n, " ".join(code.split())) for n, code in re.findall(r"^(\d+)\s+(.*)$", transcript, re.M)]
    values = re.findall(r"^\$\d+ = (.*?)(?:\s+# .*)?$", transcript, re.M)
    return {"functions": names, "places": places, "lines": lines, "values": values}


@pytest.mark.skipif(shutil.which("gdb") is None, reason="needs gdb")
@pytest.mark.parametrize("script", ["gelu_gdb.py", "attention_gdb.py"])
def test_gdb_sessions_of_the_internals_page_print_what_the_page_shows(tmp_path, script):
    """docs/internals.md's gdb sessions, run as the page writes them (in batch mode): gdb stops in the
    frames the page names, at its lines, and each `print` gives the page's value; none finds no symbol."""
    text, environment, options, typed, transcript = gdb_session(script)
    (tmp_path / script).write_text(text)
    env = {**os.environ, **environment, "PYTHONPATH": str(ROOT)}
    gdb = ["gdb", "-batch", "-nx", *(part for c in options + typed for part in ("-ex", c))]
    command = [*gdb, "--args", sys.executable, str(tmp_path / script)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    if "ptrace: Operation not permitted" in done.stderr:
        pytest.skip("gdb may not trace a process here")
    output = done.stdout + done.stderr
    assert "No symbol" not in output, output
    shown, expected = gdb_shows(done.stdout), gdb_shows(transcript)
    assert expected["functions"] and len(expected["values"]) == sum(c.startswith("print ") for c in typed)
    assert shown == expected, output


def test_compilers_name_the_real_file_and_line_of_an_error():
    """compiling.headed's #line directives: NVRTC, and g++ as the emulator builds a source, give the lines of
    common.cuh and of the source themselves."""
    text, expected = compiling.text("gelu"), []
    for file, start in (("common.cuh", "typedef unsigned short bf16;"), ("gelu.cu", "constexpr float CUBIC")):
        assert text.count(start) == 1
        text = text.replace(start, f'static_assert(false, "here"); {start}')
        expected.append(rf"{re.escape(str(compiling.SOURCES / file))}[:(]{line_of(file, start)}\b")
    with pytest.raises(RuntimeError) as nvrtc:
        compiling.compiled(text, "gelu", "compute_90")
    cuda_h = str(emulator_kernels.EMULATOR / "cuda.h")
    gxx = ["g++", "-fsyntax-only", "-std=c++17", "-include", cuda_h, "-x", "c++", "-"]
    for log in (str(nvrtc.value), subprocess.run(gxx, input=text, capture_output=True, text=True).stderr):
        for where in expected:  # NVRTC: path(line); g++: path:line:column
            assert re.search(where, log), log
