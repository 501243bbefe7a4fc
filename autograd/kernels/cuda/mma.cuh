// The tensor cores' matrix multiply-accumulate of one warp, mma.sync: d = A B + c, A (16 x k) row-major, B (k x 8)
// column-major, c and d (16 x 8) float32, every lane holding its fragments as the PTX ISA lays them out (written
// out in autograd/emulator/cuda.cpp:meet_at_mma). On a GPU, inline PTX; on the emulated device, a meeting
// of the warp's 32 lanes that computes D under the contract written there. Every lane of the warp must get there
// together, as at a shuffle; so at ldmatrix, which loads fragments from shared memory.
// autograd/kernels/compiling.py:headed puts this file in front of each source, after common.cuh.

// The operands of every mma.sync below: d, then a, b and c.
#define MMA_OPERANDS                                                                                              \
    "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"                                         \
    : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])                                                              \
    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3])

// One mma.sync `instruction`, on the operands above: inline PTX on a GPU; on the emulated device, a meeting of the
// warp's lanes that computes the mma of `kind` (EMU_MMA_BF16 or EMU_MMA_TF32).
#ifdef __CUDA_ARCH__
#define MMA(instruction, kind) asm(instruction " " MMA_OPERANDS)
#else
inline void emulated_mma(int kind, float d[4], const unsigned int a[4], const unsigned int b[2], const float c[4]) {
    EmuMma lane{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}, {c[0], c[1], c[2], c[3]}, {}};
    emu_mma(kind, &lane);
    for (int i = 0; i < 4; ++i) d[i] = lane.d[i];
}
#define MMA(instruction, kind) emulated_mma(kind, d, a, b, c)
#endif

// m16n8k16 on bfloat16: a[4] and b[2] hold two bfloat16 each, the lower index in the low 16 bits (pack_bf16x2).
__device__ __forceinline__ void mma_bf16_m16n8k16(float d[4], const unsigned int a[4], const unsigned int b[2],
                                                  const float c[4]) {
    MMA("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", EMU_MMA_BF16);
}

// m16n8k8 on tf32: one number a register, rounded by tf32_of (the hardware does not read the low 13 bits).
__device__ __forceinline__ void mma_tf32_m16n8k8(float d[4], const unsigned int a[4], const unsigned int b[2],
                                                 const float c[4]) {
    MMA("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", EMU_MMA_TF32);
}

// low and high rounded to bfloat16 (to nearest, ties to even) in one register, low in the low 16 bits. PTX's
// cvt.rn.bf16x2.f32 d, a, b puts its FIRST source a in the upper half: hence (high, low) below.
__device__ __forceinline__ unsigned int pack_bf16x2(float low, float high) {
#ifdef __CUDA_ARCH__
    unsigned int packed;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(high), "f"(low));
    return packed;
#else
    bf16 halves[2];
    store(halves, 0, low);
    store(halves, 1, high);
    return static_cast<unsigned int>(halves[0]) | static_cast<unsigned int>(halves[1]) << 16;
#endif
}

// x rounded to tf32 (10 bits of mantissa; to nearest, ties away from zero: cvt.rna), as a float's 32 bits.
__device__ __forceinline__ unsigned int tf32_of(float x) {
#ifdef __CUDA_ARCH__
    unsigned int rounded;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(rounded) : "f"(x));
    return rounded;
#else
    unsigned int bits = float_to_bits(x);
    if ((bits & 0x7F800000u) == 0x7F800000u) return bits;  // an infinity kept (and a NaN, here)
    return (bits + 0x1000u) & 0xFFFFE000u;  // half of the 13 bits dropped added to the magnitude
#endif
}

// Four 8 x 8 matrices of 16-bit numbers from shared memory into every lane's fragments, ldmatrix.x4: lanes 8i to
// 8i + 7 give the addresses of matrix i's rows (16 bytes each, 16-byte aligned), and lane l gets in d[i] row l / 4,
// columns 2 (l % 4) and 2 (l % 4) + 1 of matrix i; Transposed (.trans), column l / 4, rows 2 (l % 4) and
// 2 (l % 4) + 1: B's fragments from a row-major tile.
template <bool Transposed>
__device__ __forceinline__ void ldmatrix_x4(unsigned int d[4], const void* row) {
#ifdef __CUDA_ARCH__
    unsigned int address = static_cast<unsigned int>(__cvta_generic_to_shared(row));
    if (Transposed)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                     : "r"(address)
                     : "memory");
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                     : "r"(address)
                     : "memory");
#else
    emu_ldmatrix(Transposed ? EMU_LDMATRIX_TRANS : EMU_LDMATRIX, row, d);
#endif
}
