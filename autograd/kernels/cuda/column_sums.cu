// The sums of the columns of a (rows, width) matrix, in float32 whatever its storage type: a linear layer's
// bias gradient, db[j] = the sum over rows of dy[row, j], read straight from dy's bfloat16 or float32.
// Two passes and no atomics, so that a run repeats bit for bit: column_partials sums each chunk of
// rows_per_chunk rows in order into partial[chunk, j], then column_sums adds the chunks' partials in order.

// First pass. Launch: grid (chunks, ceil(width / blockDim.x)); one column a thread, its chunk's rows in order.
template <typename T>
__device__ void column_partials(const T* x, float* partial, long long rows, int width, int rows_per_chunk) {
    int j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= width) return;
    long long first = static_cast<long long>(blockIdx.x) * rows_per_chunk;
    long long last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
    float sum = 0.0f;
    for (long long row = first; row < last; ++row) sum += to_float(x[row * width + j]);
    partial[blockIdx.x * static_cast<long long>(width) + j] = sum;
}

#define COLUMN_PARTIALS(suffix, T)                                                                          \
    extern "C" __global__ void column_partials_##suffix(const T* x, float* partial, long long rows, int width, \
                                                        int rows_per_chunk) {                               \
        column_partials<T>(x, partial, rows, width, rows_per_chunk);                                        \
    }
COLUMN_PARTIALS(f32, float)
COLUMN_PARTIALS(bf16, bf16)

// Second pass: sums[j] = the sum of partial[c, j] over the chunks c in order.
// Launch: a grid-stride loop, one column per thread per step.
extern "C" __global__ void column_sums_f32(const float* partial, float* sums, int chunks, int width) {
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < width; j += blockDim.x * gridDim.x) {
        float sum = 0.0f;
        for (long long c = 0; c < chunks; ++c) sum += partial[c * width + j];
        sums[j] = sum;
    }
}
