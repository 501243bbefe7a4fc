"""Every CUDA source compiles under NVRTC for sm_75, sm_80 and sm_90 (to binaries, so that ptxas reads
the inline PTX; to PTX alone for sm_75 where a source has no code of its own for newer GPUs), with no
error and no warning. No GPU or driver is needed (CuPy's binding to NVRTC
works without them): a compile error is found here, never first on a GPU. And the device helpers of
common.cuh, built as plain C++ with g++, give the bits of autograd/random.py's dropout masks and of
ml_dtypes' bfloat16 rounding: those tests need g++ alone, and run wherever it is, NVRTC or not."""

import os
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from autograd import backend, random
from autograd.kernels import compiling, sources
from tests.helpers import GOLDEN_KEEP, GOLDEN_P, ONE_ABOVE, ptx_of

from .. import fake_cuda

SOURCES = sorted(path.stem for path in compiling.SOURCES.glob("*.cu"))


@pytest.fixture(scope="module")
def nvrtc():
    """CuPy's binding to NVRTC, for the tests that compile. CI installs it (and g++): there a missing
    one fails, elsewhere those tests skip."""
    if os.environ.get("CI"):
        from cupy_backends.cuda.libs import nvrtc

        return nvrtc
    return pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="pip install -e '.[nvrtc]'")


# sm_75 and sm_90, the oldest and the newest GPUs compiled for; sm_80 too where a source has code of its
# own from there on (attention's tensor cores, and its inline PTX). The others' sm_75 code is their sm_90
# code, which ptxas reads there: for sm_75 they are compiled to PTX alone (compute_75), by the front end
# under sm_75's rules, in half the time (layer_norm's unrolled rows take NVRTC 25 s a binary).
ARCHS = [
    (name, arch if arch != "sm_75" or newer else "compute_75")
    for name in SOURCES
    for newer in ["__CUDA_ARCH__ >= 800" in compiling.text(name)]
    for arch in ("sm_75", "sm_80", "sm_90")
    if arch != "sm_80" or newer
]


@pytest.mark.parametrize("name, arch", ARCHS)
def test_every_cuda_source_compiles_without_a_warning(nvrtc, name, arch):
    program = nvrtc.createProgram(compiling.text(name), f"{name}.cu", [], [])
    try:
        nvrtc.compileProgram(program, [f"--gpu-architecture={arch}", *compiling.OPTIONS])
    except nvrtc.NVRTCError:
        pytest.fail(nvrtc.getProgramLog(program))
    assert nvrtc.getProgramLog(program).strip() == ""
    assert len(nvrtc.getCUBIN(program) if arch.startswith("sm_") else nvrtc.getPTX(program)) > 0


MMA_USER = r"""
extern "C" __global__ void mma_user(const float* x, float* out) {
    unsigned int a[4], b[2], t[4], u[2];
    for (int i = 0; i < 4; ++i) {
        a[i] = pack_bf16x2(x[2 * i], x[2 * i + 1]);
        t[i] = tf32_of(x[i]);
    }
    for (int i = 0; i < 2; ++i) {
        b[i] = pack_bf16x2(x[i], x[i + 4]);
        u[i] = tf32_of(x[i + 4]);
    }
    alignas(16) __shared__ unsigned short rows[32][8];
    for (int i = 0; i < 8; ++i) rows[threadIdx.x % 32][i] = static_cast<unsigned short>(a[i % 4]);
    __syncthreads();
    unsigned int m[4], n[4];
    ldmatrix_x4<false>(m, rows[threadIdx.x % 32]);
    ldmatrix_x4<true>(n, rows[threadIdx.x % 32]);
    float c[4] = {x[0], x[1], x[2], x[3]}, d[4], e[4];
    mma_bf16_m16n8k16(d, m, n, c);
    mma_tf32_m16n8k8(e, t, u, d);
    for (int i = 0; i < 4; ++i) out[4 * threadIdx.x + i] = e[i];
}
"""


