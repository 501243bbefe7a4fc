// Layer norm over the last axis of h, seen as (rows, width) in C order:
//   forward   mean = sum(h) / D,   rstd = 1 / sqrt(sum((h - mean)^2) / D + eps),   n = (h - mean) rstd,
//             out = n w + b
//   backward  g = dout w,   dh = rstd (g - sum(g) / D - n sum(g n) / D),
//             dw = sum over rows of dout n,   db = sum over rows of dout
// The plain kernels (layer_norm_*) normalise h = x. The residual kernels (residual_layer_norm_*) end a
// post-LN sublayer in one pass: h = x + dropout(y + bias), the dropout's mask drawn in the kernel as
// common.cuh draws it (threshold 0: no dropout), and back dx = dh, dy = dropout(dh) with the same mask, and
// dbias = sum over rows of dy beside dw and db.
// w, b and bias are float32 and any may be absent (a null pointer: out = n without w, no + b without b).
// The math is float32 whatever the storage type; outputs are rounded to it once. The forward keeps mean and
// rstd (float32, one of each per row); the backward computes h and n again from its inputs with them,
// rather than keeping a float32 copy of n as the reference does.
// The backward kernels sum the columns as they go: each warp (or block) takes a chunk of rows_per_chunk rows in
// order and writes its sums of dout n, dout (and dy) into the scratch's row of its chunk [sum, j]; the blocks
// that finish last add the chunks' rows in a tree (partial_sums.cuh).
// Every sum runs in an order fixed by the shapes alone (no atomic additions): a run repeats bit for bit.

constexpr int WARP = 32;
constexpr int WARP_PER_THREAD = 32;   // entries of a row a lane holds in registers: rows up to 1024 wide
constexpr int BLOCK_THREADS = 1024;   // the most threads a block per row has
constexpr int WARPS_THREADS = FAN_IN * WARP;  // the most a backward block of a warp per chunk has
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

// What a kernel normalises, row by row. Plain: h = x. Its backward writes dx = dh.
template <typename T>
struct Plain {
    const T* x;
    T* dx;
    int width;
    __device__ float h(long long row, int j) const { return to_float(x[row * width + j]); }
    __device__ float store_gradient(long long row, int j, float dh) const {  // gives what dbias adds: none
        store(dx, row * width + j, dh);
        return 0.0f;
    }
};

// Residual: h = x + dropout(y + bias). Its backward writes dx = dh and dy = dropout(dh).
template <typename T>
struct Residual {
    const T *x, *y;
    const float* bias;
    T *dx, *dy;
    int width;
    MaskKey key;
    long long rows_per_example;  // the mask's example of row r is r / rows_per_example
    unsigned int first_example;
    float scale;  // 1 / (1 - p)

    __device__ bool kept(long long row, int j) const {
        if (key.threshold == 0) return true;
        unsigned long long at = static_cast<unsigned long long>(row % rows_per_example) * width + j;
        return dropout_keeps(key, first_example + static_cast<unsigned int>(row / rows_per_example), at);
    }
    __device__ float h(long long row, int j) const {
        float branch = to_float(y[row * width + j]) + (bias ? bias[j] : 0.0f);
        return to_float(x[row * width + j]) + (kept(row, j) ? branch * scale : 0.0f);
    }
    __device__ float store_gradient(long long row, int j, float dh) const {  // gives dy as stored, for dbias
        store(dx, row * width + j, dh);
        store(dy, row * width + j, kept(row, j) ? dh * scale : 0.0f);
        return to_float(dy[row * width + j]);
    }
};

// One row of the forward: out points at the row, mean and rstd at its statistics.
template <typename T, int PER_THREAD, typename Group, typename Source>
__device__ void normalise_row(const Group& group, const Source& source, long long row, const float* w,
                              const float* b, T* out, float* mean, float* rstd, int width, float eps) {
    float v[PER_THREAD], sum = 0.0f, squares = 0.0f;
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
        int j = group.rank + k * group.size;
        v[k] = j < width ? source.h(row, j) : 0.0f;
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
            float value = (v[k] - row_mean) * row_rstd;
            if (w) value *= w[j];
            if (b) value += b[j];
            store(out, j, value);
        }
    }
    if (group.rank == 0) {
        *mean = row_mean;
        *rstd = row_rstd;
    }
}

