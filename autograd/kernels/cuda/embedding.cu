// The embedding's gather and its deterministic gradient, for a table W (n_rows, dim) and n ids:
//   forward   out[i, c] = W[row(ids[i]), c], rounded once to out's type
//   backward  dW[r, c] = the sum of grad[i, c] over the positions i with row(ids[i]) == r, in float32, added
//             one after another in the order of i (0 where no position picked r), written in W's type
// row(id) is id for an id in [0, n_rows); others wrap around, as CuPy's W[ids] reads them.
// Each kernel is exported as <name>_<read>_<write>: the type it reads (W, or grad) and the one it writes.

constexpr int EMBEDDING_THREADS = 256;  // the most threads a backward block has: one position each per tile
constexpr int ROWS_PER_BLOCK = 8;       // table rows a backward block sums at once
constexpr int COLUMNS_PER_THREAD = 4;   // columns a backward thread keeps sums of per pass over the positions
constexpr int LANES = 32;

__device__ __forceinline__ long long table_row(long long id, long long n_rows) {
    if (id >= 0 && id < n_rows) return id;  // every id of a checked input, without a division
    long long row = id % n_rows;
    return row < 0 ? row + n_rows : row;
}

// Launch: a grid-stride loop over the n * dim entries of out, one entry a thread (consecutive threads
// read consecutive columns of a row).
template <typename R, typename W>
__device__ void embedding_forward(const R* weight, const long long* ids, W* out, long long n, long long n_rows,
                                  long long dim) {
    long long size = n * dim, stride = static_cast<long long>(blockDim.x) * gridDim.x;
    for (long long k = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; k < size; k += stride) {
        long long i = k / dim, c = k % dim;
        store(out, k, to_float(weight[table_row(ids[i], n_rows) * dim + c]));
    }
}

// The positions tile .. tile + blockDim.x - 1 whose ids pick a row first_row .. first_row + ROWS_PER_BLOCK - 1,
// listed in their order into picks[] as (position - tile) * ROWS_PER_BLOCK + (row - first_row); gives their
// count. A thread's place in the list: the picks of the lanes before it in its warp (a prefix sum by
// shuffles), after those of the warps before it. The next call writes warp_counts only after every thread has
// passed this one's second barrier, and picks only after its own first: no barrier needed between the two.
__device__ int list_picks(const long long* ids, long long n, long long n_rows, long long tile, long long first_row,
                          int* picks, int* warp_counts) {
    long long i = tile + threadIdx.x;
    long long offset = i < n ? table_row(ids[i], n_rows) - first_row : -1;
    bool picks_one = offset >= 0 && offset < ROWS_PER_BLOCK;
    int lane = threadIdx.x % LANES, warp = threadIdx.x / LANES, place = picks_one;  // picks of lanes 0..lane
    for (int distance = 1; distance < LANES; distance *= 2) {
        int below = __shfl_up_sync(0xFFFFFFFFu, place, distance);
        if (lane >= distance) place += below;
    }
    if (lane == LANES - 1) warp_counts[warp] = place;
    __syncthreads();
    int count = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x) / LANES; ++w) {
        if (w == warp) place += count;
        count += warp_counts[w];
    }
    if (picks_one) picks[place - 1] = static_cast<int>(threadIdx.x * ROWS_PER_BLOCK + offset);
    __syncthreads();  // the list whole before any thread reads it
    return count;
}

// Launch: blocks of 32 k <= EMBEDDING_THREADS threads, any grid; each block sums ROWS_PER_BLOCK table rows at a
// time (rows first_row.., the grid's blocks in steps). It goes through the positions in tiles of one position a
// thread, in order, lists the tile's positions that picked its rows, and each thread adds their gradients to
// its columns' sums one after another: no sort, no atomics, the same bits on every run. One pass over the
// positions for each blockDim.x * COLUMNS_PER_THREAD columns.
template <typename R, typename W>
__device__ void embedding_backward(const R* grad, const long long* ids, W* out, long long n, long long n_rows,
                                   long long dim) {
    __shared__ int picks[EMBEDDING_THREADS];
    __shared__ int warp_counts[EMBEDDING_THREADS / LANES];
    long long columns_per_pass = static_cast<long long>(blockDim.x) * COLUMNS_PER_THREAD;
    for (long long first_row = static_cast<long long>(blockIdx.x) * ROWS_PER_BLOCK; first_row < n_rows;
         first_row += static_cast<long long>(gridDim.x) * ROWS_PER_BLOCK) {
        for (long long pass = 0; pass < dim; pass += columns_per_pass) {  // every thread: it lists picks
            long long first_column = pass + threadIdx.x;
            float sums[ROWS_PER_BLOCK][COLUMNS_PER_THREAD] = {};
            for (long long tile = 0; tile < n; tile += blockDim.x) {
                int count = list_picks(ids, n, n_rows, tile, first_row, picks, warp_counts);
                for (int p = 0; p < count; ++p) {
                    long long position = tile + picks[p] / ROWS_PER_BLOCK;
                    int picked = picks[p] % ROWS_PER_BLOCK;
#pragma unroll
                    for (int k = 0; k < COLUMNS_PER_THREAD; ++k) {
                        long long c = first_column + k * blockDim.x;
                        float g = c < dim ? to_float(grad[position * dim + c]) : 0.0f;
#pragma unroll
                        for (int r = 0; r < ROWS_PER_BLOCK; ++r)
                            if (r == picked) sums[r][k] += g;  // registers, not an indexed array
                    }
                }
            }
            for (int r = 0; r < ROWS_PER_BLOCK && first_row + r < n_rows; ++r)
                for (int k = 0; k < COLUMNS_PER_THREAD; ++k) {
                    long long c = first_column + k * blockDim.x;
                    if (c < dim) store(out, (first_row + r) * dim + c, sums[r][k]);
                }
        }
    }
}

#define EMBEDDING(read, R, write, W)                                                                         \
    extern "C" __global__ void embedding_forward_##read##_##write(                                           \
        const R* weight, const long long* ids, W* out, long long n, long long n_rows, long long dim) {       \
        embedding_forward<R, W>(weight, ids, out, n, n_rows, dim);                                           \
    }                                                                                                        \
    extern "C" __global__ void __launch_bounds__(EMBEDDING_THREADS) embedding_backward_##read##_##write(     \
        const R* grad, const long long* ids, W* out, long long n, long long n_rows, long long dim) {         \
        embedding_backward<R, W>(grad, ids, out, n, n_rows, dim);                                            \
    }
EMBEDDING(f32, float, f32, float)
EMBEDDING(f32, float, bf16, bf16)
EMBEDDING(bf16, bf16, f32, float)
EMBEDDING(bf16, bf16, bf16, bf16)
