// Flash attention (Dao et al. 2022, 2023): the numbers of autograd/attention.py's _attend and _attend_backward,
//   q = q_in + b_q,  k = k_in + b_k,  v = v_in + b_v    (b_q, b_k, b_v: MultiHeadAttention's bias in thirds, or 0)
//   S = q k^T * scale (-inf where the causal mask hides a key),  P = softmax(S),  W = dropout(P),  y = W v
//   dv = W^T dy,  dP = dropout(dy v^T),  dS = P (dP - D),  dq = dS k * scale,  dk = dS^T q * scale
// with D = rowsum(dP P) = rowsum(dy y), without ever storing the T x S matrices: the forward keeps each row's
// log-sum-exp, L = max + log(sum exp(S - max)), from which the backward recomputes P = exp(S - L), and dropout's
// mask is drawn again wherever it is needed (common.cuh's Philox, the layout of autograd/random.py). The biases
// (float32, or null for none) are added in float32 by every kernel that loads q, k or v, as it loads them
// (load_rows): the projection's bias costs no pass over qkv of its own. dq_in = dq, dk_in = dk, dv_in = dv, and
// the bias's gradient, the sums of their rows, is the launcher's (column_sums.cu).
//
// The heads of a call are bh = 0 .. batch * n_head - 1 (blockIdx.x). Row t of head bh of a tensor starts at
//   (bh / n_head) * batch + (bh % n_head) * head + t * row     (a Layout, in elements; its last axis contiguous)
// so that q, k and v are read straight out of the packed qkv of MultiHeadAttention (and the gradients written
// into one array like it), or out of contiguous (heads, rows, width) arrays. The gradients of q, k, v share
// their layouts; dy shares y's. A head of width d (q, k) and e (v) runs in a kernel built for width D >= both,
// its tiles zero-padded: zeros add nothing to a dot product. All arithmetic is float32, whatever the storage.
//
// The tile kernels run 128 threads as 16 x 8: ty = threadIdx.x / 8 takes rows of a tile, tx = threadIdx.x % 8
// columns, so that the 8 threads of a row are 8 consecutive lanes of one warp (rows reduce by shuffles). Every
// tile kernel loops over its tiles with a stride of gridDim.y: any grid gives the same numbers. No atomics:
// each output element is written once by one thread, after sums in a fixed order.

constexpr int TILE_THREADS = 128;  // autograd/kernels/attention.py reads it

// Queries (rows) and keys of a tile, per head width, so that a block's float32 tiles fit 48 KB of shared memory;
// both backward kernels use the backward pair. Written here only: autograd/kernels/attention.py:TILES reads them.
template <int D>
struct Tiles;
template <>
struct Tiles<64> {
    static constexpr int forward_queries = 64, forward_keys = 32, backward_queries = 32, backward_keys = 32;
};
template <>
struct Tiles<128> {
    static constexpr int forward_queries = 32, forward_keys = 16, backward_queries = 16, backward_keys = 16;
};

TG_DEVICE float minus_infinity() { return bits_to_float(0xFF800000u); }

struct Layout {
    long long batch, head, row;
};

// One call: the biases of q, k and v, their sizes, the layouts of q, k, v and y, and dropout on the weights
// (threshold 0: none dropped).
struct Attention {
    const float *q_bias, *k_bias, *v_bias;  // n_head * d, n_head * d and n_head * e entries, or null
    Layout q, k, v, o;
    int n_head, n_queries, n_keys, d, e;
    bool causal;
    float scale, keep_scale;  // 1 / sqrt(d);  1 / (1 - p), 1 without dropout, 0 when p = 1
    MaskKey mask;
    unsigned int first_example, rows_per_example;

    TG_DEVICE long long head_start(const Layout& layout, int bh) const {
        return (bh / n_head) * layout.batch + (bh % n_head) * layout.head;
    }
    // The bias of head bh, `width` entries (null for none).
    TG_DEVICE const float* head_bias(const float* bias, int bh, int width) const {
        return bias == nullptr ? nullptr : bias + (bh % n_head) * width;
    }
    // Head bh's biases of q, k and v.
    struct Biases {
        const float *q, *k, *v;
    };
    TG_DEVICE Biases head_biases(int bh) const {
        return {head_bias(q_bias, bh, d), head_bias(k_bias, bh, d), head_bias(v_bias, bh, e)};
    }
    // q, k, v and o (y, or dy) moved to head bh's first element.
    template <typename In, typename Out>
    TG_DEVICE void to_head(int bh, In*& q_, In*& k_, In*& v_, Out*& o_) const {
        q_ += head_start(q, bh);
        k_ += head_start(k, bh);
        v_ += head_start(v, bh);
        o_ += head_start(o, bh);
    }
    // The same, and lse and dot (an entry per query) moved to its first row.
    template <typename In>
    TG_DEVICE void to_head(int bh, In*& q_, In*& k_, In*& v_, In*& o_, const float*& lse, const float*& dot) const {
        to_head(bh, q_, k_, v_, o_);
        lse += static_cast<long long>(bh) * n_queries;
        dot += static_cast<long long>(bh) * n_queries;
    }
    // Query t sees keys 0 .. t + S - T: the T queries are the last T of the S positions.
    TG_DEVICE bool sees(int t, int s) const { return s < n_keys && (!causal || s <= t + n_keys - n_queries); }
    // The keys that queries before `query_end` may see: 0 .. keys_end - 1.
    TG_DEVICE int keys_end(int query_end) const {
        return causal ? min(n_keys, query_end + n_keys - n_queries) : n_keys;
    }
    // The first query that sees key s: s - (S - T) under the causal mask.
    TG_DEVICE int first_query(int s) const { return causal ? max(0, s - (n_keys - n_queries)) : 0; }
};

// The dropout mask of the weights is masks.keep_mask's draw for the scores' shape, whose first axis is the
// example axis: row r = bh * T + t of the scores is in example r / rows_per_example, its entry s at position
// (r % rows_per_example) * S + s of that example (a row never straddles two examples).
struct MaskRow {
    unsigned int example;
    unsigned long long start;
};

TG_DEVICE MaskRow mask_row(const Attention& a, int bh, int t) {
    unsigned int r = static_cast<unsigned int>(bh) * a.n_queries + t;
    return {a.first_example + r / a.rows_per_example,
            static_cast<unsigned long long>(r % a.rows_per_example) * a.n_keys};
}

// One row's decisions along increasing keys: one Philox draw serves 8 consecutive positions.
struct MaskWalk {
    unsigned long long group = ~0ull;
    unsigned int words[4];

    TG_DEVICE bool keeps(const Attention& a, const MaskRow& row, int s) {
        if (a.mask.threshold == 0) return true;
        unsigned long long j = row.start + s;
        if (j / 8 != group) {
            group = j / 8;
            dropout_bits(a.mask, row.example, j, words);
        }
        return dropout_keeps_of(words, j, a.mask.threshold);
    }
};

// bias[c], or 0 where there is no bias (null).
TG_DEVICE float bias_at(const float* bias, int c) { return bias == nullptr ? 0.0f : bias[c]; }

// Rows r0 .. r0 + R - 1 of one head (`row` elements apart, `width` columns) into tile[R][LD] (float32, or bfloat16
// rounded from float32), plus the head's bias (null: none) in each column; zero past n_rows and past the width.
template <int R, int W, int LD, typename T, typename Tile>
TG_DEVICE void load_rows(Tile* tile, const T* head, const float* bias, long long row, int r0, int n_rows, int width) {
    for (int i = threadIdx.x; i < R * W; i += TILE_THREADS) {
        int r = i / W, c = i % W;
        store(tile, r * LD + c,
              (r0 + r < n_rows && c < width) ? to_float(head[(r0 + r) * row + c]) + bias_at(bias, c) : 0.0f);
    }
}

