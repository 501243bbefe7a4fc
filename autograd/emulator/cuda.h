// CUDA's built-ins with their GPU meaning on the CPU: the emulated CUDA device of autograd/emulator/kernels.py.
//
// A source of autograd/kernels/cuda (compiling.text(name): the headers, then the source) compiles with g++ after
// `#include "cuda.h"`, unchanged, into a shared library together with cuda.cpp, which runs a launch:
//   - each CUDA thread of a block is a fiber (its own stack, on one OS thread), run until it reaches
//     __syncthreads(), a warp shuffle or its end; blocks run one after another;
//   - __syncthreads() returns in no thread before every thread of the block has reached it; a shuffle is a
//     meeting of the 32 lanes of a warp, and a lane that is not there is an error; a width below 32 splits
//     the warp into segments as PTX's shfl.sync does (see cuda.cpp);
//   - __shared__ variables are static, thread-local storage of the OS thread (static __thread): the library's
//     thread-local block holds them and nothing else, so cuda.cpp fills it with NaN (every 32-bit word
//     0x7FC00000) before each block. (A `section` attribute would not do: g++ 12 ignores it on the statics of
//     function templates.)
// Arithmetic is the host's IEEE float32: the library is built with -ffp-contract=off, so that a * b + c and
// the __f*_rn intrinsics round at each operator as CUDA's do, and fmaf is a true fused multiply-add.
// expf, logf, tanhf are glibc's (correctly rounded or within 1 ulp), where CUDA's are within 2 ulp.
#pragma once

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <type_traits>
#include <utility>

// ----- the launch, as autograd/emulator/kernels.py passes it (mirrored there as a ctypes Structure)

extern "C" {
struct EmuLaunch {
    unsigned grid[3], block[3];
    int order;                      // the threads' order between barriers: 0 as written, 1 reversed, 2 shuffled,
                                    // 3 and 4: 0 and 1 run a warp at a time (cuda.cpp)
    unsigned long long seed;        // of the shuffled order
    unsigned long long fault_address;  // out: where a memory fault happened
    int fault;                      // out: 0 none, 1 read, 2 write, 3 access, 4 stack overflow, 5 arithmetic
    unsigned error_block[3], error_thread[3];  // out: where an error happened
    char message[512];              // out: what went wrong, for errors other than a memory fault
};
}

// ----- the thread's coordinates: static variables, so that each library's kernels have their own, which gdb
// finds first from a kernel's frame (a global it would look up in the first library loaded). emu_run has
// their addresses (emu::launch passes them) and sets them before it switches to a fiber. They change only
// inside the calls below, which g++ cannot see into (cuda.cpp is another translation unit), so every read
// after a switch reads them again.

struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int x = 1, unsigned int y = 1, unsigned int z = 1) : x(x), y(y), z(z) {}
};

static uint3 threadIdx, blockIdx;  // the kernels' (cuda.cpp's own copies are unused)
static dim3 blockDim, gridDim;
struct EmuCoordinates {
    uint3 *thread_idx, *block_idx;
    dim3 *block_dim, *grid_dim;
};

// Runs body(context) as every thread of every block: 0 when done, 1 on an error (message), 2 on a fault.
extern "C" int emu_run(EmuLaunch* launch, EmuCoordinates at, void (*body)(void*), void* context);

constexpr int warpSize = 32;

// ----- qualifiers

#define __global__
#define __launch_bounds__(...)  // read from the PTX by autograd/emulator/kernels.py, and enforced there
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __shared__ static __thread  // static only: `extern __shared__` (dynamic shared memory) does not compile

// ----- barriers and warp meetings (cuda.cpp): each switches to the block's scheduler until it may go on

enum EmuWarpKind {
    EMU_SHFL_IDX, EMU_SHFL_UP, EMU_SHFL_DOWN, EMU_SHFL_XOR, EMU_SYNCWARP,
    EMU_MMA_BF16, EMU_MMA_TF32, EMU_LDMATRIX, EMU_LDMATRIX_TRANS
};
extern "C" void emu_syncthreads(void);
extern "C" unsigned long long emu_warp_meet(int kind, unsigned mask, unsigned long long bits, int arg, int width);

