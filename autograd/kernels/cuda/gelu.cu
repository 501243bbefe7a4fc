// GPT-1's GELU, the tanh approximation of x Phi(x), entry by entry over n entries:
//   t = tanh(sqrt(2/pi) (x + 0.044715 x^3)),   y = 0.5 x (1 + t)
//   dx = dy (0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2))
// The forward keeps only x: the backward computes t again, one pass over the entries each way. The math
// is float32 whatever the storage type; each output is rounded to the storage type once.
// Launch: a grid-stride loop, one entry per thread per step (autograd/kernels/gpu.py's blocks and THREADS).

constexpr float SQRT_2_OVER_PI = 0.7978845608028654f;
constexpr float CUBIC = 0.044715f;

__device__ __forceinline__ float gelu_tanh(float x) { return tanhf(SQRT_2_OVER_PI * (x + CUBIC * (x * x * x))); }

template <typename T>
__device__ void gelu_forward(const T* x, T* out, long long n) {
    long long stride = static_cast<long long>(blockDim.x) * gridDim.x;
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = to_float(x[i]);
        store(out, i, 0.5f * v * (1.0f + gelu_tanh(v)));
    }
}

template <typename T>
__device__ void gelu_backward(const T* x, const T* grad, T* out, long long n) {
    long long stride = static_cast<long long>(blockDim.x) * gridDim.x;
    for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = to_float(x[i]), t = gelu_tanh(v);
        float slope = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * SQRT_2_OVER_PI * (1.0f + 3.0f * CUBIC * v * v);
        store(out, i, to_float(grad[i]) * slope);
    }
}

#define GELU(suffix, T)                                                                                     \
    extern "C" __global__ void gelu_forward_##suffix(const T* x, T* out, long long n) {                     \
        gelu_forward<T>(x, out, n);                                                                         \
    }                                                                                                       \
    extern "C" __global__ void gelu_backward_##suffix(const T* x, const T* grad, T* out, long long n) {     \
        gelu_backward<T>(x, grad, out, n);                                                                  \
    }
GELU(f32, float)
GELU(bf16, bf16)
