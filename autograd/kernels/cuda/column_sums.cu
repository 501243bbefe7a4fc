// The sums of the columns of a (rows, width) matrix, in float32 whatever its storage type: a linear layer's
// bias gradient, db[j] = the sum over rows of dy[row, j], read straight from dy's bfloat16 or float32.
// One launch: each block adds its chunk of rows_per_chunk rows of its columns in order into a partial sum,
// then partial_sums.cuh's finish_sums adds the chunks' partial sums in a tree fixed by the shapes.

// Launch: grid (chunks, column blocks), one column a thread, its chunk's rows in order; the columns in steps of
// the grid's (partial_sums.cuh's column_step). scratch, counters, sums: as linear.py's partial_sums makes them.
template <typename T>
__device__ void column_sums(const T* x, float* scratch, unsigned int* counters, float* sums, long long rows,
                            long long width, int rows_per_chunk) {
    long long first = static_cast<long long>(blockIdx.x) * rows_per_chunk;
    long long last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
    for (long long j = first_column(); j < width; j += column_step()) {
        float sum = 0.0f;
        for (long long row = first; row < last; ++row) sum += to_float(x[row * width + j]);
        scratch[blockIdx.x * width + j] = sum;
    }
    finish_column_blocks(PartialSums{scratch, counters, sums}, width);
}

#define COLUMN_SUMS(suffix, T)                                                                                 \
    extern "C" __global__ void column_sums_##suffix(const T* x, float* scratch, unsigned int* counters,         \
                                                    float* sums, long long rows, long long width,              \
                                                    int rows_per_chunk) {                                      \
        column_sums<T>(x, scratch, counters, sums, rows, width, rows_per_chunk);                                \
    }
COLUMN_SUMS(f32, float)
COLUMN_SUMS(bf16, bf16)