// A lane's registers at mma.sync (EMU_MMA_BF16: m16n8k16.row.col.f32.bf16.bf16.f32; EMU_MMA_TF32:
// m16n8k8.row.col.f32.tf32.tf32.f32): its fragments of A, B and C, and d, which the meeting writes.
struct EmuMma {
    unsigned int a[4], b[2];
    float c[4], d[4];
};
extern "C" void emu_mma(int kind, EmuMma* lane);
// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: `row` the lane's row address, d its four registers.
extern "C" void emu_ldmatrix(int kind, const void* row, unsigned int d[4]);

inline void __syncthreads() { emu_syncthreads(); }
inline void __syncwarp(unsigned mask = 0xFFFFFFFFu) { emu_warp_meet(EMU_SYNCWARP, mask, 0, 0, warpSize); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
template <typename T>
T __ldcg(const T* address) {  // a load that goes around L1: one memory here
    return *address;
}

template <typename T>
T emu_shuffle(int kind, unsigned mask, T value, int arg, int width) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "a shuffle moves up to 8 bytes");
    unsigned long long bits = 0;
    memcpy(&bits, &value, sizeof value);
    bits = emu_warp_meet(kind, mask, bits, arg, width);
    memcpy(&value, &bits, sizeof value);
    return value;
}
template <typename T>
T __shfl_sync(unsigned mask, T value, int lane, int width = warpSize) {
    return emu_shuffle(EMU_SHFL_IDX, mask, value, lane, width);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = warpSize) {
    return emu_shuffle(EMU_SHFL_UP, mask, value, static_cast<int>(delta), width);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = warpSize) {
    return emu_shuffle(EMU_SHFL_DOWN, mask, value, static_cast<int>(delta), width);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = warpSize) {
    return emu_shuffle(EMU_SHFL_XOR, mask, value, lane_mask, width);
}

// ----- atomics: the fibers of a launch take turns on one OS thread, so a read-modify-write is atomic as it
// is; the order in which threads get to it is the scheduler's (see autograd/emulator/kernels.py:thread_orders).

template <typename T>
struct emu_same {  // keeps the second argument of an atomic out of the deduction of T
    using type = T;
};

// *address = update(*address), giving back the value before: the shape of every atomic
template <typename T, typename Update>
T emu_atomic(T* address, Update update) {
    T old = *address;
    *address = update(old);
    return old;
}

// clang-format off
template <typename T> T atomicAdd(T* a, typename emu_same<T>::type v) { return emu_atomic(a, [v](T o) { return o + v; }); }
template <typename T> T atomicSub(T* a, typename emu_same<T>::type v) { return emu_atomic(a, [v](T o) { return o - v; }); }
template <typename T> T atomicMax(T* a, typename emu_same<T>::type v) { return emu_atomic(a, [v](T o) { return o < v ? v : o; }); }
template <typename T> T atomicMin(T* a, typename emu_same<T>::type v) { return emu_atomic(a, [v](T o) { return v < o ? v : o; }); }
template <typename T> T atomicExch(T* a, typename emu_same<T>::type v) { return emu_atomic(a, [v](T) { return v; }); }
template <typename T> T atomicCAS(T* a, typename emu_same<T>::type c, typename emu_same<T>::type v) {
    return emu_atomic(a, [c, v](T o) { return o == c ? v : o; });
}
// clang-format on

// ----- arithmetic with CUDA's names (the library is built with -ffp-contract=off: no operator is fused)

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __saturatef(float a) { return a < 0.0f ? 0.0f : (a > 1.0f ? 1.0f : (a == a ? a : 0.0f)); }
// The fast-math intrinsics, whose GPU error is documented as bounds, not bits, are the exact functions here
// (glibc declares the __expf family itself, noexcept): a kernel may use them; its test tolerates their error.
inline float __expf(float a) noexcept { return expf(a); }
inline float __logf(float a) noexcept { return logf(a); }
inline float __log2f(float a) noexcept { return log2f(a); }
inline float __sinf(float a) noexcept { return sinf(a); }
inline float __cosf(float a) noexcept { return cosf(a); }
inline float __tanf(float a) noexcept { return tanf(a); }
inline float __powf(float a, float b) noexcept { return powf(a, b); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float a) { return 1.0f / sqrtf(a); }
template <typename T> inline T __ldg(const T* address) { return *address; }  // a read through the read-only cache

