// Inverted dropout with its mask drawn in the kernel, as autograd/random.py draws it:
//   out = x * keep / (1 - p);   dx = dy * keep / (1 - p)
// x is (examples, per_example) in C order; keep (one byte per entry) is saved for the backward.

template <typename T>
__device__ void dropout_forward(const T* x, T* out, unsigned char* keep, long long n, long long per_example,
                                unsigned long long seed, unsigned int step, unsigned int site,
                                unsigned int first_example, unsigned int threshold, float scale) {
    MaskKey key{seed, step, site, threshold};
    long long stride = static_cast<long long>(blockDim.x) * gridDim.x;
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        long long example = i / per_example, j = i % per_example;
        bool kept = dropout_keeps(key, first_example + static_cast<unsigned int>(example), j);
        keep[i] = kept;
        store(out, i, kept ? to_float(x[i]) * scale : 0.0f);
    }
}

template <typename T>
__device__ void dropout_backward(const T* grad, const unsigned char* keep, T* out, long long n, float scale) {
    long long stride = static_cast<long long>(blockDim.x) * gridDim.x;
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        store(out, i, keep[i] ? to_float(grad[i]) * scale : 0.0f);
    }
}

#define DROPOUT_FORWARD(suffix, T)                                                                         \
    extern "C" __global__ void dropout_forward_##suffix(                                                   \
        const T* x, T* out, unsigned char* keep, long long n, long long per_example, unsigned long long seed, \
        unsigned int step, unsigned int site, unsigned int first_example, unsigned int threshold, float scale) { \
        dropout_forward<T>(x, out, keep, n, per_example, seed, step, site, first_example, threshold, scale);  \
    }
DROPOUT_FORWARD(f32, float)
DROPOUT_FORWARD(bf16, bf16)

#define DROPOUT_BACKWARD(suffix, T)                                                                           \
    extern "C" __global__ void dropout_backward_##suffix(const T* grad, const unsigned char* keep, T* out,    \
                                                         long long n, float scale) {                          \
        dropout_backward<T>(grad, keep, out, n, scale);                                                       \
    }
DROPOUT_BACKWARD(f32, float)
DROPOUT_BACKWARD(bf16, bf16)