@pytest.mark.usefixtures("nvrtc")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_mma_helpers_assemble_for_the_gpus_with_tensor_cores(arch):
    """mma.cuh's inline PTX (mma, cvt, ldmatrix), used by a kernel, goes through ptxas to a binary
    (PTX alone never meets ptxas: a malformed asm string would show first on a GPU), and the PTX holds
    the instructions."""
    text = compiling.text("column_sums") + MMA_USER  # every source has the headers in front
    assert compiling.compiled(text, "mma_user", arch)
    ptx = compiling.compiled(text, "mma_user", "compute_" + arch[3:]).decode()
    for instruction in (
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
        "cvt.rn.bf16x2.f32",
        "cvt.rna.tf32.f32",
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
        "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
    ):
        assert instruction in ptx, instruction


@pytest.mark.usefixtures("nvrtc")
def test_attentions_kernels_multiply_on_the_tensor_cores_of_their_kind():
    """Each kernel of attention.cu in the PTX: the bfloat16 tile kernels hold mma.sync m16n8k16 and
    ldmatrix (plain and transposing); the tf32 ones, mma.sync m16n8k8 on operands rounded by cvt.rna;
    the float32 ones on CUDA cores and the row dot products, none of them. Every tensor-core kernel
    takes 2^x as ex2.approx; the forwards alone take log2 (of a row's sum), as lg2.approx."""
    ptx = ptx_of("attention")
    kernels = {part.split("(")[0].strip(): part for part in ptx.split(".entry ")[1:]}
    assert len(kernels) == 17
    instructions = {
        "bf16": [
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
            "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
            "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
        ],
        "tf32": ["mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", "cvt.rna.tf32.f32"],
    }
    for name, body in kernels.items():
        kind = "tf32" if "_tf32_" in name else "bf16" if name.endswith("_bf16") else None
        kind = None if "row_dot" in name else kind
        for of_kind, listed in instructions.items():
            for instruction in listed:
                assert (instruction in body) == (kind == of_kind), (name, instruction)
        if kind:
            assert "ex2.approx.f32" in body and ("lg2.approx.f32" in body) == ("forward" in name), name


DRIVER = r"""
#include <cstdio>
int main() {
    char mode;
    while (std::scanf(" %c", &mode) == 1) {
        if (mode == 'p') {  // p c0 c1 c2 c3 k0 k1: Philox4x32-10
            unsigned int c[4], k0, k1;
            std::scanf("%u %u %u %u %u %u", &c[0], &c[1], &c[2], &c[3], &k0, &k1);
            philox4x32_10(c, k0, k1);
            std::printf("%u %u %u %u\n", c[0], c[1], c[2], c[3]);
        } else if (mode == 'd') {  // d seed step site threshold example j: a dropout decision
            MaskKey key;
            unsigned int example;
            unsigned long long j;
            std::scanf("%llu %u %u %u", &key.seed, &key.step, &key.site, &key.threshold);
            std::scanf("%u %llu", &example, &j);
            std::printf("%d\n", dropout_keeps(key, example, j) ? 1 : 0);
        } else if (mode == 'b') {  // b bits: a float32 (as its bits) stored as bfloat16
            unsigned int bits;
            std::scanf("%u", &bits);
            bf16 out;
            store(&out, 0, bits_to_float(bits));
            std::printf("%u\n", static_cast<unsigned int>(out));
        }
    }
}
"""


@pytest.fixture(scope="module")
def common_on_host(tmp_path_factory):
    """common.cuh with a driver that reads requests on stdin, built with g++; a function that
    sends lines and returns the answers."""
    if shutil.which("g++") is None and not os.environ.get("CI"):
        pytest.skip("needs g++ to build common.cuh on the host")
    folder = tmp_path_factory.mktemp("common")
    (folder / "driver.cpp").write_text((compiling.SOURCES / "common.cuh").read_text() + DRIVER)
    subprocess.run(
        ["g++", "-std=c++17", "-O1", "-o", str(folder / "driver"), str(folder / "driver.cpp")], check=True
    )

    def ask(lines):
        done = subprocess.run(
            [str(folder / "driver")], input="\n".join(lines), capture_output=True, text=True, check=True
        )
        return done.stdout.split("\n")[: len(lines)]

    return ask


WORD = st.integers(0, 2**32 - 1)