template <typename To, typename From>
inline To emu_bits(From from) {
    static_assert(sizeof(To) == sizeof(From), "a reinterpretation keeps the width");
    To to;
    memcpy(&to, &from, sizeof to);
    return to;
}
inline float __uint_as_float(unsigned int x) { return emu_bits<float>(x); }
inline float __int_as_float(int x) { return emu_bits<float>(x); }
inline unsigned int __float_as_uint(float x) { return emu_bits<unsigned int>(x); }
inline int __float_as_int(float x) { return emu_bits<int>(x); }
inline double __longlong_as_double(long long x) { return emu_bits<double>(x); }
inline long long __double_as_longlong(double x) { return emu_bits<long long>(x); }

// CUDA's min and max, for the pairs of types its headers take (mixed ones convert as its headers do)
#define EMU_MIN_MAX(T)                                    \
    inline T min(T a, T b) { return b < a ? b : a; }     \
    inline T max(T a, T b) { return a < b ? b : a; }
EMU_MIN_MAX(int)
EMU_MIN_MAX(unsigned int)
EMU_MIN_MAX(long)
EMU_MIN_MAX(unsigned long)
EMU_MIN_MAX(long long)
EMU_MIN_MAX(unsigned long long)
#undef EMU_MIN_MAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
inline unsigned int min(int a, unsigned int b) { return min(static_cast<unsigned int>(a), b); }
inline unsigned int min(unsigned int a, int b) { return min(a, static_cast<unsigned int>(b)); }
inline unsigned int max(int a, unsigned int b) { return max(static_cast<unsigned int>(a), b); }
inline unsigned int max(unsigned int a, int b) { return max(a, static_cast<unsigned int>(b)); }
inline long long min(int a, long long b) { return min(static_cast<long long>(a), b); }
inline long long min(long long a, int b) { return min(a, static_cast<long long>(b)); }
inline long long max(int a, long long b) { return max(static_cast<long long>(a), b); }
inline long long max(long long a, int b) { return max(a, static_cast<long long>(b)); }

// ----- what autograd/emulator/kernels.py appends after the source for each extern "C" kernel K:
//   extern "C" int emu_launch_K(EmuLaunch* launch, void** args)   runs K with args[i] -> its i-th argument
//   extern "C" void emu_params_K(char* out, size_t size)          K's parameters, from their C++ types
namespace emu {

// One parameter as autograd/emulator/kernels.py checks an argument against it: 'p' (a pointer) or 'v' (a value), then the
// kind of the value or of what the pointer points at ('f' floating, 'i' signed, 'u' unsigned integer,
// 'b' bool, 's' anything else, 'x' void), then its width in bytes: "pf4" is a float*, "vi8" a long long.
template <typename T>
void describe_value(char* out, char pointer_or_value) {
    char kind = std::is_void<T>::value               ? 'x'
                : std::is_same<T, bool>::value       ? 'b'
                : std::is_floating_point<T>::value   ? 'f'
                : std::is_integral<T>::value         ? (std::is_signed<T>::value ? 'i' : 'u')
                                                     : 's';
    size_t width = 0;
    if constexpr (!std::is_void<T>::value) width = sizeof(T);
    out[0] = pointer_or_value;
    out[1] = kind;
    snprintf(out + 2, 16, "%zu,", width);
}
template <typename T>
void describe(char* out) {
    if constexpr (std::is_pointer<T>::value) {
        describe_value<std::remove_cv_t<std::remove_pointer_t<T>>>(out, 'p');
    } else {
        describe_value<T>(out, 'v');
    }
}

template <typename... P>
void params(void (*)(P...), char* out, size_t size) {
    char one[24];
    out[0] = '\0';
    ((describe<P>(one), strncat(out, one, size - strlen(out) - 1)), ...);
}

template <typename... P, size_t... I>
void call(void (*kernel)(P...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<P*>(args[I])...);
}

template <typename... P>
int launch(void (*kernel)(P...), EmuLaunch* l, void** args) {
    struct Call {
        void (*kernel)(P...);
        void** args;
    } c{kernel, args};
    auto body = [](void* context) {
        auto* c = static_cast<Call*>(context);
        call(c->kernel, c->args, std::index_sequence_for<P...>{});
    };
    return emu_run(l, {&threadIdx, &blockIdx, &blockDim, &gridDim}, body, &c);
}

}  // namespace emu

#define EMU_EXPORT extern "C" __attribute__((visibility("default")))
