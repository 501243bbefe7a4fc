// The emulated CUDA device's launch (see cuda.h): the threads of a block as fibers on one OS thread, a
// scheduler per block, and the signals that name a memory fault.
//
// A fiber has its own stack (a guard page below it). It is made once, with makecontext and setcontext, and
// from then on switched to and from with _setjmp / _longjmp, which save and restore a few registers and make
// no system call (glibc's swapcontext makes one per switch, to save the signal mask). The library is built
// with -U_FORTIFY_SOURCE: the fortified longjmp refuses to jump to another stack.
//
// A block: every thread starts RUNNABLE. The scheduler runs each runnable thread in turn (in the launch's
// order) until it blocks: at __syncthreads() (AT_BARRIER), at a warp shuffle (AT_WARP) or at its end (DONE).
// When none can run:
//   - a warp whose lanes of a shuffle's mask all wait at that same shuffle (their count of shuffles equal)
//     exchanges its values, and those lanes run again; a lane of the mask that has ended, waits at
//     __syncthreads() or at another shuffle can never arrive: an error;
//   - else, when every thread that has not ended waits at __syncthreads(), they all go on, in a new order
//     (the next phase); a thread that ended while others wait there is an error;
//   - else every thread has ended, and the next block starts (run_blocks: in the launch's order too).
// So all warps go through their shuffles in step. The orders WARPS and REVERSED_WARPS run one warp at a time
// instead: in each phase, the first warp of the order alone (its lanes and its shuffles) until every lane of
// it waits at __syncthreads() or has ended, then the next warp. A warp that reads shared memory after a
// barrier may then find what a warp run before it wrote there since: a barrier missing between a read and
// the next write shows.
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "cuda.h"

