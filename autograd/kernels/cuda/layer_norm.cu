// Layer norm over the last axis of x, seen as (rows, width) in C order:
//   forward   mean = sum(x) / D,   rstd = 1 / sqrt(sum((x - mean)^2) / D + eps),   n = (x - mean) rstd,
//             y = n w + b
//   backward  g = dy w,   dx = rstd (g - sum(g) / D - n sum(g n) / D),
//             dw = sum over rows of dy n,   db = sum over rows of dy
// w and b are float32 and either may be absent (a null pointer: y = n without w, no + b without b).
// The math is float32 whatever x's storage type; y and dx are rounded to it once. The forward keeps mean
// and rstd (float32, one of each per row); the backward computes n again from x with them, rather than
// keeping a float32 copy of n as the reference does.
// Every sum runs in an order fixed by the shapes alone (no atomics): a run repeats bit for bit.

constexpr int WARP = 32;
constexpr int WARP_PER_THREAD = 32;   // entries of a row a lane holds in registers: rows up to 1024 wide
constexpr int BLOCK_THREADS = 1024;   // the most threads a block per row has
constexpr int BLOCK_PER_THREAD = 16;  // entries a thread holds: rows up to 16384 wide (wider ones: the reference)

// The sum of v over the 32 lanes of a warp, in every lane (a butterfly: the same bits in each lane).
__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = WARP / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
    return v;
}

// The sum of v over the threads of a block (a multiple of 32 of them), in every thread.
__device__ float block_sum(float v) {
    __shared__ float warp_sums[WARP];
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, warps = blockDim.x / WARP;
    v = warp_sum(v);
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    v = warp_sum(lane < warps ? warp_sums[lane] : 0.0f);
    __syncthreads();  // every warp has read warp_sums before the next call writes them
    return v;
}

// The threads that share a row: thread `rank` of `size` holds entries rank, rank + size, ... in registers.
struct Warp {  // a warp per row
    int rank, size;
    __device__ float sum(float v) const { return warp_sum(v); }
};
struct Block {  // a block per row, for rows too wide for a warp's registers
    int rank, size;
    __device__ float sum(float v) const { return block_sum(v); }
};

// One row of the forward: x, y point at the row; mean, rstd at its statistics.
template <typename T, int PER_THREAD, typename Group>
__device__ void normalise_row(const Group& group, const T* x, const float* w, const float* b, T* y, float* mean,
                              float* rstd, int width, float eps) {
    float v[PER_THREAD], sum = 0.0f, squares = 0.0f;
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
        int j = group.rank + k * group.size;
        v[k] = j < width ? to_float(x[j]) : 0.0f;
        sum += v[k];
    }
    float row_mean = group.sum(sum) / width;
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
        float centered = group.rank + k * group.size < width ? v[k] - row_mean : 0.0f;
        squares += centered * centered;
    }
    float row_rstd = 1.0f / sqrtf(group.sum(squares) / width + eps);
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
        int j = group.rank + k * group.size;
        if (j < width) {
            float out = (v[k] - row_mean) * row_rstd;
            if (w) out *= w[j];
            if (b) out += b[j];
            store(y, j, out);
        }
    }
    if (group.rank == 0) {
        *mean = row_mean;
        *rstd = row_rstd;
    }
}

// One row of dx: x, dy, dx point at the row; n is computed again from the row's mean and rstd.
template <typename T, int PER_THREAD, typename Group>
__device__ void row_gradient(const Group& group, const T* x, const T* dy, const float* w, float mean, float rstd,
                             T* dx, int width) {
    float n[PER_THREAD], g[PER_THREAD], sum_g = 0.0f, sum_gn = 0.0f;
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
        int j = group.rank + k * group.size;
        n[k] = j < width ? (to_float(x[j]) - mean) * rstd : 0.0f;
        g[k] = j < width ? to_float(dy[j]) : 0.0f;
        if (w && j < width) g[k] *= w[j];
        sum_g += g[k];
        sum_gn += g[k] * n[k];
    }
    float mean_g = group.sum(sum_g) / width, mean_gn = group.sum(sum_gn) / width;
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
        int j = group.rank + k * group.size;
        if (j < width) store(dx, j, (g[k] - mean_g - n[k] * mean_gn) * rstd);
    }
}

// The forward and dx, a warp per row. Launch: blocks of 32 k threads; the grid's warp w takes row w.
template <typename T>
__device__ void forward_warps(const T* x, const float* w, const float* b, T* y, float* mean, float* rstd,
                              long long rows, int width, float eps) {
    long long row = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / WARP;
    if (row >= rows) return;  // the whole warp leaves: its shuffles never miss a lane
    Warp group{static_cast<int>(threadIdx.x % WARP), WARP};
    long long at = row * width;
    normalise_row<T, WARP_PER_THREAD>(group, x + at, w, b, y + at, mean + row, rstd + row, width, eps);
}

