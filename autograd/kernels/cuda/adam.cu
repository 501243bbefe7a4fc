// Adam and global-norm gradient clipping over all of a model's parameters in a few launches
// (autograd/kernels/adam.py). The tensors are many and of every size, so each kernel reads a table of
// their device pointers and cuts them into chunks of `chunk` numbers: block b takes chunk b, the
// numbers [chunk_start[b], chunk_start[b] + chunk) of tensor chunk_tensor[b] (fewer at a tensor's end),
// and its threads take every blockDim.x-th of them. Parameters, gradients and moments are float32 (the
// master weights, under bf16 too), so each kernel has its float32 entry only; under bf16 Adam also writes
// the bfloat16 copy a parameter keeps for the products (autograd/precision.py's kept_cast).
//
// The arithmetic is that of autograd/optim.py's whole-array code, one rounding per operator in the same
// order: the _rn intrinsics are never fused into FMAs, so the numbers are its numbers.

#define CLIP_THREADS 256  // the clipping kernels' blocks (launching.THREADS): their tree sums halve from here

struct Chunk {
    int tensor;
    long long begin, end;
};

__device__ __forceinline__ Chunk chunk_of_block(const long long* sizes, const int* chunk_tensor,
                                                const long long* chunk_start, long long chunk) {
    Chunk c;
    c.tensor = chunk_tensor[blockIdx.x];
    c.begin = chunk_start[blockIdx.x];
    c.end = c.begin + chunk < sizes[c.tensor] ? c.begin + chunk : sizes[c.tensor];
    return c;
}

// One Adam step of every parameter with a gradient (grads[t] == 0: none, the tensor is left alone).
//   coupled:    g += l2 p (where l2_decays);  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g g
//               p -= (m / (sqrt(v) / root + eps)) * step_size,  root = sqrt(1 - b2^t), step_size = lr / (1 - b1^t)
//   decoupled:  m, v as above;  p -= (m / (sqrt(v) + eps) + l2 p (where l2_decays)) * step_size,
//               step_size = lr sqrt(1 - b2^t) / (1 - b1^t)
// l2_decays is l2_matrices for tensors of two or more dimensions, l2_vectors for the others.
// copies[t]: the bfloat16 copy of parameter t (0: none), written with the new p, rounded as astype does.
// Layout: block b updates chunk b (see the top of the file), a thread every blockDim.x-th number of it.
extern "C" __global__ void adam_step_f32(const unsigned long long* params, const unsigned long long* grads,
                                         const unsigned long long* ms, const unsigned long long* vs,
                                         const unsigned long long* copies, const long long* sizes, const int* ndims,
                                         const int* chunk_tensor, const long long* chunk_start, long long chunk,
                                         float b1, float one_minus_b1, float b2, float one_minus_b2, float eps,
                                         float l2, float step_size, float root, int coupled, int l2_matrices,
                                         int l2_vectors) {
    Chunk c = chunk_of_block(sizes, chunk_tensor, chunk_start, chunk);
    if (grads[c.tensor] == 0) return;
    float* p = reinterpret_cast<float*>(params[c.tensor]);
    const float* grad = reinterpret_cast<const float*>(grads[c.tensor]);
    float* m = reinterpret_cast<float*>(ms[c.tensor]);
    float* v = reinterpret_cast<float*>(vs[c.tensor]);
    bf16* copy = reinterpret_cast<bf16*>(copies[c.tensor]);
    bool decays = ndims[c.tensor] > 1 ? l2_matrices : l2_vectors;
    for (long long i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
        float w = p[i], g = grad[i];
        if (coupled && decays) g = __fadd_rn(g, __fmul_rn(l2, w));
        float mi = __fadd_rn(__fmul_rn(m[i], b1), __fmul_rn(one_minus_b1, g));
        float vi = __fadd_rn(__fmul_rn(v[i], b2), __fmul_rn(__fmul_rn(one_minus_b2, g), g));
        m[i] = mi;
        v[i] = vi;
        float update;
        if (coupled) {
            update = __fdiv_rn(mi, __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), root), eps));
        } else {
            update = __fdiv_rn(mi, __fadd_rn(__fsqrt_rn(vi), eps));
            if (decays) update = __fadd_rn(update, __fmul_rn(l2, w));
        }
        float updated = __fsub_rn(w, __fmul_rn(update, step_size));
        p[i] = updated;
        if (copy) store(copy, i, updated);
    }
}

// The first pass of the global norm: partials[b] = the sum of g^2 over chunk b.
// Layout: block b (CLIP_THREADS threads) takes chunk b; each thread adds its every blockDim.x-th square
// in order, then the threads' sums are added pairwise in shared memory, halving each time (a fixed order).
extern "C" __global__ void chunk_squares_f32(const unsigned long long* grads, const long long* sizes,
                                             const int* chunk_tensor, const long long* chunk_start, long long chunk,
                                             float* partials) {
    __shared__ float sums[CLIP_THREADS];
    Chunk c = chunk_of_block(sizes, chunk_tensor, chunk_start, chunk);
    const float* grad = reinterpret_cast<const float*>(grads[c.tensor]);
    float sum = 0.0f;
    for (long long i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) sum = __fadd_rn(sum, __fmul_rn(grad[i], grad[i]));
    sums[threadIdx.x] = sum;
    __syncthreads();
    for (unsigned half = CLIP_THREADS / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) sums[threadIdx.x] = __fadd_rn(sums[threadIdx.x], sums[threadIdx.x + half]);
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[blockIdx.x] = sums[0];
}

// The second pass: norm = sqrt(sum of the partials), and the clip factor of clip_grad_norm,
// scale = min(max_norm / (norm + 1e-6), 1), in float32 (a NaN norm gives a NaN factor, as there).
// Layout: one block of CLIP_THREADS threads; thread j adds partials j, j + blockDim.x, ... in order (in
// double), then a tree in shared memory as above; thread 0 writes norm[0] and scale[0].
extern "C" __global__ void clip_factor_f32(const float* partials, long long n_chunks, float max_norm, float* norm,
                                           float* scale) {
    __shared__ double sums[CLIP_THREADS];
    double sum = 0.0;
    for (long long b = threadIdx.x; b < n_chunks; b += blockDim.x) sum += partials[b];
    sums[threadIdx.x] = sum;
    __syncthreads();
    for (unsigned half = CLIP_THREADS / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) sums[threadIdx.x] += sums[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        float total = __fsqrt_rn(static_cast<float>(sums[0]));
        float factor = __fdiv_rn(max_norm, __fadd_rn(total, 1e-6f));
        norm[0] = total;
        scale[0] = factor > 1.0f ? 1.0f : factor;
    }
}

// The third pass: g *= scale[0] for every gradient, in place.
// Layout: block b takes chunk b, a thread every blockDim.x-th number of it.
extern "C" __global__ void scale_chunks_f32(const unsigned long long* grads, const long long* sizes,
                                            const int* chunk_tensor, const long long* chunk_start, long long chunk,
                                            const float* scale) {
    Chunk c = chunk_of_block(sizes, chunk_tensor, chunk_start, chunk);
    float* grad = reinterpret_cast<float*>(grads[c.tensor]);
    float s = scale[0];
    for (long long i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) grad[i] = __fmul_rn(grad[i], s);
}