// A thread's results acc[RM][EN] times `scale` into rows r0 .. r0 + RM - 1 of one head (`row` elements apart),
// columns tx, tx + 8, ...: those below n_rows and below the width.
template <int RM, int EN, typename T>
TG_DEVICE void store_rows(T* head, const float (&acc)[RM][EN], float scale, long long row, int r0, int n_rows,
                          int width, int tx) {
#pragma unroll
    for (int i = 0; i < RM; ++i) {
        if (r0 + i >= n_rows) continue;
#pragma unroll
        for (int j = 0; j < EN; ++j) {
            if (tx + 8 * j < width) store(head, (r0 + i) * row + tx + 8 * j, acc[i][j] * scale);
        }
    }
}

// acc[i][j] += sum over k < KN of A(i, k) B(k, j), from shared memory: A(i, k) = a[i * A_ROW + k * A_K],
// B(k, j) = b[k * B_K + j * B_COL], a and b already at the thread's first row and column.
template <int RM, int CN, int KN, int A_ROW, int A_K, int B_K, int B_COL>
TG_DEVICE void multiply_add(float (&acc)[RM][CN], const float* a, const float* b) {
#pragma unroll 8
    for (int k = 0; k < KN; ++k) {
        float a_k[RM], b_k[CN];
#pragma unroll
        for (int i = 0; i < RM; ++i) a_k[i] = a[i * A_ROW + k * A_K];
#pragma unroll
        for (int j = 0; j < CN; ++j) b_k[j] = b[k * B_K + j * B_COL];
#pragma unroll
        for (int i = 0; i < RM; ++i)
#pragma unroll
            for (int j = 0; j < CN; ++j) acc[i][j] = fmaf(a_k[i], b_k[j], acc[i][j]);
    }
}

// The backward's two products over a tile's rows for thread (ty, tx)'s RM x CN block: s += x y^T (S, or S^T)
// and dw += u w^T (dW = dy V^T, or dW^T), from shared tiles of rows D + 1 apart, x and u already at the
// thread's first row, y and w at its first column.
template <int RM, int CN, int D>
TG_DEVICE void scores_and_dw(float (&s)[RM][CN], float (&dw)[RM][CN], const float* x, const float* y,
                             const float* u, const float* w) {
    multiply_add<RM, CN, D, D + 1, 1, 1, D + 1>(s, x, y);
    multiply_add<RM, CN, D, D + 1, 1, 1, D + 1>(dw, u, w);
}

// The float32 y that the backward's D = rowsum(dy y) reads: a bfloat16 y keeps a float32 copy (from y rounded
// to bfloat16, D would be off by that rounding, where the reference's rowsum(dP P) is float32 throughout); a
// float32 y is its own.
TG_DEVICE void store_float32(const float*, float*, long long, float) {}
TG_DEVICE void store_float32(const bf16*, float* copy, long long i, float value) { copy[i] = value; }

// The maximum and the sum over the 8 threads of a row (lanes differing in their 3 low bits), in a fixed order.
TG_DEVICE float row_max(float x) {
    for (int lanes = 1; lanes < 8; lanes *= 2) x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, lanes));
    return x;
}
TG_DEVICE float row_sum(float x) {
    for (int lanes = 1; lanes < 8; lanes *= 2) x += __shfl_xor_sync(0xFFFFFFFFu, x, lanes);
    return x;
}

// Forward: y and L for one head per blockIdx.x and a tile of BR queries at a time (the longest causal rows
// first). K and V come through shared memory BC keys at a time; each row keeps its running max m, sum l and
// output acc (online softmax: when m grows, l and acc shrink by exp(m_old - m_new)); the tile's probabilities,
// dropped out, go through shared memory into acc += W V. Then y = acc * keep_scale / l (also kept in float32
// for a bfloat16 y) and L = m + log(l): the normaliser is the undropped sum, as the reference's. Thread
// (ty, tx): rows ty * RM .., keys tx * CN .. of a tile, output columns tx, tx + 8, ...
template <typename T, int D, int BR, int BC>
__device__ void attention_forward(const Attention& a, const T* q, const T* k, const T* v, T* out, float* out_float,
                                  float* lse) {
    constexpr int RM = BR / 16, CN = BC / 8, EN = D / 8;
    __shared__ float sq[BR][D + 1], sk[BC][D + 1], sv[BC][D], sp[BR][BC + 1];
    const int tx = threadIdx.x % 8, ty = threadIdx.x / 8, bh = blockIdx.x;
    a.to_head(bh, q, k, v, out);
    out_float += a.head_start(a.o, bh);
    const auto [q_bias, k_bias, v_bias] = a.head_biases(bh);
    const int n_tiles = (a.n_queries + BR - 1) / BR;
    for (int tile = n_tiles - 1 - static_cast<int>(blockIdx.y); tile >= 0; tile -= static_cast<int>(gridDim.y)) {
        const int q0 = tile * BR;
        load_rows<BR, D, D + 1>(&sq[0][0], q, q_bias, a.q.row, q0, a.n_queries, a.d);
        float m[RM], l[RM], acc[RM][EN];
        MaskRow rows[RM];
#pragma unroll
        for (int i = 0; i < RM; ++i) {
            m[i] = minus_infinity();
            l[i] = 0.0f;
            rows[i] = mask_row(a, bh, q0 + ty * RM + i);
#pragma unroll
            for (int j = 0; j < EN; ++j) acc[i][j] = 0.0f;
        }
        const int keys_end = a.keys_end(q0 + BR);
        for (int k0 = 0; k0 < keys_end; k0 += BC) {
            __syncthreads();  // the last tile's products are done with sk, sv, sp (and sq is written)
            load_rows<BC, D, D + 1>(&sk[0][0], k, k_bias, a.k.row, k0, a.n_keys, a.d);
            load_rows<BC, D, D>(&sv[0][0], v, v_bias, a.v.row, k0, a.n_keys, a.e);
            __syncthreads();
            float s[RM][CN] = {};
            multiply_add<RM, CN, D, D + 1, 1, 1, D + 1>(s, &sq[ty * RM][0], &sk[tx * CN][0]);
#pragma unroll
            for (int i = 0; i < RM; ++i) {
                // a row past T sees every key (t + S - T >= S), so that no row is all -inf
                const int t = q0 + ty * RM + i;
                float tile_max = minus_infinity();
#pragma unroll
                for (int j = 0; j < CN; ++j) {
                    s[i][j] = a.sees(t, k0 + tx * CN + j) ? s[i][j] * a.scale : minus_infinity();
                    tile_max = fmaxf(tile_max, s[i][j]);
                }
                const float m_new = fmaxf(m[i], row_max(tile_max)), shrink = expf(m[i] - m_new);
                float sum = 0.0f;
                MaskWalk walk;
#pragma unroll
                for (int j = 0; j < CN; ++j) {
                    const float p = expf(s[i][j] - m_new);
                    sum += p;
                    const bool kept = p > 0.0f && walk.keeps(a, rows[i], k0 + tx * CN + j);
                    sp[ty * RM + i][tx * CN + j] = kept ? p : p * 0.0f;  // times 0: a NaN stays, as x * keep does
                }
                l[i] = l[i] * shrink + row_sum(sum);
                m[i] = m_new;
#pragma unroll
                for (int j = 0; j < EN; ++j) acc[i][j] *= shrink;
            }
            __syncthreads();
            multiply_add<RM, EN, BC, BC + 1, 1, D, 8>(acc, &sp[ty * RM][0], &sv[0][tx]);
        }
#pragma unroll
        for (int i = 0; i < RM; ++i) {
            const int t = q0 + ty * RM + i;
            if (t >= a.n_queries) continue;
            const float norm = a.keep_scale / l[i];
#pragma unroll
            for (int j = 0; j < EN; ++j) {
                if (tx + 8 * j >= a.e) continue;
                store(out, t * a.o.row + tx + 8 * j, acc[i][j] * norm);
                store_float32(out, out_float, t * a.o.row + tx + 8 * j, acc[i][j] * norm);
            }
            if (tx == 0) lse[static_cast<long long>(bh) * a.n_queries + t] = m[i] + logf(l[i]);
        }
    }
}

