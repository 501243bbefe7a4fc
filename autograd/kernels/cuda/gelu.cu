// GPT-1's GELU, the tanh approximation of v Phi(v), of v = x + b: x seen as (rows, width) in C order and b the
// bias of the linear layer before it, b[j] added to column j (no bias, a null pointer: v = x; the launcher then
// passes x as one row of all its entries):
//   t = tanh(sqrt(2/pi) (v + 0.044715 v^3)),   y = 0.5 v (1 + t)
//   dx = dy (0.5 (1 + t) + 0.5 v (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 v^2)),   db[j] = sum over rows of dx[row, j]
// The forward keeps only x: the backward computes v and t again, one pass over the entries each way. The math
// is float32 whatever the storage type (the bias is float32: the launcher widens a bfloat16 one); each output is
// rounded to the storage type once. db adds the float32 dx before its rounding, without atomic additions, so
// that a run repeats bit for bit: gelu_backward sums each chunk of rows_per_chunk rows in order as it writes dx,
// and the blocks that finish last add the chunks' sums in a tree fixed by the shapes (partial_sums.cuh).
// Launch (both kernels): grid (ceil(rows / rows_per_chunk), column blocks); one column a thread, its chunk's rows
// in order, the columns in steps of the grid's (gridDim.y blocks of blockDim.x threads).

constexpr float SQRT_2_OVER_PI = 0.7978845608028654f;
constexpr float CUBIC = 0.044715f;

__device__ __forceinline__ float gelu_tanh(float x) { return tanhf(SQRT_2_OVER_PI * (x + CUBIC * (x * x * x))); }

// dy/dv, the slope of y = 0.5 v (1 + t)
__device__ __forceinline__ float gelu_slope(float v) {
    float t = gelu_tanh(v);
    return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * SQRT_2_OVER_PI * (1.0f + 3.0f * CUBIC * v * v);
}

template <typename T>
__device__ void gelu_forward(const T* x, const float* bias, T* out, long long rows, long long width,
                             int rows_per_chunk) {
    long long first = static_cast<long long>(blockIdx.x) * rows_per_chunk;
    long long last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
    for (long long j = first_column(); j < width; j += column_step()) {
        float b = bias ? bias[j] : 0.0f;
        for (long long i = first * width + j; i < last * width; i += width) {
            float v = to_float(x[i]) + b;
            store(out, i, 0.5f * v * (1.0f + gelu_tanh(v)));
        }
    }
}

// scratch, counters and db: as linear.py's partial_sums makes them, or null pointers where db is not wanted.
template <typename T>
__device__ void gelu_backward(const T* x, const float* bias, const T* grad, T* out, float* scratch,
                              unsigned int* counters, float* db, long long rows, long long width, int rows_per_chunk) {
    long long first = static_cast<long long>(blockIdx.x) * rows_per_chunk;
    long long last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;
    for (long long j = first_column(); j < width; j += column_step()) {
        float b = bias ? bias[j] : 0.0f, sum = 0.0f;
        for (long long i = first * width + j; i < last * width; i += width) {
            float dx = to_float(grad[i]) * gelu_slope(to_float(x[i]) + b);
            store(out, i, dx);
            sum += dx;
        }
        if (scratch) scratch[blockIdx.x * width + j] = sum;
    }
    if (scratch) finish_column_blocks(PartialSums{scratch, counters, db}, width);
}

#define GELU(suffix, T)                                                                                         \
    extern "C" __global__ void gelu_forward_##suffix(const T* x, const float* bias, T* out, long long rows,     \
                                                     long long width, int rows_per_chunk) {                     \
        gelu_forward<T>(x, bias, out, rows, width, rows_per_chunk);                                             \
    }                                                                                                           \
    extern "C" __global__ void gelu_backward_##suffix(                                                          \
        const T* x, const float* bias, const T* grad, T* out, float* scratch, unsigned int* counters, float* db, \
        long long rows, long long width, int rows_per_chunk) {                                                  \
        gelu_backward<T>(x, bias, grad, out, scratch, counters, db, rows, width, rows_per_chunk);               \
    }
GELU(f32, float)
GELU(bf16, bf16)
