// Cross-entropy fused with log-softmax, one row of logits z (C classes) at its target t per block:
//   forward   m = max z,  s = log sum_j exp(z_j - m),  loss = s - (z_t - m)   (0 where t == ignore_index)
//   backward  dz_j = (exp((z_j - m) - s) - [j == t]) * dloss                  (0 rows where ignored)
// reduced to the losses' sum, or their mean over the rows counted (the sum over max(count, 1)); its gradient
// reaches each counted row as dloss = dtotal / that divisor.
// The log-sum-exp m + s goes from the forward to the backward as its two float32 parts, as the reference
// computes with them (m + s rounded to one float would lose up to half an ulp of a large m in every
// probability): two floats per row, no array the size of the logits. The sums are float32 whatever the
// logits' storage; the losses are float32, the gradient in z's type.

// The maximum (Max) or the sum of one float per thread over the whole block, handed to every thread: a
// tree within each warp, then one over the warps' results, always in the same order, so a row's result
// repeats bit for bit. blockDim.x is a multiple of 32 (at most 1024); `shared` holds 33 floats.
template <bool Max>
__device__ float block_reduce(float value, float* shared) {
    const float identity = Max ? bits_to_float(0xFF800000u) : 0.0f;  // -infinity for the maximum
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int offset = 16; offset > 0; offset /= 2) {
        float other = __shfl_down_sync(0xFFFFFFFFu, value, offset);
        value = Max ? fmaxf(value, other) : value + other;
    }
    if (lane == 0) shared[warp] = value;
    __syncthreads();
    if (warp == 0) {
        value = lane < static_cast<int>(blockDim.x / 32) ? shared[lane] : identity;
        for (int offset = 16; offset > 0; offset /= 2) {
            float other = __shfl_down_sync(0xFFFFFFFFu, value, offset);
            value = Max ? fmaxf(value, other) : value + other;
        }
        if (lane == 0) shared[32] = value;
    }
    __syncthreads();
    float result = shared[32];
    __syncthreads();  // every thread has read it before `shared` is used again
    return result;
}

// A target outside [0, C) read as CuPy's indexing reads it, wrapped around: targets already on the GPU are
// not checked (that would make the host wait), and a kernel must not read past the row.
__device__ __forceinline__ long long wrapped(long long t, long long n) { return ((t % n) + n) % n; }

// Launch: one block per row (grid = rows), the block's threads striding over the row's C classes: first
// the row's maximum m, then the sum of exp(z_j - m), each reduced by block_reduce; thread 0 writes
// losses[row] = s - (z_t - m) with s = log(sum), and m and s for the backward.
template <typename T>
__device__ void cross_entropy_forward(const T* logits, const long long* targets, float* losses, float* maxima,
                                      float* log_sums, long long n_classes, long long ignore_index) {
    __shared__ float shared[33];
    long long row = blockIdx.x;
    const T* z = logits + row * n_classes;
    float row_max = bits_to_float(0xFF800000u);
    for (long long j = threadIdx.x; j < n_classes; j += blockDim.x) row_max = fmaxf(row_max, to_float(z[j]));
    row_max = block_reduce<true>(row_max, shared);
    float sum = 0.0f;
    for (long long j = threadIdx.x; j < n_classes; j += blockDim.x) sum += expf(to_float(z[j]) - row_max);
    float log_sum = logf(block_reduce<false>(sum, shared));
    if (threadIdx.x == 0) {
        long long t = targets[row];
        losses[row] = t == ignore_index ? 0.0f : log_sum - (to_float(z[wrapped(t, n_classes)]) - row_max);
        maxima[row] = row_max;
        log_sums[row] = log_sum;
    }
}

// Launch: one block (of 32 k threads) striding over the rows: the losses' sum and the count of the rows counted,
// each by block_reduce; thread 0 writes the total, sum / divisor, and the divisor (max(count, 1) for a mean,
// else 1) for the backward. The count is exact as a float up to 2^24 rows.
extern "C" __global__ void cross_entropy_reduce_f32(const float* losses, const long long* targets, float* total,
                                                    float* divisor, long long rows, long long ignore_index,
                                                    int mean) {
    __shared__ float shared[33];
    float sum = 0.0f, count = 0.0f;
    for (long long row = threadIdx.x; row < rows; row += blockDim.x) {
        sum += losses[row];
        count += targets[row] != ignore_index ? 1.0f : 0.0f;
    }
    sum = block_reduce<false>(sum, shared);
    count = block_reduce<false>(count, shared);
    if (threadIdx.x == 0) {
        float by = mean ? fmaxf(count, 1.0f) : 1.0f;
        *total = sum / by;
        *divisor = by;
    }
}

// Launch: one block per row (grid = rows), the block's threads striding over the row's C classes, each
// writing dz_j = exp((z_j - m) - s) * w, less w at the target, with w = dloss[row] (0 where ignored), or
// w = dtotal / divisor for a reduced loss (divisor not null, grad one number).
template <typename T>
__device__ void cross_entropy_backward(const T* logits, const long long* targets, const float* maxima,
                                       const float* log_sums, const float* grad, const float* divisor, T* out,
                                       long long n_classes, long long ignore_index) {
    long long row = blockIdx.x;
    long long t = targets[row];
    bool counted = t != ignore_index;
    float weight = !counted ? 0.0f : divisor ? grad[0] / *divisor : grad[row];
    long long target = counted ? wrapped(t, n_classes) : -1;
    float row_max = maxima[row], log_sum = log_sums[row];
    for (long long j = threadIdx.x; j < n_classes; j += blockDim.x) {
        float g = expf((to_float(logits[row * n_classes + j]) - row_max) - log_sum) * weight;
        store(out, row * n_classes + j, j == target ? g - weight : g);
    }
}

#define CROSS_ENTROPY(suffix, T)                                                                             \
    extern "C" __global__ void cross_entropy_forward_##suffix(const T* logits, const long long* targets,     \
                                                              float* losses, float* maxima, float* log_sums, \
                                                              long long n_classes, long long ignore_index) { \
        cross_entropy_forward<T>(logits, targets, losses, maxima, log_sums, n_classes, ignore_index);        \
    }                                                                                                        \
    extern "C" __global__ void cross_entropy_backward_##suffix(                                              \
        const T* logits, const long long* targets, const float* maxima, const float* log_sums,               \
        const float* grad, const float* divisor, T* out, long long n_classes, long long ignore_index) {      \
        cross_entropy_backward<T>(logits, targets, maxima, log_sums, grad, divisor, out, n_classes,          \
                                  ignore_index);                                                             \
    }
CROSS_ENTROPY(f32, float)
CROSS_ENTROPY(bf16, bf16)