// D = rowsum(dy * y) for every row r = bh * T + t, into dot[r], from the forward's float32 y: one warp per
// row (grid-stride), lanes over the columns, then shuffles in a fixed order.
template <typename T>
__device__ void attention_row_dot(const float* out, const T* grad, float* dot, long long o_batch, long long o_head,
                                  long long o_row, int n_head, int n_queries, int e, long long n_rows) {
    const int lane = threadIdx.x % 32;
    const long long warps = static_cast<long long>(gridDim.x) * (blockDim.x / 32);
    for (long long r = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; r < n_rows; r += warps) {
        const long long bh = r / n_queries, t = r % n_queries;
        const long long start = (bh / n_head) * o_batch + (bh % n_head) * o_head + t * o_row;
        float sum = 0.0f;
        for (int c = lane; c < e; c += 32) sum += out[start + c] * to_float(grad[start + c]);
        for (int lanes = 16; lanes > 0; lanes /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, lanes);
        if (lane == 0) dot[r] = sum;
    }
}

// Backward over keys: dk and dv for one head per blockIdx.x and a tile of BC keys at a time, summed in
// registers over the tiles of BR queries that see them. Per query tile, the transposed tile S^T = K Q^T and
// dW^T = V dy^T give P^T = exp(S^T - L) and dS^T = P^T (dP^T - D), which go through shared memory into
// dv += W^T dy and dk += dS^T q (times scale at the end). Thread (ty, tx): keys ty * RM .., queries tx * CN ..
// of the S^T tile, output columns tx, tx + 8, ... of its keys.
template <typename T, int D, int BR, int BC>
__device__ void attention_backward_keys(const Attention& a, const T* q, const T* k, const T* v, const T* grad,
                                        const float* lse, const float* dot, T* grad_k, T* grad_v) {
    constexpr int RM = BC / 16, CN = BR / 8, EN = D / 8;
    __shared__ float sk[BC][D + 1], sv[BC][D + 1], sq[BR][D + 1], sg[BR][D + 1];
    __shared__ float sw[BC][BR + 1], sds[BC][BR + 1], sl[BR], sdot[BR];
    const int tx = threadIdx.x % 8, ty = threadIdx.x / 8, bh = blockIdx.x;
    a.to_head(bh, q, k, v, grad, lse, dot);
    grad_k += a.head_start(a.k, bh);
    grad_v += a.head_start(a.v, bh);
    const auto [q_bias, k_bias, v_bias] = a.head_biases(bh);
    const int n_tiles = (a.n_keys + BC - 1) / BC;
    for (int tile = blockIdx.y; tile < n_tiles; tile += static_cast<int>(gridDim.y)) {
        const int k0 = tile * BC;
        __syncthreads();  // the last tile's products are done with every buffer
        load_rows<BC, D, D + 1>(&sk[0][0], k, k_bias, a.k.row, k0, a.n_keys, a.d);
        load_rows<BC, D, D + 1>(&sv[0][0], v, v_bias, a.v.row, k0, a.n_keys, a.e);
        float gk[RM][EN] = {}, gv[RM][EN] = {};
        const int first = a.first_query(k0);
        for (int q0 = first / BR * BR; q0 < a.n_queries; q0 += BR) {
            __syncthreads();  // the last step's products are done with sq, sg, sw, sds
            load_rows<BR, D, D + 1>(&sq[0][0], q, q_bias, a.q.row, q0, a.n_queries, a.d);
            load_rows<BR, D, D + 1>(&sg[0][0], grad, nullptr, a.o.row, q0, a.n_queries, a.e);
            for (int i = threadIdx.x; i < BR; i += TILE_THREADS) {
                sl[i] = q0 + i < a.n_queries ? lse[q0 + i] : 0.0f;
                sdot[i] = q0 + i < a.n_queries ? dot[q0 + i] : 0.0f;
            }
            __syncthreads();
            float st[RM][CN] = {}, gwt[RM][CN] = {};
            scores_and_dw<RM, CN, D>(st, gwt, &sk[ty * RM][0], &sq[tx * CN][0], &sv[ty * RM][0], &sg[tx * CN][0]);
#pragma unroll
            for (int j = 0; j < CN; ++j) {
                const int col = tx * CN + j, t = q0 + col;
                const MaskRow row = mask_row(a, bh, t);
                MaskWalk walk;
#pragma unroll
                for (int i = 0; i < RM; ++i) {
                    const int key = k0 + ty * RM + i;
                    const float p = (t < a.n_queries && a.sees(t, key)) ? expf(st[i][j] * a.scale - sl[col]) : 0.0f;
                    const bool kept = p > 0.0f && walk.keeps(a, row, key);
                    const float dropout_scale = kept ? a.keep_scale : 0.0f;  // times 0: a NaN stays
                    const float grad_p = gwt[i][j] * dropout_scale;
                    sw[ty * RM + i][col] = p * dropout_scale;
                    sds[ty * RM + i][col] = p * (grad_p - sdot[col]);
                }
            }
            __syncthreads();
            multiply_add<RM, EN, BR, BR + 1, 1, D + 1, 8>(gv, &sw[ty * RM][0], &sg[0][tx]);
            multiply_add<RM, EN, BR, BR + 1, 1, D + 1, 8>(gk, &sds[ty * RM][0], &sq[0][tx]);
        }
        store_rows(grad_k, gk, a.scale, a.k.row, k0 + ty * RM, a.n_keys, a.d, tx);
        store_rows(grad_v, gv, 1.0f, a.v.row, k0 + ty * RM, a.n_keys, a.e, tx);
    }
}

