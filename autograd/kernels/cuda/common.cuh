// What every CUDA source of autograd/kernels/cuda shares: bfloat16 as its 16 bits, and Philox4x32-10
// with the dropout layout of autograd/random.py, so that a kernel draws the masks the numpy twin draws.
// autograd/kernels/compiling.py:headed puts this file in front of each source. It also compiles as plain C++
// (the tests build it with g++ and check its bits against numpy).
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define TG_DEVICE __device__ __forceinline__
#else
#include <cstring>
#define TG_DEVICE inline
#endif

typedef unsigned short bf16;  // a bfloat16: the upper 16 bits of a float32

TG_DEVICE float bits_to_float(unsigned int bits) {
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
    return __uint_as_float(bits);
#else
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
#endif
}

TG_DEVICE unsigned int float_to_bits(float value) {
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
    return __float_as_uint(value);
#else
    unsigned int bits;
    std::memcpy(&bits, &value, sizeof bits);
    return bits;
#endif
}

// Loads give float32 whatever the storage; stores round float32 to the storage type.
TG_DEVICE float to_float(float x) { return x; }
TG_DEVICE float to_float(bf16 x) { return bits_to_float(static_cast<unsigned int>(x) << 16); }

TG_DEVICE void store(float* out, long long i, float value) { out[i] = value; }
TG_DEVICE void store(bf16* out, long long i, float value) {
    unsigned int bits = float_to_bits(value);
    if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu)) {
        out[i] = static_cast<bf16>((bits >> 16) | 0x40u);  // a NaN stays a (quiet) NaN
        return;
    }
    bits += 0x7FFFu + ((bits >> 16) & 1u);  // round to nearest, ties to even, as ml_dtypes does
    out[i] = static_cast<bf16>(bits >> 16);
}

// value rounded to the storage type T once, as a store and a load would: a bfloat16 sum's rounding.
template <typename T>
TG_DEVICE float rounded(float value) {
    T stored;
    store(&stored, 0, value);
    return to_float(stored);
}

// Philox4x32-10 (Salmon et al. 2011): 10 rounds on a 128-bit counter under a 64-bit key.
TG_DEVICE void philox4x32_10(unsigned int c[4], unsigned int k0, unsigned int k1) {
    for (int round = 0; round < 10; ++round) {
        if (round) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        unsigned long long p0 = 0xD2511F53ull * c[0], p1 = 0xCD9E8D57ull * c[2];
        unsigned int c0 = static_cast<unsigned int>(p1 >> 32) ^ c[1] ^ k0;
        unsigned int c2 = static_cast<unsigned int>(p0 >> 32) ^ c[3] ^ k1;
        c[1] = static_cast<unsigned int>(p1);
        c[3] = static_cast<unsigned int>(p0);
        c[0] = c0;
        c[2] = c2;
    }
}

// The dropout masks of autograd/random.py: entry j (C order within an example) of example `example`
// (already counted from the stream's first example) at dropout `site` of a step. Eight entries share
// one Philox output; a kernel that walks consecutive j can draw once and use dropout_keeps_of.
struct MaskKey {
    unsigned long long seed;
    unsigned int step, site, threshold;  // threshold = round(p * 65536); 65536 keeps nothing
};

TG_DEVICE void dropout_bits(const MaskKey& key, unsigned int example, unsigned long long j, unsigned int words[4]) {
    words[0] = static_cast<unsigned int>(j / 8);
    words[1] = example;
    words[2] = key.site;
    words[3] = static_cast<unsigned int>(key.seed >> 32);
    philox4x32_10(words, static_cast<unsigned int>(key.seed), key.step);
}

TG_DEVICE bool dropout_keeps_of(const unsigned int words[4], unsigned long long j, unsigned int threshold) {
    unsigned int word = words[(j % 8) / 2];
    unsigned int u = (j % 2) ? (word >> 16) : (word & 0xFFFFu);
    return u >= threshold;
}

TG_DEVICE bool dropout_keeps(const MaskKey& key, unsigned int example, unsigned long long j) {
    unsigned int words[4];
    dropout_bits(key, example, j, words);
    return dropout_keeps_of(words, j, key.threshold);
}