// One row of dh, handed to the source to store: dout points at the row, and dout2 (or null) at a second
// gradient of the output, added to it in T as the engine would add them; n is computed again from h. Each
// thread adds its columns' dout n, dout and stored dy to its sums over the rows of its chunk.
template <typename T, int PER_THREAD, typename Group, typename Source>
__device__ void row_gradient(const Group& group, const Source& source, long long row, const T* dout,
                             const T* dout2, const float* w, float mean, float rstd, int width,
                             float sums[3][PER_THREAD]) {
    float n[PER_THREAD], d[PER_THREAD], sum_g = 0.0f, sum_gn = 0.0f;
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
        int j = group.rank + k * group.size;
        n[k] = j < width ? (source.h(row, j) - mean) * rstd : 0.0f;
        d[k] = j < width ? to_float(dout[j]) : 0.0f;
        if (dout2 && j < width) d[k] = rounded<T>(d[k] + to_float(dout2[j]));
        float g = w && j < width ? d[k] * w[j] : d[k];
        sum_g += g;
        sum_gn += g * n[k];
    }
    float mean_g = group.sum(sum_g) / width, mean_gn = group.sum(sum_gn) / width;
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
        int j = group.rank + k * group.size;
        if (j < width) {
            float g = w ? d[k] * w[j] : d[k];
            sums[2][k] += source.store_gradient(row, j, (g - mean_g - n[k] * mean_gn) * rstd);
            sums[0][k] += d[k] * n[k];
            sums[1][k] += d[k];
        }
    }
}

// The sums of a chunk's rows into partial[chunk]: dout n, dout, and with `dy` dy, each `width` apart.
template <int PER_THREAD, typename Group>
__device__ void write_partials(const Group& group, float* partial, int width, bool dy, float sums[3][PER_THREAD]) {
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
        int j = group.rank + k * group.size;
        if (j < width) {
            partial[j] = sums[0][k];
            partial[width + j] = sums[1][k];
            if (dy) partial[2 * width + j] = sums[2][k];
        }
    }
}

// The forward, a warp per row. Launch: blocks of 32 k threads; the grid's warp w takes row w.
template <typename T, typename Source>
__device__ void forward_warps(const Source& source, const float* w, const float* b, T* out, float* mean,
                              float* rstd, long long rows, int width, float eps) {
    long long row = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / WARP;
    if (row >= rows) return;  // the whole warp leaves: its shuffles never miss a lane
    Warp group{static_cast<int>(threadIdx.x % WARP), WARP};
    normalise_row<T, WARP_PER_THREAD>(group, source, row, w, b, out + row * width, mean + row, rstd + row,
                                      width, eps);
}

// dh of one chunk of rows, rows_per_chunk from chunk * rows_per_chunk, in order, by the threads of `group`,
// and their column sums into row `chunk` of partial (sums of them: 2, or 3 with a dy).
template <typename T, int PER_THREAD, typename Group, typename Source>
__device__ void backward_chunk(const Group& group, const Source& source, long long chunk, const T* dout,
                               const T* dout2, const float* w, const float* mean, const float* rstd, float* partial,
                               int sums, long long rows, int width, int rows_per_chunk) {
    long long first = chunk * rows_per_chunk;
    long long last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
    float column_sums[3][PER_THREAD] = {};
    for (long long row = first; row < last; ++row) {
        const T* second = dout2 ? dout2 + row * width : nullptr;
        row_gradient<T, PER_THREAD>(group, source, row, dout + row * width, second, w, mean[row], rstd[row], width,
                                    column_sums);
    }
    write_partials<PER_THREAD>(group, partial + chunk * sums * width, width, sums == 3, column_sums);
}

// The backward, a warp per chunk of rows. Launch: blocks of 32 k threads, k dividing FAN_IN (a block's chunks lie
// in one group of the tree); the grid's warp c takes chunk c.
template <typename T, typename Source>
__device__ void backward_warps(const Source& source, const T* dout, const T* dout2, const float* w,
                               const float* mean, const float* rstd, PartialSums to, int sums, long long rows,
                               int width, int rows_per_chunk) {
    long long chunks = (rows + rows_per_chunk - 1) / rows_per_chunk, warps = blockDim.x / WARP;
    long long first = blockIdx.x * warps, chunk = first + threadIdx.x / WARP;
    if (chunk < chunks) {  // a whole warp or none: its shuffles never miss a lane
        Warp group{static_cast<int>(threadIdx.x % WARP), WARP};
        backward_chunk<T, WARP_PER_THREAD>(group, source, chunk, dout, dout2, w, mean, rstd, to.scratch, sums, rows,
                                           width, rows_per_chunk);
    }
    unsigned int written = static_cast<unsigned int>(chunks - first < warps ? chunks - first : warps);
    finish_sums(to, chunks, sums * width, first, written, threadIdx.x, blockDim.x);
}