// Backward over queries: dq for one head per blockIdx.x and a tile of BR queries at a time (the longest
// causal rows first), summed in registers over the tiles of BC keys they see: S = Q K^T and dW = dy V^T give
// dS = P (dP - D), which goes through shared memory into dq += dS k (times scale at the end). Thread (ty, tx):
// rows ty * RM .., keys tx * CN .. of a tile, output columns tx, tx + 8, ...
template <typename T, int D, int BR, int BC>
__device__ void attention_backward_queries(const Attention& a, const T* q, const T* k, const T* v, const T* grad,
                                           const float* lse, const float* dot, T* grad_q) {
    constexpr int RM = BR / 16, CN = BC / 8, EN = D / 8;
    __shared__ float sq[BR][D + 1], sg[BR][D + 1], sk[BC][D + 1], sv[BC][D + 1], sds[BR][BC + 1];
    const int tx = threadIdx.x % 8, ty = threadIdx.x / 8, bh = blockIdx.x;
    a.to_head(bh, q, k, v, grad, lse, dot);
    grad_q += a.head_start(a.q, bh);
    const auto [q_bias, k_bias, v_bias] = a.head_biases(bh);
    const int n_tiles = (a.n_queries + BR - 1) / BR;
    for (int tile = n_tiles - 1 - static_cast<int>(blockIdx.y); tile >= 0; tile -= static_cast<int>(gridDim.y)) {
        const int q0 = tile * BR;
        __syncthreads();  // the last tile's products are done with sq, sg
        load_rows<BR, D, D + 1>(&sq[0][0], q, q_bias, a.q.row, q0, a.n_queries, a.d);
        load_rows<BR, D, D + 1>(&sg[0][0], grad, nullptr, a.o.row, q0, a.n_queries, a.e);
        float row_lse[RM], row_dot[RM], gq[RM][EN] = {};
        MaskRow rows[RM];
#pragma unroll
        for (int i = 0; i < RM; ++i) {
            const int t = q0 + ty * RM + i;
            row_lse[i] = t < a.n_queries ? lse[t] : 0.0f;
            row_dot[i] = t < a.n_queries ? dot[t] : 0.0f;
            rows[i] = mask_row(a, bh, t);
        }
        const int keys_end = a.keys_end(q0 + BR);
        for (int k0 = 0; k0 < keys_end; k0 += BC) {
            __syncthreads();  // the last step's product is done with sk, sds (and sq, sg are written)
            load_rows<BC, D, D + 1>(&sk[0][0], k, k_bias, a.k.row, k0, a.n_keys, a.d);
            load_rows<BC, D, D + 1>(&sv[0][0], v, v_bias, a.v.row, k0, a.n_keys, a.e);
            __syncthreads();
            float s[RM][CN] = {}, gw[RM][CN] = {};
            scores_and_dw<RM, CN, D>(s, gw, &sq[ty * RM][0], &sk[tx * CN][0], &sg[ty * RM][0], &sv[tx * CN][0]);
#pragma unroll
            for (int i = 0; i < RM; ++i) {
                const int t = q0 + ty * RM + i;
                MaskWalk walk;
#pragma unroll
                for (int j = 0; j < CN; ++j) {
                    const int key = k0 + tx * CN + j;
                    const float p = (t < a.n_queries && a.sees(t, key)) ? expf(s[i][j] * a.scale - row_lse[i]) : 0.0f;
                    const bool kept = p > 0.0f && walk.keeps(a, rows[i], key);
                    const float grad_p = gw[i][j] * (kept ? a.keep_scale : 0.0f);  // times 0: a NaN stays
                    sds[ty * RM + i][tx * CN + j] = p * (grad_p - row_dot[i]);
                }
            }
            __syncthreads();
            multiply_add<RM, EN, BC, BC + 1, 1, D + 1, 8>(gq, &sds[ty * RM][0], &sk[0][tx]);
        }
        store_rows(grad_q, gq, a.scale, a.q.row, q0 + ty * RM, a.n_queries, a.d, tx);
    }
}

// The exported kernels: every tile kernel takes the call's scalars (ATTENTION_PARAMS) and makes its Attention.
#define ATTENTION_PARAMS                                                                                          \
    const float *q_bias, const float *k_bias, const float *v_bias, long long q_batch, long long q_head,          \
        long long q_row, long long k_batch, long long k_head, long long k_row, long long v_batch,                 \
        long long v_head, long long v_row, long long o_batch, long long o_head, long long o_row,                  \
        int n_head, int n_queries, int n_keys, int d, int e, int causal, float scale, float keep_scale,           \
        unsigned long long seed, unsigned int step, unsigned int site, unsigned int threshold,                    \
        unsigned int first_example, unsigned int rows_per_example
#define ATTENTION_OF_PARAMS                                                                                       \
    Attention{q_bias, k_bias, v_bias, {q_batch, q_head, q_row}, {k_batch, k_head, k_row},                        \
              {v_batch, v_head, v_row}, {o_batch, o_head, o_row}, n_head, n_queries, n_keys, d, e, causal != 0,   \
              scale, keep_scale,                                                                                  \
              MaskKey{seed, step, site, threshold}, first_example, rows_per_example}

#define ATTENTION_KERNELS(D, suffix, T)                                                                          \
    extern "C" __global__ void __launch_bounds__(TILE_THREADS) attention_forward_d##D##_##suffix(                 \
        const T* q, const T* k, const T* v, T* out, float* out_float, float* lse, ATTENTION_PARAMS) {            \
        attention_forward<T, D, Tiles<D>::forward_queries, Tiles<D>::forward_keys>(ATTENTION_OF_PARAMS, q, k, v,  \
                                                                                   out, out_float, lse);          \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(TILE_THREADS) attention_backward_keys_d##D##_##suffix(           \
        const T* q, const T* k, const T* v, const T* grad, const float* lse, const float* dot, T* grad_k,         \
        T* grad_v, ATTENTION_PARAMS) {                                                                            \
        attention_backward_keys<T, D, Tiles<D>::backward_queries, Tiles<D>::backward_keys>(                       \
            ATTENTION_OF_PARAMS, q, k, v, grad, lse, dot, grad_k, grad_v);                                        \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(TILE_THREADS) attention_backward_queries_d##D##_##suffix(        \
        const T* q, const T* k, const T* v, const T* grad, const float* lse, const float* dot, T* grad_q,         \
        ATTENTION_PARAMS) {                                                                                       \
        attention_backward_queries<T, D, Tiles<D>::backward_queries, Tiles<D>::backward_keys>(                    \
            ATTENTION_OF_PARAMS, q, k, v, grad, lse, dot, grad_q);                                                \
    }
ATTENTION_KERNELS(64, f32, float)
ATTENTION_KERNELS(128, f32, float)

#define ATTENTION_ROW_DOT(suffix, T)                                                                              \
    extern "C" __global__ void attention_row_dot_##suffix(const float* out, const T* grad, float* dot,           \
                                                          long long o_batch, long long o_head, long long o_row,  \
                                                          int n_head, int n_queries, int e, long long n_rows) {   \
        attention_row_dot<T>(out, grad, dot, o_batch, o_head, o_row, n_head, n_queries, e, n_rows);              \
    }
ATTENTION_ROW_DOT(f32, float)
ATTENTION_ROW_DOT(bf16, bf16)

// ----- On tensor cores: FlashAttention-2 (Dao 2023) on mma.sync (mma.cuh), m16n8k16 for bfloat16, m16n8k8 for
// float32 read as tf32
//
// The same three tile kernels and the same numbers, with the products made by the tensor cores: q, k, v, dy rounded
// to bfloat16 in shared memory (after the bias, added in float32), or kept in float32 there and rounded to tf32 as
// a fragment is loaded. Each of a block's 4 warps takes 16 rows of the block's 64 (queries in the forward and in
// dq, keys in dk and dv) and holds its tiles of S, dP, y, dq, dk, dv as mma's C fragments: lane (g, t) = (lane / 4, lane % 4) holds rows g and g + 8, columns 2t and 2t + 1
// of each 8-column tile, so a row's statistics are reduced over a quad of lanes. P (and dS, and the dropped-out
// W) never leave registers: rounded to bfloat16, the C fragments of two 8-column tiles are the A fragment of the
// next product over those 16 columns; rounded to tf32, one tile's are, once the quad's lanes swap them by shuffles
// (Operands::pack). The numbers, which the tests' NumPy twin follows bit for bit on the emulated device:
//   - a product adds K = 16 (bfloat16) or 8 (tf32) columns at a time to its float32 accumulator (mma.cuh's
//     contract), in order;
//   - the scores are in base 2, S2 = (q k^T) (scale log2 e), so that P = 2^(S2 - max) (exp2_of); L2 = max + log2(l);
//   - the forward's running max and sum move once per tile of keys; each lane sums its own columns of a row in
//     order (l), the quad adds its four sums at the end: (l0 + l1) + (l2 + l3);
//   - P, W and dS are rounded to the operands' type before their second product (as FlashAttention and cuDNN do).
// Key tiles above the causal diagonal are skipped, and the forward masks only the tiles that cross it. The tensor
// cores' bfloat16 and tf32 products came with sm_80 (Ampere): older GPUs build only the kernels above.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800

