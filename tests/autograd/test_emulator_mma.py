"""mma.sync on the emulated device (autograd/kernels/cuda/mma.cuh and the emulator's meet_at_mma)
against a NumPy model of the PTX ISA's fragments written out here on their own: which lane holds
which entry of A, B, C and D, probed one entry at a time; sums of small integers, exact, against
A B + C; random numbers bit for bit against the contract (products in float64 added in the order of
k, then C, rounded once); a warp whose lanes do not all get there is an error; and the packing
helpers' bits (bfloat16 pairs, tf32 rounding)."""

import ml_dtypes
import numpy as np
import pytest

from autograd import backend
from autograd.emulator import kernels as emulator_kernels
from autograd.emulator.kernels import EmulatorError
from autograd.kernels import compiling

KERNELS = r"""
#define LANE long long lane = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
#define REGISTERS                                                                              \
    unsigned int ra[4] = {a[4 * lane], a[4 * lane + 1], a[4 * lane + 2], a[4 * lane + 3]};      \
    unsigned int rb[2] = {b[2 * lane], b[2 * lane + 1]};                                         \
    float rc[4] = {c[4 * lane], c[4 * lane + 1], c[4 * lane + 2], c[4 * lane + 3]}, rd[4];

// Each warp multiplies the registers its lanes find at their index (a warp per problem).
extern "C" __global__ void mma_bf16(const unsigned int* a, const unsigned int* b, const float* c, float* d) {
    LANE REGISTERS
    mma_bf16_m16n8k16(rd, ra, rb, rc);
    for (int i = 0; i < 4; ++i) d[4 * lane + i] = rd[i];
}
extern "C" __global__ void mma_tf32(const unsigned int* a, const unsigned int* b, const float* c, float* d) {
    LANE REGISTERS
    mma_tf32_m16n8k8(rd, ra, rb, rc);
    for (int i = 0; i < 4; ++i) d[4 * lane + i] = rd[i];
}
// Lanes from `skipping` on leave before the mma.
extern "C" __global__ void mma_diverging(const unsigned int* a, const unsigned int* b, const float* c,
                                         float* d, int skipping) {
    LANE REGISTERS
    if (threadIdx.x % 32 >= skipping) return;
    mma_bf16_m16n8k16(rd, ra, rb, rc);
    d[4 * lane] = rd[0];
}
// Four 8 x 8 matrices of a shared tile of 32 rows (copied from `tile`), lane l giving row order[l]'s address
// plus `offset` numbers.
extern "C" __global__ void load_matrices(const unsigned short* tile, const int* order, unsigned int* out,
                                         int transposed, int offset) {
    alignas(16) __shared__ unsigned short rows[32][8];
    for (int i = threadIdx.x; i < 256; i += blockDim.x) rows[i / 8][i % 8] = tile[i];
    __syncthreads();
    unsigned int d[4];
    const unsigned short* row = &rows[order[threadIdx.x]][0] + offset;
    if (transposed)
        ldmatrix_x4<true>(d, row);
    else
        ldmatrix_x4<false>(d, row);
    for (int i = 0; i < 4; ++i) out[4 * threadIdx.x + i] = d[i];
}
extern "C" __global__ void load_from_global(const unsigned short* tile, unsigned int* out) {
    unsigned int d[4];
    ldmatrix_x4<false>(d, tile + 8 * threadIdx.x);
    out[threadIdx.x] = d[0];
}
extern "C" __global__ void packed(const float* x, unsigned int* out, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = pack_bf16x2(x[2 * i], x[2 * i + 1]);
}
extern "C" __global__ void tf32(const float* x, unsigned int* out, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = tf32_of(x[i]);
}
"""


TEXT = "".join((compiling.SOURCES / header).read_text() for header in compiling.HEADERS) + KERNELS