// The forward, a block per row, and the backward, a block per chunk of rows. Launch: blocks of
// 32 k <= BLOCK_THREADS threads, with 32 k BLOCK_PER_THREAD >= width; block i takes rows (chunks) i,
// i + gridDim.x, ...
template <typename T, typename Source>
__device__ void forward_blocks(const Source& source, const float* w, const float* b, T* out, float* mean,
                               float* rstd, long long rows, int width, float eps) {
    Block group{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)};
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        normalise_row<T, BLOCK_PER_THREAD>(group, source, row, w, b, out + row * width, mean + row, rstd + row,
                                           width, eps);
    }
}

template <typename T, typename Source>
__device__ void backward_blocks(const Source& source, const T* dout, const T* dout2, const float* w,
                                const float* mean, const float* rstd, PartialSums to, int sums, long long rows,
                                int width, int rows_per_chunk) {
    Block group{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)};
    long long chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
    for (long long chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
        backward_chunk<T, BLOCK_PER_THREAD>(group, source, chunk, dout, dout2, w, mean, rstd, to.scratch, sums, rows,
                                            width, rows_per_chunk);
        finish_sums(to, chunks, sums * width, chunk, 1, threadIdx.x, blockDim.x);
    }
}

// The backward kernels' column sums: partial_sums.cuh's scratch, counters and sums.
#define SUMS_PARAMETERS float *scratch, unsigned int *counters, float *totals
#define SUMS PartialSums{scratch, counters, totals}

// Each kernel below comes in two layouts (forward_warps or forward_blocks, and so on), bounded by its most threads,
// and two types: KERNEL(layer_norm_forward, warps, f32) names layer_norm_forward_warps_f32.
#define THREADS_warps WARPS_THREADS
#define THREADS_blocks BLOCK_THREADS
#define KERNEL(name, layout, suffix) \
    extern "C" __global__ void __launch_bounds__(THREADS_##layout) name##_##layout##_##suffix

#define LAYER_NORM(layout, suffix, T)                                                                                  \
    KERNEL(layer_norm_forward, layout, suffix)(const T* x, const float* w, const float* b, T* out, float* mean,        \
                                               float* rstd, long long rows, int width, float eps) {                    \
        forward_##layout<T>(Plain<T>{x, nullptr, width}, w, b, out, mean, rstd, rows, width, eps);                     \
    }                                                                                                                  \
    KERNEL(layer_norm_backward, layout, suffix)(const T* x, const T* dout, const float* w, const float* mean,          \
                                                const float* rstd, T* dx, SUMS_PARAMETERS, long long rows,             \
                                                int width, int rows_per_chunk) {                                       \
        backward_##layout<T>(Plain<T>{x, dx, width}, dout, nullptr, w, mean, rstd, SUMS, 2, rows, width,               \
                             rows_per_chunk);                                                                          \
    }
LAYER_NORM(warps, f32, float)
LAYER_NORM(warps, bf16, bf16)
LAYER_NORM(blocks, f32, float)
LAYER_NORM(blocks, bf16, bf16)

// The residual kernels take, after their own arguments, the dropout's mask: its key (common.cuh), the rows
// of one example and the scale 1 / (1 - p).
#define MASK_PARAMETERS                                                                                                \
    unsigned long long seed, unsigned int step, unsigned int site, unsigned int first_example,                         \
        unsigned int threshold, long long rows_per_example, float scale
#define RESIDUAL(T, x, y, bias, dx, dy)                                                                                \
    Residual<T>{x, y, bias, dx, dy, width, MaskKey{seed, step, site, threshold}, rows_per_example,                     \
                first_example, scale}

#define RESIDUAL_LAYER_NORM(layout, suffix, T)                                                                         \
    KERNEL(residual_layer_norm_forward, layout, suffix)(const T* x, const T* y, const float* bias, const float* w,     \
                                                        const float* b, T* out, float* mean, float* rstd,              \
                                                        long long rows, int width, float eps, MASK_PARAMETERS) {       \
        forward_##layout<T>(RESIDUAL(T, x, y, bias, nullptr, nullptr), w, b, out, mean, rstd, rows, width, eps);       \
    }                                                                                                                  \
    KERNEL(residual_layer_norm_backward, layout, suffix)(                                                              \
        const T* x, const T* y, const float* bias, const T* dout, const T* dout2, const float* w,                      \
        const float* mean, const float* rstd, T* dx, T* dy, SUMS_PARAMETERS, long long rows, int width,                \
        int rows_per_chunk, MASK_PARAMETERS) {                                                                         \
        backward_##layout<T>(RESIDUAL(T, x, y, bias, dx, dy), dout, dout2, w, mean, rstd, SUMS, 3, rows, width,        \
                             rows_per_chunk);                                                                          \
    }
RESIDUAL_LAYER_NORM(warps, f32, float)
RESIDUAL_LAYER_NORM(warps, bf16, bf16)
RESIDUAL_LAYER_NORM(blocks, f32, float)
RESIDUAL_LAYER_NORM(blocks, bf16, bf16)