constexpr int MMA_ROWS = 64;  // a block's rows: 16 for each of its 4 warps (autograd/kernels/attention.py reads it)
static_assert(TILE_THREADS == 32 * MMA_ROWS / 16, "a warp for each 16 rows");
constexpr float LOG2_E = 1.4426950408889634f;

// The inner tiles, within 48 KB of shared memory and 255 registers a thread, by the tiles' element type and the
// head width: keys per step of the forward, queries per step of dk and dv, keys per step of dq. (No tf32 kernels
// for heads of 128: their float32 tiles would need more; autograd/kernels/attention.py:MMA_TILES reads which.)
template <typename Element, int D>
struct MmaTiles;
template <>
struct MmaTiles<bf16, 64> {
    static constexpr int forward_keys = 64, keys_queries = 32, queries_keys = 64;
};
template <>
struct MmaTiles<bf16, 128> {
    static constexpr int forward_keys = 32, keys_queries = 16, queries_keys = 16;
};
template <>
struct MmaTiles<float, 64> {
    static constexpr int forward_keys = 32, keys_queries = 16, queries_keys = 16;
};

// 2^x and log2(x): the GPU's approximations (ex2.approx: within 2 units in the last place; lg2.approx: within about
// 2^-22 absolutely), PTX `instruction`s of one float32; on the emulated device the `exact` values rounded once to
// float32, which the NumPy twin computes too.
#ifdef __CUDA_ARCH__
#define APPROXIMATION(instruction, exact)             \
    float y;                                          \
    asm(instruction " %0, %1;" : "=f"(y) : "f"(x));   \
    return y
#else
#define APPROXIMATION(instruction, exact) return static_cast<float>(exact(static_cast<double>(x)))
#endif
TG_DEVICE float exp2_of(float x) { APPROXIMATION("ex2.approx.f32", exp2); }
TG_DEVICE float log2_of(float x) { APPROXIMATION("lg2.approx.f32", log2); }

// The maximum and the sum over a quad (the 4 lanes that hold a row), in a fixed order.
TG_DEVICE float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, 2));
}
TG_DEVICE float quad_sum(float x) {
    x += __shfl_xor_sync(0xFFFFFFFFu, x, 1);
    return x + __shfl_xor_sync(0xFFFFFFFFu, x, 2);
}

// The operands of the tensor cores, as the kernels load and multiply them: tiles of Element in shared memory, rows
// padded by PAD numbers (16 bytes: so that the 8 rows an ldmatrix reads, or the lanes of a tf32 load of A or of K's
// rows, fall in different banks; tf32 loads of V's columns meet two lanes a bank),
// and K columns of A (rows of B) per mma. load_a: A's fragment of the 16 x K block at columns k0 of the warp's 16
// rows of a row-major tile (ld numbers a row). load_b_of_rows: B's fragments for the columns n0 .. n0 + 15 (two
// 8-column tiles: b[0..1], b[2..3]) and rows k0 .. k0 + K - 1, where B(k, n) = tile[n][k] (a tile of keys as
// K^T); load_b_of_columns, where B(k, n) = tile[k][n] (a tile of values as V). pack: a 16 x K block held as C
// fragments (K / 8 tiles of 8 columns), rounded, as the A fragment of the next product.
struct Bf16Operands {
    typedef bf16 Element;
    static constexpr int K = 16, PAD = 8;

    // ldmatrix's four matrices: A's (0, k0), (8, k0), (0, k0 + 8), (8, k0 + 8)
    static TG_DEVICE void load_a(unsigned int a_frag[4], const bf16* tile, int ld, int k0) {
        const int lane = threadIdx.x % 32;
        ldmatrix_x4<false>(a_frag, tile + (lane % 8 + 8 * (lane / 8 % 2)) * ld + k0 + 8 * (lane / 16));
    }
    static TG_DEVICE void load_b_of_rows(unsigned int b[4], const bf16* tile, int ld, int n0, int k0) {
        const int lane = threadIdx.x % 32;
        ldmatrix_x4<false>(b, tile + (n0 + lane % 8 + 8 * (lane / 16)) * ld + k0 + 8 * (lane / 8 % 2));
    }
    static TG_DEVICE void load_b_of_columns(unsigned int b[4], const bf16* tile, int ld, int k0, int n0) {
        const int lane = threadIdx.x % 32;
        ldmatrix_x4<true>(b, tile + (k0 + lane % 8 + 8 * (lane / 8 % 2)) * ld + n0 + 8 * (lane / 16));
    }
    static TG_DEVICE void mma(float d[4], const unsigned int a_frag[4], const unsigned int b[2]) {
        mma_bf16_m16n8k16(d, a_frag, b, d);
    }
    // the C tiles 2j and 2j + 1 are chunk j's columns 0 .. 7 and 8 .. 15
    template <int N>
    static TG_DEVICE void pack(unsigned int (&a_frag)[N / K][4], const float (&c)[N / 8][4]) {
#pragma unroll
        for (int j = 0; j < N / K; ++j) {
            a_frag[j][0] = pack_bf16x2(c[2 * j][0], c[2 * j][1]);          // row g, columns 2t, 2t + 1
            a_frag[j][1] = pack_bf16x2(c[2 * j][2], c[2 * j][3]);          // row g + 8
            a_frag[j][2] = pack_bf16x2(c[2 * j + 1][0], c[2 * j + 1][1]);  // row g, columns 8 + 2t, 9 + 2t
            a_frag[j][3] = pack_bf16x2(c[2 * j + 1][2], c[2 * j + 1][3]);  // row g + 8
        }
    }
};

struct Tf32Operands {
    typedef float Element;
    static constexpr int K = 8, PAD = 4;