@settings(max_examples=10)
@given(st.lists(st.tuples(*[WORD] * 6), min_size=1, max_size=20))
def test_philox_on_the_host_gives_numpys_bits(common_on_host, requests):
    answers = common_on_host([f"p {' '.join(map(str, r))}" for r in requests])
    for (c0, c1, c2, c3, k0, k1), answer in zip(requests, answers):
        expected = random.philox4x32_10(
            (np.uint32(c0), np.uint32(c1), np.uint32(c2), np.uint32(c3)), (k0, k1)
        )
        assert [int(w) for w in answer.split()] == [int(w) for w in expected]


@settings(max_examples=10)
@given(
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**32 - 1),
    st.integers(0, 5),
    st.integers(0, 1000),
    st.sampled_from([0.0, 0.1, 0.5, 0.9]),
    st.integers(1, 3),
    st.integers(1, 40),
)
@example(seed=2**64 - 2**31, step=7, site=2, first=3, p=0.5, examples=2, per_example=19)  # seed >> 32 counts
def test_dropout_decisions_on_the_host_are_the_masks_of_autograd_random(
    common_on_host, seed, step, site, first, p, examples, per_example
):
    """Entry (b, j) kept by common.cuh's dropout_keeps exactly where MaskStream's mask keeps it."""
    stream = random.MaskStream(seed, step, first)
    stream.site = site
    expected = stream.keep_mask((examples, per_example), p)
    threshold = round(p * 65536)
    lines = [
        f"d {seed} {step & 0xFFFFFFFF} {site} {threshold} {first + b} {j}"
        for b in range(examples)
        for j in range(per_example)
    ]
    kept = np.array([int(a) for a in common_on_host(lines)], dtype=bool).reshape(examples, per_example)
    np.testing.assert_array_equal(kept, expected)


def test_dropout_keeps_the_golden_case_on_the_host(common_on_host):
    """dropout_keeps's rule is u >= threshold: test_random's golden case (MaskStream(0, 0), p =
    0xBC57 / 2^16 keeps position 5, whose number that is; 0xBC58 / 2^16 drops it)."""
    threshold = round(GOLDEN_P * 65536)
    lines = [f"d 0 0 0 {threshold + above} 0 {j}" for above in (0, 1) for j in range(8)]
    assert common_on_host(lines) == [str(int(keep)) for keep in GOLDEN_KEEP + ONE_ABOVE]