class OnTheGpu:
    """KERNELS compiled by NVRTC for the GPU, launched as the emulated library's are: on host arrays,
    which get back what the kernel wrote."""

    def __init__(self):
        self.module = backend.cupy.cuda.Module()
        capability = backend.cupy.cuda.Device().compute_capability
        self.module.load(compiling.compiled(TEXT, "mma_test", f"sm_{capability}"))

    def kernel(self, name):
        function = self.module.get_function(name)

        def launch(grid, block, args):
            moved = [backend.cupy.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
            function(grid, block, moved)
            for a, on_gpu in zip(args, moved):
                if isinstance(a, np.ndarray):
                    a[...] = on_gpu.get()

        return launch


@pytest.fixture(scope="module")
def library():
    """KERNELS on the emulated device."""
    return emulator_kernels.build(TEXT, "mma_test")


@pytest.fixture(scope="module", params=["cuda-emulated", pytest.param("cuda", marks=pytest.mark.gpu)])
def each_device(request, library):
    """KERNELS on the emulated device, and on a GPU: the tests of what the hardware fixes (which lane holds
    what, exact sums, the packing helpers' bits) hold the emulator's model to the real instructions."""
    return library if request.param == "cuda-emulated" else OnTheGpu()


# ----- the PTX ISA's fragments, lane by lane: g = lane // 4, t = lane % 4


def lanes():
    lane = np.arange(32)
    return lane // 4, lane % 4


def c_fragments(c):
    """(32, 4) float32: c0 = C[g][2t], c1 = C[g][2t+1], c2 = C[g+8][2t], c3 = C[g+8][2t+1]."""
    g, t = lanes()
    return np.stack([c[g, 2 * t], c[g, 2 * t + 1], c[g + 8, 2 * t], c[g + 8, 2 * t + 1]], axis=1)


def bf16_pairs(low, high):
    """Two bfloat16 arrays packed, `low` in the low 16 bits."""
    return low.view(np.uint16).astype(np.uint32) | high.view(np.uint16).astype(np.uint32) << 16


def bf16_fragments(a, b):
    """A (16, 16) and B (16, 8) bfloat16 as the lanes hold them: (32, 4) and (32, 2) registers of pairs."""
    g, t = lanes()
    pair = [2 * t, 2 * t + 1]
    a_regs = [
        bf16_pairs(a[rows, pair[0] + shift], a[rows, pair[1] + shift])
        for rows, shift in ((g, 0), (g + 8, 0), (g, 8), (g + 8, 8))
    ]
    b_regs = [bf16_pairs(b[pair[0] + shift, g], b[pair[1] + shift, g]) for shift in (0, 8)]
    return np.stack(a_regs, axis=1), np.stack(b_regs, axis=1)


def tf32_fragments(a, b):
    """A (16, 8) and B (8, 8) float32 as the lanes hold them, one number a register."""
    g, t = lanes()
    a_regs = [a[g, t], a[g + 8, t], a[g, t + 4], a[g + 8, t + 4]]
    return np.stack(a_regs, axis=1).view(np.uint32), np.stack([b[t, g], b[t + 4, g]], axis=1).view(np.uint32)


def contract(a, b, c):
    """D = A B + C as the emulator computes it: the products in float64 added in the order of k, then C,
    rounded once to float32."""
    total = np.zeros(c.shape)
    for k in range(a.shape[1]):
        total += a[:, k, None].astype(np.float64) * b[k, None, :].astype(np.float64)
    return (total + c).astype(np.float32)


def run(library, kernel, problems):
    """The kernel on one warp per problem (A, B, C as fragments): each problem's D as its lanes hold it."""
    a, b, c = (np.ascontiguousarray(np.concatenate(parts)) for parts in zip(*problems))
    d = np.full((len(problems) * 32, 4), np.nan, np.float32)
    library.kernel(kernel)((len(problems),), (32,), (a, b, c, d))
    return d.reshape(len(problems), 32, 4)


def bf16_problem(a, b, c):
    a, b = a.astype(ml_dtypes.bfloat16), b.astype(ml_dtypes.bfloat16)
    return (*bf16_fragments(a, b), c_fragments(c.astype(np.float32)))


def tf32_problem(a, b, c):
    return (*tf32_fragments(a.astype(np.float32), b.astype(np.float32)), c_fragments(c.astype(np.float32)))


# ----- which lane holds what


@pytest.mark.parametrize("kind", ["bf16", "tf32"])
def test_each_entry_of_a_and_b_reaches_its_row_and_column_of_d(each_device, kind):
    """One problem per (i, k, j): A and B one-hot at (i, k) and (k, j), C zero; D must be one-hot at (i, j),
    in the lane and register the C/D fragments give (i, j). Every lane's ownership of every entry shows."""
    depth, problem = (16, bf16_problem) if kind == "bf16" else (8, tf32_problem)
    cases = [(i, k, j) for i in range(16) for k in range(depth) for j in range(8)]
    problems = []
    for i, k, j in cases:
        a, b = np.zeros((16, depth), np.float32), np.zeros((depth, 8), np.float32)
        a[i, k], b[k, j] = 2.0, 3.0
        problems.append(problem(a, b, np.zeros((16, 8), np.float32)))
    d = run(each_device, f"mma_{kind}", problems)
    for (i, k, j), got in zip(cases, d):
        expected = np.zeros((16, 8), np.float32)
        expected[i, j] = 6.0
        np.testing.assert_array_equal(got, c_fragments(expected), err_msg=f"A[{i}][{k}] B[{k}][{j}]")


@pytest.mark.parametrize("kind", ["bf16", "tf32"])
def test_c_reaches_d_unchanged_where_a_b_is_zero(each_device, kind):
    problem = bf16_problem if kind == "bf16" else tf32_problem
    depth = 16 if kind == "bf16" else 8
    c = np.random.default_rng(1).standard_normal((16, 8)).astype(np.float32)
    (d,) = run(each_device, f"mma_{kind}", [problem(np.zeros((16, depth)), np.zeros((depth, 8)), c)])
    np.testing.assert_array_equal(d, c_fragments(c))


# ----- the numbers


@pytest.mark.parametrize("kind", ["bf16", "tf32"])
def test_small_integers_give_a_b_plus_c_exactly(each_device, kind):
    """Entries and sums small enough to be exact in every type: D = A B + C whatever the order of the sum."""
    rng = np.random.default_rng(2)
    depth, problem = (16, bf16_problem) if kind == "bf16" else (8, tf32_problem)
    problems, expected = [], []
    for _ in range(8):
        a, b = rng.integers(-8, 9, (16, depth)), rng.integers(-8, 9, (depth, 8))
        c = rng.integers(-64, 65, (16, 8)).astype(np.float32)
        problems.append(problem(a, b, c))
        expected.append(c_fragments((a @ b + c).astype(np.float32)))
    np.testing.assert_array_equal(run(each_device, f"mma_{kind}", problems), np.stack(expected))


def test_bf16_random_numbers_follow_the_contract_bit_for_bit(library):
    rng = np.random.default_rng(3)
    problems, expected = [], []
    for scale in (1.0, 1e-3, 1e4):
        a = (rng.standard_normal((16, 16)) * scale).astype(ml_dtypes.bfloat16)
        b = rng.standard_normal((16, 8)).astype(ml_dtypes.bfloat16)
        c = rng.standard_normal((16, 8)).astype(np.float32)
        problems.append(bf16_problem(a, b, c))
        expected.append(c_fragments(contract(a.astype(np.float32), b.astype(np.float32), c)))
    np.testing.assert_array_equal(run(library, "mma_bf16", problems), np.stack(expected))


def test_tf32_reads_no_bit_below_its_mantissa(library):
    """Random float32 in the registers: the emulator reads them as tf32, their low 13 bits cleared (the
    hardware does not read them), and follows the contract bit for bit."""
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((16, 8)).astype(np.float32), rng.standard_normal((8, 8)).astype(np.float32)
    c = rng.standard_normal((16, 8)).astype(np.float32)

    def truncated(x):
        return (x.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)

    (d,) = run(library, "mma_tf32", [tf32_problem(a, b, c)])
    np.testing.assert_array_equal(d, c_fragments(contract(truncated(a), truncated(b), c)))


# ----- a warp that does not meet whole


@pytest.mark.parametrize("skipping", [0, 16, 31])
def test_an_mma_that_some_lanes_of_the_warp_skip_is_an_error(library, skipping):
    a, b, c = bf16_problem(np.ones((16, 16)), np.ones((16, 8)), np.zeros((16, 8)))
    d = np.zeros((32, 4), np.float32)
    if skipping == 0:  # none reaches it: no meeting, no error
        library.kernel("mma_diverging")((1,), (32,), (a, b, c, d, np.int32(0)))
        return
    message = rf"mma_diverging: .*waits at mma.sync m16n8k16 bf16 .* for lane {skipping}, which has ended"
    with pytest.raises(EmulatorError, match=message):
        library.kernel("mma_diverging")((1,), (32,), (a, b, c, d, np.int32(skipping)))


def test_an_mma_in_a_warp_of_fewer_than_32_threads_is_an_error(library):
    a, b, c = bf16_problem(np.ones((16, 16)), np.ones((16, 8)), np.zeros((16, 8)))
    with pytest.raises(EmulatorError, match=r"mma.sync m16n8k16 bf16 with mask 0xffffffff names lane 20"):
        library.kernel("mma_bf16")((1,), (20,), (a, b, c, np.zeros((32, 4), np.float32)))


# ----- packing


def test_pack_bf16x2_puts_its_first_argument_in_the_low_half_rounded_to_nearest_even(each_device):
    rng = np.random.default_rng(5)
    x = np.concatenate([[1.0, 2.0], rng.standard_normal(998) * 100]).astype(np.float32)
    ties = np.array([0x3F808000, 0x3F818000], np.uint32).view(np.float32)  # halfway: down to even, up to even
    x = np.concatenate([x, ties])
    out = np.zeros(len(x) // 2, np.uint32)
    each_device.kernel("packed")((1,), (64,), (x, out, np.int32(len(out))))
    assert out[0] == 0x40003F80  # bfloat16 1.0 low, 2.0 high
    rounded = x.astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(out, bf16_pairs(rounded[0::2], rounded[1::2]))
    assert out[-1] == 0x3F823F80  # 0x3F80|8000 rounds down to even, 0x3F81|8000 up to even


def test_tf32_of_rounds_to_nearest_with_ties_away_from_zero(each_device):
    bits = np.array([0x3F800000, 0x3F801000, 0x3F803000, 0xBF801000, 0x3F800FFF, 0x7F7FF000], np.uint32)
    drawn = np.random.default_rng(6).standard_normal(500).astype(np.float32)
    x = np.concatenate([bits.view(np.float32), drawn])
    out = np.zeros(len(x), np.uint32)
    each_device.kernel("tf32")((1,), (64,), (x, out, np.int32(len(x))))
    assert list(out[:6]) == [0x3F800000, 0x3F802000, 0x3F804000, 0xBF802000, 0x3F800000, 0x7F800000]
    words = x.view(np.uint32)
    magnitude, sign = words & np.uint32(0x7FFFFFFF), words & np.uint32(0x80000000)
    expected = ((magnitude + np.uint32(0x1000)) & np.uint32(0xFFFFE000)) | sign
    np.testing.assert_array_equal(out, expected)


# ----- ldmatrix


def ldmatrix_model(rows, transposed):
    """The (32, 4) registers of ldmatrix.x4 whose lanes 8i..8i+7 gave rows 0..7 of matrix i (rows: 32 x 8
    16-bit numbers, in the lanes' order): lane l gets row l // 4, columns 2 (l % 4), 2 (l % 4) + 1 of each
    matrix; transposed, column l // 4, rows 2 (l % 4), 2 (l % 4) + 1. The lower index in the low half."""
    g, t = lanes()
    matrices = rows.reshape(4, 8, 8).astype(np.uint32)
    if transposed:
        matrices = matrices.transpose(0, 2, 1)
    return np.stack([m[g, 2 * t] | m[g, 2 * t + 1] << 16 for m in matrices], axis=1)


@pytest.mark.parametrize("transposed", [False, True])
def test_ldmatrix_hands_each_lane_its_fragments_of_the_rows_the_lanes_point_at(each_device, transposed):
    rng = np.random.default_rng(7)
    tile = rng.integers(0, 2**16, (32, 8), dtype=np.uint16)
    order = rng.permutation(32).astype(np.int32)  # lane l gives row order[l] of the tile
    out = np.zeros((32, 4), np.uint32)
    each_device.kernel("load_matrices")((1,), (32,), (tile, order, out, np.int32(transposed), np.int32(0)))
    np.testing.assert_array_equal(out, ldmatrix_model(tile[order], transposed))


def test_ldmatrix_refuses_a_row_that_is_not_16_byte_aligned_or_not_in_shared_memory(library):
    tile, order = np.zeros((32, 8), np.uint16), np.arange(32, dtype=np.int32)
    out = np.zeros((32, 4), np.uint32)
    with pytest.raises(EmulatorError, match=r"load_matrices: .*lane 0 gives the row address .*, not 16"):
        library.kernel("load_matrices")((1,), (32,), (tile, order, out, np.int32(0), np.int32(1)))
    with pytest.raises(EmulatorError, match=r"load_from_global: .*outside the block's shared memory"):
        library.kernel("load_from_global")((1,), (32,), (np.zeros(256, np.uint16), np.zeros(32, np.uint32)))