    // lane (g, t) holds A(g, t), A(g + 8, t), A(g, t + 4), A(g + 8, t + 4); B(t, g), B(t + 4, g)
    static TG_DEVICE void load_a(unsigned int a_frag[4], const float* tile, int ld, int k0) {
        const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll
        for (int i = 0; i < 4; ++i) a_frag[i] = tf32_of(tile[(g + 8 * (i % 2)) * ld + k0 + t + 4 * (i / 2)]);
    }
    static TG_DEVICE void load_b_of_rows(unsigned int b[4], const float* tile, int ld, int n0, int k0) {
        const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll
        for (int i = 0; i < 4; ++i) b[i] = tf32_of(tile[(n0 + g + 8 * (i / 2)) * ld + k0 + t + 4 * (i % 2)]);
    }
    static TG_DEVICE void load_b_of_columns(unsigned int b[4], const float* tile, int ld, int k0, int n0) {
        const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll
        for (int i = 0; i < 4; ++i) b[i] = tf32_of(tile[(k0 + t + 4 * (i % 2)) * ld + n0 + g + 8 * (i / 2)]);
    }
    static TG_DEVICE void mma(float d[4], const unsigned int a_frag[4], const unsigned int b[2]) {
        mma_tf32_m16n8k8(d, a_frag, b, d);
    }
    // C tile j is chunk j: column t of a row is lane (g, t / 2)'s entry t % 2, column t + 4 lane (g, t / 2 + 2)'s
    template <int N>
    static TG_DEVICE void pack(unsigned int (&a_frag)[N / K][4], const float (&c)[N / 8][4]) {
        const int lane = threadIdx.x % 32, holder = lane / 4 * 4 + lane % 4 / 2;
        const bool odd = lane % 2;
#pragma unroll
        for (int j = 0; j < N / K; ++j)
#pragma unroll
            for (int r = 0; r < 2; ++r) {  // row g, then row g + 8
                const float left[2] = {__shfl_sync(0xFFFFFFFFu, c[j][2 * r], holder),
                                       __shfl_sync(0xFFFFFFFFu, c[j][2 * r + 1], holder)};
                const float right[2] = {__shfl_sync(0xFFFFFFFFu, c[j][2 * r], holder + 2),
                                        __shfl_sync(0xFFFFFFFFu, c[j][2 * r + 1], holder + 2)};
                a_frag[j][r] = tf32_of(odd ? left[1] : left[0]);
                a_frag[j][2 + r] = tf32_of(odd ? right[1] : right[0]);
            }
    }
};

// load_rows into a tile of the operands' type, rows of D + PAD.
template <typename Operands, int R, int D, typename T>
TG_DEVICE void load_mma_rows(typename Operands::Element* tile, const T* head, const float* bias, long long row,
                             int r0, int n_rows, int width) {
    load_rows<R, D, D + Operands::PAD>(tile, head, bias, row, r0, n_rows, width);
}

// c += X Y^T for the 16 rows of x and the N rows of y, over their KN columns: S = Q K^T.
template <typename Operands, int N, int KN>
TG_DEVICE void multiply_by_rows(float (&c)[N / 8][4], const typename Operands::Element* x,
                                const typename Operands::Element* y, int ld) {
    static_assert(N % 16 == 0 && KN % Operands::K == 0, "two 8-column tiles at a time, whole mmas");
    for (int k0 = 0; k0 < KN; k0 += Operands::K) {
        unsigned int a_frag[4];
        Operands::load_a(a_frag, x, ld, k0);
#pragma unroll
        for (int n = 0; n < N / 8; n += 2) {
            unsigned int b[4];
            Operands::load_b_of_rows(b, y, ld, 8 * n, k0);
            Operands::mma(c[n], a_frag, b);
            Operands::mma(c[n + 1], a_frag, b + 2);
        }
    }
}

// The backward's two products for a warp's 16 rows on tensor cores: s += x y^T (S, or S^T) and dw += u w^T
// (dW = dy V^T, or dW^T), x and u at the warp's first row, y and w the whole tiles of N rows.
template <typename Operands, int N, int D>
TG_DEVICE void scores_and_dw_mma(float (&s)[N / 8][4], float (&dw)[N / 8][4], const typename Operands::Element* x,
                                 const typename Operands::Element* y, const typename Operands::Element* u,
                                 const typename Operands::Element* w, int ld) {
    multiply_by_rows<Operands, N, D>(s, x, y, ld);
    multiply_by_rows<Operands, N, D>(dw, u, w, ld);
}

// c += P Y for P (16 x KN) held as A fragments and the KN rows of y, over its N columns: y += W V.
template <typename Operands, int KN, int N>
TG_DEVICE void multiply_fragments(float (&c)[N / 8][4], const unsigned int (&p)[KN / Operands::K][4],
                                  const typename Operands::Element* y, int ld) {
    static_assert(N % 16 == 0 && KN % Operands::K == 0, "two 8-column tiles at a time, whole mmas");
#pragma unroll
    for (int j = 0; j < KN / Operands::K; ++j) {
#pragma unroll
        for (int n = 0; n < N / 8; n += 2) {
            unsigned int b[4];
            Operands::load_b_of_columns(b, y, ld, Operands::K * j, 8 * n);
            Operands::mma(c[n], p[j], b);
            Operands::mma(c[n + 1], p[j], b + 2);
        }
    }
}

// Dropout's decisions for a tile of R mask rows (queries) and K keys from k0, drawn by the whole block into shared
// memory between two barriers: a byte of 8 decisions per row and Philox draw, so that each draw is made once, not
// by every lane whose entries it decides. A row's positions k0 .. k0 + K - 1 start `offset` into their first draw
// and meet K / 8 + 1 draws at most.
template <int R, int K>
struct KeepBits {
    static constexpr int DRAWS = K / 8 + 1;
    unsigned char bits[R][DRAWS], offset[R];

    // The rows first_row .. first_row + R - 1 (none past T: those keep nothing) of head bh.
    TG_DEVICE void draw(const Attention& a, int bh, int first_row, int k0) {
        if (a.mask.threshold == 0) return;
        for (int i = threadIdx.x; i < R * DRAWS; i += TILE_THREADS) {
            const int r = i / DRAWS, t = first_row + r;
            unsigned char kept = 0;
            const MaskRow row = mask_row(a, bh, t);
            const unsigned long long first = row.start + k0, j = first / 8 * 8 + 8 * (i % DRAWS);
            if (t < a.n_queries) {
                unsigned int words[4];
                dropout_bits(a.mask, row.example, j, words);
                for (int b = 0; b < 8; ++b) kept |= dropout_keeps_of(words, j + b, a.mask.threshold) << b;
            }
            bits[r][i % DRAWS] = kept;
            if (i % DRAWS == 0) offset[r] = static_cast<unsigned char>(first % 8);
        }
    }
    // Whether row first_row + r keeps key k0 + x.
    TG_DEVICE bool keeps(const Attention& a, int r, int x) const {
        if (a.mask.threshold == 0) return true;
        const int position = offset[r] + x;
        return bits[r][position / 8] >> (position % 8) & 1;
    }
};

// The column of entry i of a lane's 8-column C tile n (0 .. 7 within the tile: 2t and 2t + 1), and its row (g, g + 8).
TG_DEVICE int fragment_column(int n, int i) { return 8 * n + 2 * (threadIdx.x % 4) + i % 2; }
TG_DEVICE int fragment_row(int i) { return threadIdx.x % 32 / 4 + 8 * (i / 2); }

// A warp's results acc[N][4], as fragments of rows[2] (entry i in row rows[i / 2]), times `scale` into one head
// (`row` elements apart): the entries below n_rows and below the width.
template <int N, typename T>
TG_DEVICE void store_fragments(T* head, const float (&acc)[N][4], float scale, long long row, const int (&rows)[2],
                               int n_rows, int width) {
#pragma unroll
    for (int n = 0; n < N; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int r = rows[i / 2], c = fragment_column(n, i);
            if (r < n_rows && c < width) store(head, r * row + c, acc[n][i] * scale);
        }
}

