// The embedding's gather and its deterministic gradient, for a table W (n_rows, dim):
//   forward   out[i, c] = W[rows[i], c], rounded once to out's type
//   backward  dW[r, c] = the sum of grad[i, c] over the positions i with rows[i] == r, in float32, added
//             one after another in the order of i (0 where no position picked r), written in W's type
// Each kernel is exported as <name>_<read>_<write>: the type it reads (W, or grad) and the one it writes.

// Launch: a grid-stride loop over the n * dim entries of out, one entry a thread (consecutive threads
// read consecutive columns of a row). rows (n,) already lie in [0, n_rows).
template <typename R, typename W>
__device__ void embedding_forward(const R* weight, const long long* rows, W* out, long long n,
                                  long long dim) {
    long long size = n * dim, stride = static_cast<long long>(blockDim.x) * gridDim.x;
    for (long long k = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; k < size; k += stride) {
        long long i = k / dim, c = k % dim;
        store(out, k, to_float(weight[rows[i] * dim + c]));
    }
}

// Launch: one block per table row r (grid = n_rows), its threads striding over the dim columns. The
// positions that picked r are order[bounds[r]], ..., order[bounds[r + 1] - 1] (a stable sort of rows, so
// in increasing order); each thread adds their gradients one after another: no atomics, the same bits on
// every run.
template <typename R, typename W>
__device__ void embedding_backward(const R* grad, const long long* order, const long long* bounds, W* out,
                                   long long dim) {
    long long row = blockIdx.x, first = bounds[row], last = bounds[row + 1];
    for (long long c = threadIdx.x; c < dim; c += blockDim.x) {
        float sum = 0.0f;
        for (long long k = first; k < last; ++k) sum += to_float(grad[order[k] * dim + c]);
        store(out, row * dim + c, sum);
    }
}

#define EMBEDDING(read, R, write, W)                                                                         \
    extern "C" __global__ void embedding_forward_##read##_##write(const R* weight, const long long* rows,    \
                                                                  W* out, long long n, long long dim) {      \
        embedding_forward<R, W>(weight, rows, out, n, dim);                                                  \
    }                                                                                                        \
    extern "C" __global__ void embedding_backward_##read##_##write(                                          \
        const R* grad, const long long* order, const long long* bounds, W* out, long long dim) {             \
        embedding_backward<R, W>(grad, order, bounds, out, dim);                                             \
    }
EMBEDDING(f32, float, f32, float)
EMBEDDING(f32, float, bf16, bf16)
EMBEDDING(bf16, bf16, f32, float)
EMBEDDING(bf16, bf16, bf16, bf16)