@settings(max_examples=10)
@given(st.integers(0, 2**64 - 1), WORD, st.integers(0, 5), WORD, st.integers(0, 40))
def test_dropout_keeps_a_drawn_number_at_its_own_threshold_on_the_host(
    common_on_host, seed, step, site, example, j
):
    """u, the number drawn for entry j of `example`: kept at threshold u, dropped at u + 1."""
    words = random.philox4x32_10((j // 8, example, site, seed >> 32), (seed % 2**32, step))
    u = (int(words[(j % 8) // 2]) >> (16 * (j % 2))) & 0xFFFF
    answers = common_on_host([f"d {seed} {step} {site} {u + above} {example} {j}" for above in (0, 1)])
    assert answers == ["1", "0"], u


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")  # ml_dtypes, for the NaNs
@settings(max_examples=10)
@given(st.lists(WORD, min_size=1, max_size=50))
def test_bfloat16_rounding_on_the_host_is_ml_dtypes(common_on_host, words):
    """Any float32 (NaN, infinities, subnormals, halfway cases among them) rounds to the bfloat16
    that ml_dtypes gives, bit for bit (a NaN to a NaN)."""
    words += [0x3F808000, 0x3F818000, 0x7F800000, 0xFF800000, 0x00000001, 0x7FC00000, 0x7F800001]
    answers = [int(a) for a in common_on_host([f"b {w}" for w in words])]
    values = np.array(words, dtype=np.uint32).view(np.float32)
    expected = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    for value, answer, bits in zip(values, answers, expected):
        if np.isnan(value):
            assert np.isnan(np.array([answer], np.uint16).view(ml_dtypes.bfloat16)[0])
        else:
            assert answer == bits, f"{value!r}: {answer:#06x} against {int(bits):#06x}"


# float32 bits and the bfloat16 bits that store makes of them (None: a NaN). Exactly halfway between two
# bfloat16s (lower 16 bits 0x8000) goes to the one whose last bit is 0: an even upper half stays, an
# odd one goes up; a bit more or less decides alone. A NaN stays a NaN, its payload in the dropped half
# or not, and an infinity an infinity.
ROUNDED = {
    "tie, even stays": (0x3F808000, 0x3F80),
    "tie, odd goes up": (0x3F818000, 0x3F82),
    "negative tie, even stays": (0xBF808000, 0xBF80),
    "negative tie, odd goes up": (0xBF818000, 0xBF82),
    "subnormal tie, even stays": (0x00008000, 0x0000),
    "subnormal tie, odd goes up": (0x00018000, 0x0002),
    "tie, odd up to infinity": (0x7F7F8000, 0x7F80),
    "just below a tie": (0x3F818000 - 1, 0x3F81),
    "just above a tie": (0x3F808000 + 1, 0x3F81),
    "infinity": (0x7F800000, 0x7F80),
    "NaN, payload in the dropped half": (0x7F800001, None),
    "negative NaN, payload in the dropped half": (0xFF808000, None),
    "quiet NaN": (0x7FC00000, None),
}


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")  # ml_dtypes, for the NaNs
@pytest.mark.parametrize("bits, rounded", ROUNDED.values(), ids=ROUNDED)
def test_bfloat16_rounds_ties_to_even_and_keeps_nans_on_the_host(common_on_host, bits, rounded):
    """store's rounding of the cases that random float32 bits almost never are: exact ties, NaNs."""
    as_ml_dtypes = np.array([bits], np.uint32).view(np.float32).astype(ml_dtypes.bfloat16)
    on_host = np.array([int(common_on_host([f"b {bits}"])[0])], np.uint16)
    if rounded is None:
        assert np.isnan(as_ml_dtypes[0]) and np.isnan(on_host.view(ml_dtypes.bfloat16)[0])
    else:
        assert as_ml_dtypes.view(np.uint16)[0] == on_host[0] == rounded


LIBRARY_FTZ = {"ex2.approx.ftz.f32", "rcp.approx.ftz.f32"}  # inside expf and tanhf, whatever the options


def flushing_instructions(ptx):
    """The instructions of a PTX text that flush subnormal floats to zero."""
    return {line.split()[0] for line in ptx.splitlines() if ".ftz" in line}


@pytest.mark.parametrize("name", SOURCES)
def test_the_compiled_kernels_keep_subnormal_floats(nvrtc, name):
    """No arithmetic of what sources.module loads flushes subnormals to zero (.ftz): the reference keeps
    them (Adam's second moments of small gradients are subnormal). Only CUDA's own expf and tanhf
    use .ftz approximations inside, with any options. CuPy's RawModule would append -ftz=true;
    compiled with it, Adam's kernel flushes in every add and multiply."""
    assert flushing_instructions(ptx_of(name)) <= LIBRARY_FTZ
    if name == "adam":
        program = nvrtc.createProgram(compiling.text(name), "adam.cu", [], [])
        nvrtc.compileProgram(program, ["--gpu-architecture=compute_90", *compiling.OPTIONS, "-ftz=true"])
        assert {"add.rn.ftz.f32", "mul.rn.ftz.f32"} <= flushing_instructions(nvrtc.getPTX(program).decode())


class LoadedModule:
    """cupy.cuda.Module as sources.module uses it: what it loads, and the functions asked of it."""

    def load(self, binary):
        self.binary = binary

    def get_function(self, name):
        return name


@pytest.mark.usefixtures("nvrtc")  # sources.module asks NVRTC which architectures it knows
def test_a_module_is_nvrtcs_binary_for_the_device_compiled_once(monkeypatch, tmp_path):
    """sources.module loads NVRTC's binary for the device's architecture (sm_90 on an H100), compiled
    with compiling.OPTIONS and kept on disk: a second process reads it instead of compiling again."""
    fake_cuda.install(monkeypatch)
    monkeypatch.setattr(backend.cupy.cuda, "Module", LoadedModule, raising=False)
    monkeypatch.setattr(compiling, "CACHE", tmp_path / "cache")
    compiled = []
    monkeypatch.setattr(
        compiling, "compiled", lambda text, name, arch: compiled.append(arch) or arch.encode()
    )
    for _ in range(2):
        sources.module.cache_clear()  # as a new process would
        assert sources.module(compiling.text("gelu"), "gelu", 0).binary == b"sm_90"
    assert compiled == ["sm_90"] and len(list((tmp_path / "cache").iterdir())) == 1