// Forward: y and L2 for one head per blockIdx.x and 64 queries at a time (the longest causal rows first), BC keys
// a step. Per row: the running max m (base 2), this lane's part of the sum l, and y's accumulator, which shrink by
// 2^(m_old - m_new) when m grows. y = acc * keep_scale / l, L2 = m + log2(l): the normaliser is the undropped sum.
template <typename Operands, typename T, int D, int BC>
__device__ void attention_forward_mma(const Attention& a, const T* q, const T* k, const T* v, T* out, float* out_float,
                                      float* lse) {
    typedef typename Operands::Element E;
    constexpr int LD = D + Operands::PAD;
    alignas(16) __shared__ E sq[MMA_ROWS * LD], sk[BC * LD], sv[BC * LD];
    __shared__ KeepBits<MMA_ROWS, BC> keep;
    const int warp = threadIdx.x / 32, bh = blockIdx.x;
    a.to_head(bh, q, k, v, out);
    out_float += a.head_start(a.o, bh);
    const auto [q_bias, k_bias, v_bias] = a.head_biases(bh);
    const float scale_base2 = a.scale * LOG2_E;  // e^x = 2^(x log2 e)
    const int n_tiles = (a.n_queries + MMA_ROWS - 1) / MMA_ROWS;
    for (int tile = n_tiles - 1 - static_cast<int>(blockIdx.y); tile >= 0; tile -= static_cast<int>(gridDim.y)) {
        const int q0 = tile * MMA_ROWS, first_row = q0 + 16 * warp;
        const int rows[2] = {first_row + fragment_row(0), first_row + fragment_row(2)};
        __syncthreads();  // the last tile's products are done with sq
        load_mma_rows<Operands, MMA_ROWS, D>(sq, q, q_bias, a.q.row, q0, a.n_queries, a.d);
        float m[2] = {minus_infinity(), minus_infinity()}, l[2] = {0.0f, 0.0f}, acc[D / 8][4] = {};
        const int keys_end = a.keys_end(q0 + MMA_ROWS);
        for (int k0 = 0; k0 < keys_end; k0 += BC) {
            __syncthreads();  // the last step's products are done with sk, sv (and sq is written)
            load_mma_rows<Operands, BC, D>(sk, k, k_bias, a.k.row, k0, a.n_keys, a.d);
            load_mma_rows<Operands, BC, D>(sv, v, v_bias, a.v.row, k0, a.n_keys, a.e);
            keep.draw(a, bh, q0, k0);
            __syncthreads();
            float s[BC / 8][4] = {};
            multiply_by_rows<Operands, BC, D>(s, sq + 16 * warp * LD, sk, LD);
            // a row past T sees every key (t + S - T >= S), so that no row is all -inf
            const bool all_seen = a.sees(first_row, k0 + BC - 1);  // by every row of the warp: no mask
            float tile_max[2] = {minus_infinity(), minus_infinity()};
#pragma unroll
            for (int n = 0; n < BC / 8; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const bool seen = all_seen || a.sees(rows[i / 2], k0 + fragment_column(n, i));
                    s[n][i] = seen ? s[n][i] * scale_base2 : minus_infinity();
                    tile_max[i / 2] = fmaxf(tile_max[i / 2], s[n][i]);
                }
            float shrink[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float m_new = fmaxf(m[h], quad_max(tile_max[h]));
                shrink[h] = exp2_of(m[h] - m_new);
                m[h] = m_new;
                l[h] *= shrink[h];
            }
#pragma unroll
            for (int n = 0; n < D / 8; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[n][i] *= shrink[i / 2];
#pragma unroll
            for (int n = 0; n < BC / 8; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const float p = exp2_of(s[n][i] - m[i / 2]);
                    l[i / 2] += p;
                    const bool kept = p > 0.0f && keep.keeps(a, 16 * warp + fragment_row(i), fragment_column(n, i));
                    s[n][i] = kept ? p : p * 0.0f;  // times 0: a NaN stays, as the reference's x * keep does
                }
            unsigned int w[BC / Operands::K][4];
            Operands::template pack<BC>(w, s);
            multiply_fragments<Operands, BC, D>(acc, w, sv, LD);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) l[h] = quad_sum(l[h]);
#pragma unroll
        for (int n = 0; n < D / 8; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int t = rows[i / 2], c = fragment_column(n, i);
                if (t >= a.n_queries || c >= a.e) continue;
                const float y = acc[n][i] * (a.keep_scale / l[i / 2]);
                store(out, t * a.o.row + c, y);
                store_float32(out, out_float, t * a.o.row + c, y);
            }
#pragma unroll
        for (int h = 0; h < 2; ++h)
            if (threadIdx.x % 4 == 0 && rows[h] < a.n_queries)
                lse[static_cast<long long>(bh) * a.n_queries + rows[h]] = m[h] + log2_of(l[h]);
    }
}

// Backward over keys: dk and dv for one head per blockIdx.x and 64 keys at a time, summed over the tiles of BR
// queries that see them. The warp's transposed tiles S2^T = K Q^T scale log2 e and dW^T = V dy^T give
// P^T = 2^(S2^T - L2), W^T (dropped out) and dS^T = P^T (dP^T - dot), dot = rowsum(dy y), the A fragments of
// dv += W^T dy and dk += dS^T q (times scale at the end).
template <typename Operands, typename T, int D, int BR>
__device__ void attention_backward_keys_mma(const Attention& a, const T* q, const T* k, const T* v, const T* grad,
                                            const float* lse, const float* dot, T* grad_k, T* grad_v) {
    typedef typename Operands::Element E;
    constexpr int LD = D + Operands::PAD;
    alignas(16) __shared__ E sk[MMA_ROWS * LD], sv[MMA_ROWS * LD], sq[BR * LD], sg[BR * LD];
    __shared__ float sl[BR], sdot[BR];
    __shared__ KeepBits<BR, MMA_ROWS> keep;
    const int warp = threadIdx.x / 32, bh = blockIdx.x;
    a.to_head(bh, q, k, v, grad, lse, dot);
    grad_k += a.head_start(a.k, bh);
    grad_v += a.head_start(a.v, bh);
    const auto [q_bias, k_bias, v_bias] = a.head_biases(bh);
    const float scale_base2 = a.scale * LOG2_E;
    const int n_tiles = (a.n_keys + MMA_ROWS - 1) / MMA_ROWS;
    for (int tile = blockIdx.y; tile < n_tiles; tile += static_cast<int>(gridDim.y)) {
        const int k0 = tile * MMA_ROWS, first_key = k0 + 16 * warp;
        const int keys[2] = {first_key + fragment_row(0), first_key + fragment_row(2)};
        __syncthreads();  // the last tile's products are done with every buffer
        load_mma_rows<Operands, MMA_ROWS, D>(sk, k, k_bias, a.k.row, k0, a.n_keys, a.d);
        load_mma_rows<Operands, MMA_ROWS, D>(sv, v, v_bias, a.v.row, k0, a.n_keys, a.e);
        float dk[D / 8][4] = {}, dv[D / 8][4] = {};
        const int first = a.first_query(k0);
        for (int q0 = first / BR * BR; q0 < a.n_queries; q0 += BR) {
            __syncthreads();  // the last step's products are done with sq, sg, sl, sdot
            load_mma_rows<Operands, BR, D>(sq, q, q_bias, a.q.row, q0, a.n_queries, a.d);
            load_mma_rows<Operands, BR, D>(sg, grad, nullptr, a.o.row, q0, a.n_queries, a.e);
            for (int i = threadIdx.x; i < BR; i += TILE_THREADS) {
                sl[i] = q0 + i < a.n_queries ? lse[q0 + i] : 0.0f;
                sdot[i] = q0 + i < a.n_queries ? dot[q0 + i] : 0.0f;
            }
            keep.draw(a, bh, q0, k0);
            __syncthreads();
            // S^T, dW^T, W^T (W: P dropped out), dS^T
            float s_t[BR / 8][4] = {}, dw_t[BR / 8][4] = {}, w_t[BR / 8][4], ds_t[BR / 8][4];
            scores_and_dw_mma<Operands, BR, D>(s_t, dw_t, sk + 16 * warp * LD, sq, sv + 16 * warp * LD, sg, LD);
#pragma unroll
            for (int n = 0; n < BR / 8; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int c = fragment_column(n, i), t = q0 + c, key = keys[i / 2];
                    const bool seen = t < a.n_queries && a.sees(t, key);
                    const float p = seen ? exp2_of(s_t[n][i] * scale_base2 - sl[c]) : 0.0f;
                    const bool kept = p > 0.0f && keep.keeps(a, c, key - k0);
                    const float dropout_scale = kept ? a.keep_scale : 0.0f;  // times 0: a NaN stays
                    const float grad_p = dw_t[n][i] * dropout_scale;
                    w_t[n][i] = p * dropout_scale;
                    ds_t[n][i] = p * (grad_p - sdot[c]);
                }
            unsigned int w[BR / Operands::K][4], ds[BR / Operands::K][4];
            Operands::template pack<BR>(w, w_t);
            Operands::template pack<BR>(ds, ds_t);
            multiply_fragments<Operands, BR, D>(dv, w, sg, LD);
            multiply_fragments<Operands, BR, D>(dk, ds, sq, LD);
        }
        store_fragments(grad_k, dk, a.scale, a.k.row, keys, a.n_keys, a.d);
        store_fragments(grad_v, dv, 1.0f, a.v.row, keys, a.n_keys, a.e);
    }
}

// Backward over queries: dq for one head per blockIdx.x and 64 queries at a time (the longest causal rows first),
// summed over the tiles of BC keys they see: S2 = Q K^T scale log2 e and dW = dy V^T give dS = P (dP - dot), dot =
// rowsum(dy y), the A fragments of dq += dS k (times scale at the end).
template <typename Operands, typename T, int D, int BC>
__device__ void attention_backward_queries_mma(const Attention& a, const T* q, const T* k, const T* v, const T* grad,
                                               const float* lse, const float* dot, T* grad_q) {
    typedef typename Operands::Element E;
    constexpr int LD = D + Operands::PAD;
    alignas(16) __shared__ E sq[MMA_ROWS * LD], sg[MMA_ROWS * LD], sk[BC * LD], sv[BC * LD];
    __shared__ KeepBits<MMA_ROWS, BC> keep;
    const int warp = threadIdx.x / 32, bh = blockIdx.x;
    a.to_head(bh, q, k, v, grad, lse, dot);
    grad_q += a.head_start(a.q, bh);
    const auto [q_bias, k_bias, v_bias] = a.head_biases(bh);
    const float scale_base2 = a.scale * LOG2_E;
    const int n_tiles = (a.n_queries + MMA_ROWS - 1) / MMA_ROWS;
    for (int tile = n_tiles - 1 - static_cast<int>(blockIdx.y); tile >= 0; tile -= static_cast<int>(gridDim.y)) {
        const int q0 = tile * MMA_ROWS, first_row = q0 + 16 * warp;
        const int rows[2] = {first_row + fragment_row(0), first_row + fragment_row(2)};
        __syncthreads();  // the last tile's products are done with sq, sg
        load_mma_rows<Operands, MMA_ROWS, D>(sq, q, q_bias, a.q.row, q0, a.n_queries, a.d);
        load_mma_rows<Operands, MMA_ROWS, D>(sg, grad, nullptr, a.o.row, q0, a.n_queries, a.e);
        float row_lse[2], row_dot[2], dq[D / 8][4] = {};
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            row_lse[h] = rows[h] < a.n_queries ? lse[rows[h]] : 0.0f;
            row_dot[h] = rows[h] < a.n_queries ? dot[rows[h]] : 0.0f;
        }
        const int keys_end = a.keys_end(q0 + MMA_ROWS);
        for (int k0 = 0; k0 < keys_end; k0 += BC) {
            __syncthreads();  // the last step's product is done with sk, sv (and sq, sg are written)
            load_mma_rows<Operands, BC, D>(sk, k, k_bias, a.k.row, k0, a.n_keys, a.d);
            load_mma_rows<Operands, BC, D>(sv, v, v_bias, a.v.row, k0, a.n_keys, a.e);
            keep.draw(a, bh, q0, k0);
            __syncthreads();
            float s[BC / 8][4] = {}, dw[BC / 8][4] = {};
            scores_and_dw_mma<Operands, BC, D>(s, dw, sq + 16 * warp * LD, sk, sg + 16 * warp * LD, sv, LD);
#pragma unroll
            for (int n = 0; n < BC / 8; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int t = rows[i / 2], key = k0 + fragment_column(n, i);
                    const float p =
                        (t < a.n_queries && a.sees(t, key)) ? exp2_of(s[n][i] * scale_base2 - row_lse[i / 2]) : 0.0f;
                    const bool kept = p > 0.0f && keep.keeps(a, 16 * warp + fragment_row(i), key - k0);
                    const float grad_p = dw[n][i] * (kept ? a.keep_scale : 0.0f);  // times 0: a NaN stays
                    s[n][i] = p * (grad_p - row_dot[i / 2]);  // dS
                }
            unsigned int ds[BC / Operands::K][4];
            Operands::template pack<BC>(ds, s);
            multiply_fragments<Operands, BC, D>(dq, ds, sk, LD);
        }
        store_fragments(grad_q, dq, a.scale, a.q.row, rows, a.n_queries, a.d);
    }
}

