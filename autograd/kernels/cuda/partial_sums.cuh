// Column sums finished in the launch that writes their partial sums, without a second launch and without
// atomic additions of floats, so that a run repeats bit for bit. A kernel writes partial sums of its columns,
// one row per item (a chunk of rows of its input), into `rows` (n items, `width` columns), then every thread of
// the block calls finish_sums for the items it wrote. The items are added in a tree of FAN_IN at a time: the
// block that completes a group of FAN_IN consecutive items (as a counter of the group tells: the counter only
// picks who adds) adds the group's rows in order into a row of the next level, and so on up to a group that
// is the last level: its sum goes to `sums`. The order of every addition is fixed by n alone.
// autograd/kernels/compiling.py:headed puts this file after common.cuh in front of each source.

constexpr int FAN_IN = 8;  // the rows one addition of a finisher takes: the tree's branching

// True, in every thread of the block, where the block brings counter to `total` by adding `count` (the last to
// arrive); that block sets it back to 0, for the next launch. Every thread of the block calls it. Each thread's
// earlier writes are seen by the whole device before the counter moves, and the last block reads the others'
// after it has seen the counter (a __threadfence on each side).
__device__ bool last_to_arrive(unsigned int* counter, unsigned int count, unsigned int total) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(counter, count) + count == total;
        if (last) {
            __threadfence();
            *counter = 0;
        }
    }
    __syncthreads();
    return last;
}

// out[j] = rows[0, j] + rows[1, j] + ... + rows[n - 1, j], in that order, for the columns j = first, first +
// step, ... below width. The rows were written on other multiprocessors: read past this one's L1 (__ldcg).
__device__ void add_rows(const float* rows, long long n, long long width, float* out, long long first,
                         long long step) {
    for (long long j = first; j < width; j += step) {
        float sum = 0.0f;
        for (long long i = 0; i < n; ++i) sum += __ldcg(rows + i * width + j);
        out[j] = sum;
    }
}

// The counters of the tree over n items: a group's at each level up to the one of a single group.
__device__ long long tree_counters(long long n) {
    long long counters = 0;
    do {
        n = (n + FAN_IN - 1) / FAN_IN;
        counters += n;
    } while (n > 1);
    return counters;
}

// Where a kernel's partial sums go, as autograd/kernels/linear.py's partial_sums makes them.
struct PartialSums {
    float* scratch;          // the items' rows of partial sums, then the rows of each level of the tree above
    unsigned int* counters;  // each level's groups' counters, after the previous level's: 0 between launches
    float* sums;             // the sums of all the items' rows
};

// Called by every thread of a block that has written the rows of items `item` .. `item + count - 1` (all in one
// group of FAN_IN) of the n rows (each `width` floats) at the start of to.scratch: adds up the tree above them
// as far as this block is the last to arrive. The block's columns: first, first + step, ...
__device__ void finish_sums(PartialSums to, long long n, long long width, long long item, unsigned int count,
                            long long first, long long step) {
    for (;;) {
        long long group = item / FAN_IN, groups = (n + FAN_IN - 1) / FAN_IN;
        long long members = n - group * FAN_IN < FAN_IN ? n - group * FAN_IN : FAN_IN;
        if (!last_to_arrive(to.counters + group, count, static_cast<unsigned int>(members))) return;
        float* next = to.scratch + n * width;  // the next level's rows
        add_rows(to.scratch + group * FAN_IN * width, members, width, groups == 1 ? to.sums : next + group * width,
                 first, step);
        if (groups == 1) return;
        to.scratch = next;  // up a level: this block's group is an item there
        to.counters += groups;
        n = groups;
        item = group;
        count = 1;
    }
}

// A grid (chunks, column blocks): a thread takes the columns first_column(), then in steps of column_step().
__device__ __forceinline__ long long first_column() {
    return static_cast<long long>(blockIdx.y) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ long long column_step() { return static_cast<long long>(gridDim.y) * blockDim.x; }

// finish_sums for a grid (chunks, column blocks) whose block (c, b) has written chunk c's sums of its columns: a
// tree for each column block, its counters after the previous one's.
__device__ void finish_column_blocks(PartialSums to, long long width) {
    to.counters += blockIdx.y * tree_counters(gridDim.x);
    finish_sums(to, gridDim.x, width, blockIdx.x, 1, first_column(), column_step());
}