template <typename T>
__device__ void backward_warps(const T* x, const T* dy, const float* w, const float* mean, const float* rstd,
                               T* dx, long long rows, int width) {
    long long row = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / WARP;
    if (row >= rows) return;
    Warp group{static_cast<int>(threadIdx.x % WARP), WARP};
    long long at = row * width;
    row_gradient<T, WARP_PER_THREAD>(group, x + at, dy + at, w, mean[row], rstd[row], dx + at, width);
}

// The forward and dx, a block per row. Launch: blocks of 32 k <= BLOCK_THREADS threads, with
// 32 k BLOCK_PER_THREAD >= width; block i takes rows i, i + gridDim.x, ...
template <typename T>
__device__ void forward_blocks(const T* x, const float* w, const float* b, T* y, float* mean, float* rstd,
                               long long rows, int width, float eps) {
    Block group{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)};
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        long long at = row * width;
        normalise_row<T, BLOCK_PER_THREAD>(group, x + at, w, b, y + at, mean + row, rstd + row, width, eps);
    }
}

template <typename T>
__device__ void backward_blocks(const T* x, const T* dy, const float* w, const float* mean, const float* rstd,
                                T* dx, long long rows, int width) {
    Block group{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)};
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        long long at = row * width;
        row_gradient<T, BLOCK_PER_THREAD>(group, x + at, dy + at, w, mean[row], rstd[row], dx + at, width);
    }
}

// dw and db, first pass: block (chunk, column block) sums rows chunk * rows_per_chunk, ... (in order, one
// column a thread) into partial_w[chunk, j] = sum dy n and partial_b[chunk, j] = sum dy.
// Launch: grid (chunks, ceil(width / blockDim.x)).
template <typename T>
__device__ void column_partials(const T* x, const T* dy, const float* mean, const float* rstd, float* partial_w,
                                float* partial_b, long long rows, int width, int rows_per_chunk) {
    int j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= width) return;
    long long first = static_cast<long long>(blockIdx.x) * rows_per_chunk;
    long long last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
    float sum_w = 0.0f, sum_b = 0.0f;
    for (long long row = first; row < last; ++row) {
        float d = to_float(dy[row * width + j]);
        sum_w += d * ((to_float(x[row * width + j]) - mean[row]) * rstd[row]);
        sum_b += d;
    }
    partial_w[blockIdx.x * static_cast<long long>(width) + j] = sum_w;
    partial_b[blockIdx.x * static_cast<long long>(width) + j] = sum_b;
}

#define LAYER_NORM(suffix, T)                                                                                    \
    extern "C" __global__ void layer_norm_forward_warps_##suffix(                                                \
        const T* x, const float* w, const float* b, T* y, float* mean, float* rstd, long long rows, int width,   \
        float eps) {                                                                                             \
        forward_warps<T>(x, w, b, y, mean, rstd, rows, width, eps);                                              \
    }                                                                                                            \
    extern "C" __global__ void layer_norm_backward_warps_##suffix(                                               \
        const T* x, const T* dy, const float* w, const float* mean, const float* rstd, T* dx, long long rows,    \
        int width) {                                                                                             \
        backward_warps<T>(x, dy, w, mean, rstd, dx, rows, width);                                                \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(BLOCK_THREADS) layer_norm_forward_blocks_##suffix(              \
        const T* x, const float* w, const float* b, T* y, float* mean, float* rstd, long long rows, int width,   \
        float eps) {                                                                                             \
        forward_blocks<T>(x, w, b, y, mean, rstd, rows, width, eps);                                             \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(BLOCK_THREADS) layer_norm_backward_blocks_##suffix(             \
        const T* x, const T* dy, const float* w, const float* mean, const float* rstd, T* dx, long long rows,    \
        int width) {                                                                                             \
        backward_blocks<T>(x, dy, w, mean, rstd, dx, rows, width);                                               \
    }                                                                                                            \
    extern "C" __global__ void layer_norm_column_partials_##suffix(                                              \
        const T* x, const T* dy, const float* mean, const float* rstd, float* partial_w, float* partial_b,       \
        long long rows, int width, int rows_per_chunk) {                                                         \
        column_partials<T>(x, dy, mean, rstd, partial_w, partial_b, rows, width, rows_per_chunk);                \
    }
LAYER_NORM(f32, float)
LAYER_NORM(bf16, bf16)

// dw and db, second pass: dw[j] = the sum of partial_w[c, j] over the chunks c in order, db[j] likewise.
// Launch: a grid-stride loop, one column per thread per step. The partials are float32 whatever x's type.
extern "C" __global__ void layer_norm_column_sums_f32(const float* partial_w, const float* partial_b, float* dw,
                                                      float* db, int chunks, int width) {
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < width; j += blockDim.x * gridDim.x) {
        float sum_w = 0.0f, sum_b = 0.0f;
        for (long long c = 0; c < chunks; ++c) {
            sum_w += partial_w[c * width + j];
            sum_b += partial_b[c * width + j];
        }
        dw[j] = sum_w;
        db[j] = sum_b;
    }
}