// The tensor cores' kernels, with the parameters of the CUDA cores' ones and "mma" in their names (a profile tells
// the engines apart): for bfloat16, attention_*_mma_d64_bf16 and attention_*_mma_d128_bf16; for float32 read as
// tf32, attention_*_mma_tf32_d64_f32.
#define ATTENTION_MMA_KERNELS(name, D, Operands, T)                                                               \
    extern "C" __global__ void __launch_bounds__(TILE_THREADS) attention_forward_mma_##name(                      \
        const T* q, const T* k, const T* v, T* out, float* out_float, float* lse, ATTENTION_PARAMS) {             \
        attention_forward_mma<Operands, T, D, MmaTiles<Operands::Element, D>::forward_keys>(                      \
            ATTENTION_OF_PARAMS, q, k, v, out, out_float, lse);                                                   \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(TILE_THREADS) attention_backward_keys_mma_##name(                \
        const T* q, const T* k, const T* v, const T* grad, const float* lse, const float* dot, T* grad_k,         \
        T* grad_v, ATTENTION_PARAMS) {                                                                            \
        attention_backward_keys_mma<Operands, T, D, MmaTiles<Operands::Element, D>::keys_queries>(                \
            ATTENTION_OF_PARAMS, q, k, v, grad, lse, dot, grad_k, grad_v);                                        \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(TILE_THREADS) attention_backward_queries_mma_##name(             \
        const T* q, const T* k, const T* v, const T* grad, const float* lse, const float* dot, T* grad_q,         \
        ATTENTION_PARAMS) {                                                                                       \
        attention_backward_queries_mma<Operands, T, D, MmaTiles<Operands::Element, D>::queries_keys>(             \
            ATTENTION_OF_PARAMS, q, k, v, grad, lse, dot, grad_q);                                                \
    }
ATTENTION_MMA_KERNELS(d64_bf16, 64, Bf16Operands, bf16)
ATTENTION_MMA_KERNELS(d128_bf16, 128, Bf16Operands, bf16)
ATTENTION_MMA_KERNELS(tf32_d64_f32, 64, Tf32Operands, float)

#endif  // tensor cores: sm_80 and later