namespace {

constexpr size_t STACK_BYTES = 256 * 1024;  // per fiber; pages are only committed where touched
const char* const WARP_CALLS[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync",
                                  "__syncwarp", "mma.sync m16n8k16 bf16", "mma.sync m16n8k8 tf32",
                                  "ldmatrix.x4", "ldmatrix.x4.trans"};

enum State { RUNNABLE, AT_BARRIER, AT_WARP, DONE };
enum Order { WRITTEN, REVERSED, SHUFFLED, WARPS, REVERSED_WARPS };  // EmuLaunch's order (emulator/kernels.py:ORDERS)

struct Fiber {
    jmp_buf start;  // the top of its stack, where each CUDA thread it runs begins
    jmp_buf where;  // where it waits
    char* mapping;  // a guard page, then its stack
    State state;
    bool started;
    uint3 tid;
    int lane;
    unsigned meetings;  // the warp meetings (shuffles) it has been to in this block
    int kind, arg, width;
    unsigned mask;
    unsigned long long value;  // its value at a shuffle, then the value it receives
    void* registers;           // at an mma, its EmuMma; at an ldmatrix, the four registers it receives
};

size_t page_size;
std::vector<Fiber*> fibers;  // the pool: as many as the largest block so far, kept between launches
std::vector<int> order;
Fiber* current;
int n_threads;
unsigned phase;
jmp_buf scheduler;  // where a fiber goes back to the scheduler
jmp_buf aborted;    // where an error found inside a fiber ends the launch
sigjmp_buf faulted;
EmuLaunch* launch;
EmuCoordinates at;  // where the launched kernel reads threadIdx, blockIdx, blockDim, gridDim
void (*body)(void*);
void* body_context;
pthread_t launching_thread;
volatile sig_atomic_t in_launch;
struct sigaction previous[NSIG];
const int SIGNALS[] = {SIGSEGV, SIGBUS, SIGFPE};
char* signal_stack;

// The library's thread-local block: the __shared__ variables of the kernels (cuda.h makes them static
// __thread), and this byte, which is written (volatile: the write stays) so that glibc makes the block for
// this OS thread before the first kernel runs.
__thread volatile char tls_anchor;
char* shared_start;
size_t shared_bytes;
bool shared_found;

void fiber_main() {
    if (_setjmp(current->start) == 0) _longjmp(scheduler, 1);  // made: back to make_fiber
    body(body_context);                                         // each start of a CUDA thread comes here
    current->state = DONE;
    _longjmp(scheduler, 1);
}

Fiber* make_fiber() {
    Fiber* f = new Fiber();
    f->mapping = static_cast<char*>(mmap(nullptr, page_size + STACK_BYTES, PROT_READ | PROT_WRITE,
                                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    if (f->mapping == MAP_FAILED) abort();
    mprotect(f->mapping, page_size, PROT_NONE);  // an overflowing stack faults here
    ucontext_t context;
    getcontext(&context);
    context.uc_stack.ss_sp = f->mapping + page_size;
    context.uc_stack.ss_size = STACK_BYTES;
    context.uc_link = nullptr;
    makecontext(&context, fiber_main, 0);
    current = f;
    if (_setjmp(scheduler) == 0) setcontext(&context);
    return f;
}

// Switches from the scheduler to fiber f until it blocks or ends.
void resume(Fiber* f) {
    current = f;
    *at.thread_idx = f->tid;
    bool fresh = !f->started;
    f->started = true;
    if (_setjmp(scheduler) == 0) _longjmp(fresh ? f->start : f->where, 1);
}

// Switches from the current fiber to the scheduler; returns when the scheduler lets it go on.
void block_current(State state) {
    current->state = state;
    if (_setjmp(current->where) == 0) _longjmp(scheduler, 1);
}

void describe(const Fiber* f, const char* format, va_list args) {
    for (int i = 0; i < 3; ++i) {
        launch->error_block[i] = (&at.block_idx->x)[i];
        launch->error_thread[i] = (&f->tid.x)[i];
    }
    vsnprintf(launch->message, sizeof launch->message, format, args);
}

// An error found by the scheduler: the launch returns 1.
int error(const Fiber* f, const char* format, ...) {
    va_list args;
    va_start(args, format);
    describe(f, format, args);
    va_end(args);
    return 1;
}

// An error found inside a fiber: the launch returns 1 at once.
[[noreturn]] void fail(const char* format, ...) {
    va_list args;
    va_start(args, format);
    describe(current, format, args);
    va_end(args);
    _longjmp(aborted, 1);
}

// ----- warp meetings

// The lane whose value lane m of a meeting receives, as PTX's shfl.sync gives it for the operands CUDA's
// __shfl*_sync pass: the lane, offset or xor mask counts by its low 5 bits (b); m lies in a segment of
// `width` lanes, first to last. A source before the segment (up) or after it (down, xor) gives m its own
// value, but xor reads a lane of an earlier segment, as a GPU does ((m ^ b) <= last is PTX's whole test).
int source_lane(const Fiber* f, int m) {
    int first = m / f->width * f->width, last = first + f->width - 1, b = f->arg & 31;
    switch (f->kind) {
        case EMU_SHFL_IDX:
            return first + b % f->width;
        case EMU_SHFL_UP:
            return m - b >= first ? m - b : m;
        case EMU_SHFL_DOWN:
            return m + b <= last ? m + b : m;
        case EMU_SHFL_XOR:
            return (m ^ b) <= last ? m ^ b : m;
        default:
            return m;
    }
}

// ----- mma.sync: D = A B + C for a warp, each lane holding the fragments the PTX ISA gives it ("Matrix
// Fragments for mma.m16n8k16 / mma.m16n8k8 with floating point type"), with g = lane / 4 and t = lane % 4:
//   bf16, m16n8k16 (a and b registers hold two bf16 each, the lower index in the low 16 bits):
//     a0 = A[g][2t, 2t+1]  a1 = A[g+8][2t, 2t+1]  a2 = A[g][2t+8, 2t+9]  a3 = A[g+8][2t+8, 2t+9]
//     b0 = B[2t, 2t+1][g]  b1 = B[2t+8, 2t+9][g]
//   tf32, m16n8k8 (one number a register; its low 13 bits are not read):
//     a0 = A[g][t]  a1 = A[g+8][t]  a2 = A[g][t+4]  a3 = A[g+8][t+4]   b0 = B[t][g]  b1 = B[t+4][g]
//   C and D, 16 x 8 float32:  c0 = C[g][2t]  c1 = C[g][2t+1]  c2 = C[g+8][2t]  c3 = C[g+8][2t+1]
// The sum's order inside the hardware is not documented; here each D[i][j] is the products A[i][k] B[k][j]
// (exact in float64) added in float64 in the order of k, then C[i][j], rounded once to float32: the
// contract the NumPy twin (tests/autograd/test_kernels_attention_mma.py:twin) follows bit for bit.

float bf16_value(unsigned int bits16) {
    unsigned int bits = (bits16 & 0xFFFFu) << 16;
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

float tf32_value(unsigned int bits) {
    bits &= 0xFFFFE000u;
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

// The meeting of the 32 lanes of warp `first / 32` at an mma of `kind`: every lane's d.
void meet_at_mma(int first, int kind) {
    int depth = kind == EMU_MMA_BF16 ? 16 : 8;
    double a[16][16], b[16][8];
    for (int lane = 0; lane < 32; ++lane) {
        const EmuMma* r = static_cast<EmuMma*>(fibers[first + lane]->registers);
        int g = lane / 4, t = lane % 4;
        if (kind == EMU_MMA_BF16) {
            for (int h = 0; h < 2; ++h) {  // the register's low half, then its high half
                int shift = 16 * h;
                a[g][2 * t + h] = bf16_value(r->a[0] >> shift);
                a[g + 8][2 * t + h] = bf16_value(r->a[1] >> shift);
                a[g][2 * t + 8 + h] = bf16_value(r->a[2] >> shift);
                a[g + 8][2 * t + 8 + h] = bf16_value(r->a[3] >> shift);
                b[2 * t + h][g] = bf16_value(r->b[0] >> shift);
                b[2 * t + 8 + h][g] = bf16_value(r->b[1] >> shift);
            }
        } else {
            a[g][t] = tf32_value(r->a[0]);
            a[g + 8][t] = tf32_value(r->a[1]);
            a[g][t + 4] = tf32_value(r->a[2]);
            a[g + 8][t + 4] = tf32_value(r->a[3]);
            b[t][g] = tf32_value(r->b[0]);
            b[t + 4][g] = tf32_value(r->b[1]);
        }
    }
    for (int lane = 0; lane < 32; ++lane) {
        EmuMma* r = static_cast<EmuMma*>(fibers[first + lane]->registers);
        int g = lane / 4, t = lane % 4;
        for (int i = 0; i < 4; ++i) {
            int row = g + 8 * (i / 2), column = 2 * t + i % 2;
            double sum = 0.0;
            for (int k = 0; k < depth; ++k) sum += a[row][k] * b[k][column];
            r->d[i] = static_cast<float>(sum + r->c[i]);
        }
    }
}

// ----- ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: four 8 x 8 matrices of 16-bit numbers from shared
// memory, lanes 8i to 8i + 7 giving the addresses of matrix i's rows 0 to 7 (16 bytes each, 16-byte aligned).
// Lane l receives in register i, as the PTX ISA lays it out, row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of
// matrix i (the lower column in the low half); with .trans, column l / 4, rows 2 (l % 4) and 2 (l % 4) + 1.

// The meeting of warp `first / 32` at an ldmatrix: every lane's registers, or -1 on an error.
int meet_at_ldmatrix(int first, bool transposed) {
    const unsigned short* rows[32];
    for (int lane = 0; lane < 32; ++lane) {
        Fiber* f = fibers[first + lane];
        char* row = reinterpret_cast<char*>(f->value);
        if (f->value % 16)
            return -error(f, "ldmatrix: lane %d gives the row address %p, not 16-byte aligned", lane, row);
        if (row < shared_start || row + 16 > shared_start + shared_bytes)
            return -error(f, "ldmatrix: lane %d gives the row address %p, outside the block's shared memory", lane,
                          row);
        rows[lane] = reinterpret_cast<const unsigned short*>(row);
    }
    for (int lane = 0; lane < 32; ++lane) {
        unsigned int* d = static_cast<unsigned int*>(fibers[first + lane]->registers);
        int g = lane / 4, t = lane % 4;
        for (int i = 0; i < 4; ++i) {
            const unsigned short* const* matrix = rows + 8 * i;
            unsigned int low = transposed ? matrix[2 * t][g] : matrix[g][2 * t];
            unsigned int high = transposed ? matrix[2 * t + 1][g] : matrix[g][2 * t + 1];
            d[i] = low | high << 16;
        }
    }
    return 0;
}

// Completes every meeting of warps first_warp to last_warp whose lanes are all there: the number of lanes let
// go, or -1 on an error. Called when no lane of those warps can run, so a lane of a mask that is not at the
// meeting never will be.
int meet_warps(int first_warp, int last_warp) {
    int released = 0;
    for (int first = 32 * first_warp; first <= 32 * last_warp; first += 32) {
        int lanes = std::min(32, n_threads - first);
        for (int l = 0; l < lanes; ++l) {
            Fiber* a = fibers[first + l];
            if (a->state != AT_WARP) continue;
            const char* call = WARP_CALLS[a->kind];
            for (int m = 0; m < 32; ++m) {
                if (!(a->mask >> m & 1u)) continue;
                if (m >= lanes)
                    return -error(a, "%s with mask 0x%08x names lane %d of warp %d, which does not exist in a "
                                     "block of %d threads", call, a->mask, m, first / 32, n_threads);
                Fiber* b = fibers[first + m];
                if (b->state == DONE)
                    return -error(a, "lane %d waits at %s (mask 0x%08x) for lane %d, which has ended", l, call,
                                  a->mask, m);
                if (b->state == AT_BARRIER)
                    return -error(a, "lane %d waits at %s (mask 0x%08x) for lane %d, which waits at "
                                     "__syncthreads()", l, call, a->mask, m);
                if (b->kind != a->kind || b->mask != a->mask || b->width != a->width || b->meetings != a->meetings)
                    return -error(a, "the warp diverges: lane %d waits at its shuffle #%u (%s, mask 0x%08x), lane "
                                     "%d at its shuffle #%u (%s, mask 0x%08x)", l, a->meetings + 1, call, a->mask,
                                  m, b->meetings + 1, WARP_CALLS[b->kind], b->mask);
            }
            if (a->kind == EMU_MMA_BF16 || a->kind == EMU_MMA_TF32) meet_at_mma(first, a->kind);  // all 32 here
            if ((a->kind == EMU_LDMATRIX || a->kind == EMU_LDMATRIX_TRANS) &&
                meet_at_ldmatrix(first, a->kind == EMU_LDMATRIX_TRANS))
                return -1;
            unsigned long long received[32];
            for (int m = 0; m < 32; ++m) {
                if (!(a->mask >> m & 1u)) continue;
                int source = source_lane(fibers[first + m], m);
                if (!(a->mask >> source & 1u))
                    return -error(fibers[first + m], "lane %d of %s reads lane %d, which is not in the mask 0x%08x",
                                  m, call, source, a->mask);
                received[m] = fibers[first + source]->value;
            }
            for (int m = 0; m < 32; ++m) {
                if (!(a->mask >> m & 1u)) continue;
                Fiber* b = fibers[first + m];
                b->value = received[m];
                b->meetings += 1;
                b->state = RUNNABLE;
                released += 1;
            }
        }
    }
    return released;
}

// ----- a block

unsigned long long splitmix64(unsigned long long& state) {
    unsigned long long z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// The order of the threads in this phase (the stretch between two barriers) of block `block`.
void order_threads(unsigned long long block) {
    std::iota(order.begin(), order.end(), 0);
    if (launch->order == REVERSED || launch->order == REVERSED_WARPS) std::reverse(order.begin(), order.end());
    if (launch->order == SHUFFLED) {
        unsigned long long state = launch->seed ^ (block * 0xD1B54A32D192ED03ull) ^ (phase * 0xABC98388FB8FAC03ull);
        for (int i = n_threads - 1; i > 0; --i) std::swap(order[i], order[splitmix64(state) % (i + 1)]);
    }
}

void fill_shared_with_nan() {
    const uint32_t nan = 0x7FC00000u;
    size_t words = shared_bytes / 4;
    uint32_t* p = reinterpret_cast<uint32_t*>(shared_start);
    for (size_t i = 0; i < words; ++i) p[i] = nan;
    memcpy(shared_start + 4 * words, &nan, shared_bytes % 4);
}

// Runs the threads order[begin] to order[end - 1] and completes the meetings of warps first_warp to
// last_warp, until none of those threads can go on: 0, or 1 on an error.
int run_until_blocked(int begin, int end, int first_warp, int last_warp) {
    for (int released = 1; released > 0;) {
        for (int i = begin; i < end; ++i)
            if (fibers[order[i]]->state == RUNNABLE) resume(fibers[order[i]]);
        released = meet_warps(first_warp, last_warp);
        if (released < 0) return 1;
    }
    return 0;
}

int run_block(unsigned long long block) {
    fill_shared_with_nan();
    const dim3& d = *at.block_dim;
    for (int i = 0; i < n_threads; ++i) {
        Fiber* f = fibers[i];
        f->state = RUNNABLE;
        f->started = false;
        f->meetings = 0;
        f->tid = {i % d.x, i / d.x % d.y, i / (d.x * d.y)};
        f->lane = i % 32;
    }
    for (phase = 0;; ++phase) {
        order_threads(block);
        if (launch->order < WARPS) {
            if (run_until_blocked(0, n_threads, 0, (n_threads - 1) / 32)) return 1;
        } else {  // one warp at a time: the lanes of a warp stand together in the order
            for (int begin = 0, end = 0; begin < n_threads; begin = end) {
                int warp = order[begin] / 32;
                while (end < n_threads && order[end] / 32 == warp) ++end;
                if (run_until_blocked(begin, end, warp, warp)) return 1;
            }
        }
        Fiber *waiting = nullptr, *ended = nullptr;
        for (int i = 0; i < n_threads; ++i) {
            if (fibers[i]->state == AT_BARRIER && !waiting) waiting = fibers[i];
            if (fibers[i]->state == DONE && !ended) ended = fibers[i];
        }
        if (!waiting) return 0;
        if (ended)
            return error(waiting, "this thread waits at __syncthreads() while thread (%u, %u, %u) has ended "
                                  "without reaching it", ended->tid.x, ended->tid.y, ended->tid.z);
        for (int i = 0; i < n_threads; ++i) fibers[i]->state = RUNNABLE;
    }
}

// The blocks one after another, in the launch's order too: as the grid lists them (x fastest), reversed, or
// shuffled. A GPU runs them at once and in any order: a kernel whose blocks count on each other's order shows.
int run_blocks() {
    const dim3& g = *at.grid_dim;
    std::vector<unsigned long long> blocks(static_cast<size_t>(g.x) * g.y * g.z);
    std::iota(blocks.begin(), blocks.end(), 0ull);
    if (launch->order == REVERSED || launch->order == REVERSED_WARPS) std::reverse(blocks.begin(), blocks.end());
    if (launch->order == SHUFFLED) {
        unsigned long long state = launch->seed ^ 0x5851F42D4C957F2Dull;
        for (size_t i = blocks.size() - 1; i > 0; --i) std::swap(blocks[i], blocks[splitmix64(state) % (i + 1)]);
    }
    for (unsigned long long block : blocks) {
        *at.block_idx = {static_cast<unsigned>(block % g.x), static_cast<unsigned>(block / g.x % g.y),
                         static_cast<unsigned>(block / (static_cast<unsigned long long>(g.x) * g.y))};
        if (run_block(block)) return 1;
    }
    return 0;
}

// ----- memory faults

bool in_fiber_guard(uintptr_t address) {
    for (Fiber* f : fibers) {
        uintptr_t guard = reinterpret_cast<uintptr_t>(f->mapping);
        if (address >= guard && address < guard + page_size) return true;
    }
    return false;
}

void on_fault(int signal, siginfo_t* info, void* context) {
    if (!in_launch || !pthread_equal(pthread_self(), launching_thread)) {
        sigaction(signal, &previous[signal], nullptr);  // not ours: the previous handler takes it when the
        return;                                         // instruction faults again
    }
    uintptr_t address = reinterpret_cast<uintptr_t>(info->si_addr);
    launch->fault_address = address;
    launch->fault = 3;
    if (signal == SIGFPE) {
        launch->fault = 5;
    } else if (in_fiber_guard(address)) {
        launch->fault = 4;
    } else {
#if defined(__x86_64__)
        // the page fault's error code: bit 1 is set for a write
        auto* uc = static_cast<ucontext_t*>(context);
        launch->fault = (uc->uc_mcontext.gregs[REG_ERR] & 2) ? 2 : 1;
#else
        (void)context;
#endif
    }
    for (int i = 0; i < 3; ++i) {
        launch->error_block[i] = (&at.block_idx->x)[i];
        launch->error_thread[i] = current ? (&current->tid.x)[i] : 0;
    }
    siglongjmp(faulted, 1);
}

int find_tls(dl_phdr_info* info, size_t, void* base) {
    if (reinterpret_cast<void*>(info->dlpi_addr) != base) return 0;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        if (info->dlpi_phdr[i].p_type == PT_TLS) {
            shared_start = static_cast<char*>(info->dlpi_tls_data);
            shared_bytes = info->dlpi_phdr[i].p_memsz;
            shared_found = shared_start != nullptr;
        }
    }
    return 1;
}

bool locate_shared_memory() {
    tls_anchor = 0;  // the block of this thread now exists
    Dl_info self;
    dladdr(reinterpret_cast<void*>(&emu_run), &self);
    shared_found = false;
    dl_iterate_phdr(find_tls, self.dli_fbase);
    return shared_found;
}

}  // namespace

extern "C" void emu_syncthreads() { block_current(AT_BARRIER); }

extern "C" unsigned long long emu_warp_meet(int kind, unsigned mask, unsigned long long bits, int arg, int width) {
    Fiber* f = current;
    if (!(mask >> f->lane & 1u))
        fail("lane %d calls %s with mask 0x%08x, which leaves it out", f->lane, WARP_CALLS[kind], mask);
    if (width < 1 || width > 32 || (width & (width - 1)))
        fail("%s with width %d: the width is a power of 2 up to 32", WARP_CALLS[kind], width);
    f->kind = kind;
    f->mask = mask;
    f->value = bits;
    f->arg = arg;
    f->width = width;
    block_current(AT_WARP);
    return current->value;
}

extern "C" void emu_mma(int kind, EmuMma* lane) {
    current->registers = lane;
    emu_warp_meet(kind, 0xFFFFFFFFu, 0, 0, 32);
}

extern "C" void emu_ldmatrix(int kind, const void* row, unsigned int d[4]) {
    current->registers = d;
    emu_warp_meet(kind, 0xFFFFFFFFu, reinterpret_cast<uintptr_t>(row), 0, 32);
}

extern "C" int emu_run(EmuLaunch* l, EmuCoordinates coordinates, void (*b)(void*), void* context) {
    launch = l;
    at = coordinates;
    body = b;
    body_context = context;
    l->fault = 0;
    l->message[0] = '\0';
    page_size = sysconf(_SC_PAGESIZE);
    n_threads = static_cast<int>(l->block[0] * l->block[1] * l->block[2]);
    if (n_threads < 1 || n_threads > 1024) {
        snprintf(l->message, sizeof l->message, "a block of %d threads", n_threads);
        return 1;
    }
    while (static_cast<int>(fibers.size()) < n_threads) fibers.push_back(make_fiber());
    order.resize(n_threads);
    current = nullptr;
    if (!locate_shared_memory()) {
        snprintf(l->message, sizeof l->message, "the library's thread-local block (its shared memory) is not found");
        return 1;
    }
    *at.block_dim = dim3(l->block[0], l->block[1], l->block[2]);
    *at.grid_dim = dim3(l->grid[0], l->grid[1], l->grid[2]);

    if (!signal_stack) signal_stack = static_cast<char*>(malloc(1 << 16));
    stack_t alternate = {}, previous_stack;
    alternate.ss_sp = signal_stack;
    alternate.ss_size = 1 << 16;
    sigaltstack(&alternate, &previous_stack);
    struct sigaction action = {};
    action.sa_sigaction = on_fault;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    for (int s : SIGNALS) sigaction(s, &action, &previous[s]);
    launching_thread = pthread_self();
    in_launch = 1;

    int result;
    if (sigsetjmp(faulted, 1))
        result = 2;
    else if (_setjmp(aborted))
        result = 1;
    else
        result = run_blocks();

    in_launch = 0;
    for (int s : SIGNALS) sigaction(s, &previous[s], nullptr);
    sigaltstack(&previous_stack, nullptr);
    return result;
}

// Memory for a copy of an array argument of `bytes` bytes: a mapping of a PROT_NONE page, the bytes rounded
// up to whole pages, and another PROT_NONE page. autograd/emulator/kernels.py puts the array at the end of the middle pages,
// so that the first byte past it faults.
EMU_EXPORT void* emu_map_guarded(size_t bytes) {
    size_t page = sysconf(_SC_PAGESIZE), middle = (bytes + page - 1) / page * page;
    char* mapping = static_cast<char*>(
        mmap(nullptr, middle + 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (mapping == MAP_FAILED) return nullptr;
    mprotect(mapping, page, PROT_NONE);
    mprotect(mapping + page + middle, page, PROT_NONE);
    return mapping;
}

EMU_EXPORT void emu_unmap_guarded(void* mapping, size_t bytes) {
    size_t page = sysconf(_SC_PAGESIZE), middle = (bytes + page - 1) / page * page;
    munmap(mapping, middle + 2 * page);
}
