"""Mutation testing of the CUDA sources: how many plausible single bugs in autograd/kernels/cuda the
kernel tests catch on the emulated device, and catch dependably.

    python bench/mutations.py [--jobs 2] [--only NAME ...] [--seed 1] [--fixed] [--json PATH] [--list]

MUTATIONS is a catalogue of single bugs of the kinds a kernel gets (a bound off by one, a wrong
initial value, a removed barrier, a wrong shuffle offset, a swapped index, a missing mask, a wrong
rounding, a dropped scale, a wrong wrap), each an exact text of one source and its replacement. For
each, a copy of the packages and the tests (a "slot", one per job, at a fixed path so that the
emulator's builds of the sources left alone are kept) gets the mutated source, and the kernel tests
run on it with PYTHONPATH pointing at it: the emulated device builds the kernels from the copy. They
run on the emulated device alone (-m "not gpu", -k "not cpu", -x: the first failure ends a run), the
test files of the mutated source first, twice: with CI=1 (the ci profile, derandomized) and under the
dev profile with a fixed --hypothesis-seed. A mutation is killed dependably when both runs fail: a
kill that depends on hypothesis' draw is luck. --fixed adds a third run, CI=1 without the tests of
hypothesis (-m "not hypothesis", their @example cases with them): what the fixed cases kill alone.
A run that overruns --timeout counts as a kill (CI would fail), and says so. test_emulator.py's own
mutation checks are left out: they patch sources with texts of their own, which a mutation here may
change.

Some plausible bugs are left out of the catalogue because no test can kill them: they change no
result. Removing cross_entropy.cu's last barrier in block_reduce is one (the next call's first
barrier already orders the read of shared[32] before any write to it), adding l2 w where l2 is 0
another. So is one the emulator cannot show: the barrier before attention's forward product P V
guards reads of what lanes of the reader's own warp wrote, before the row sum's shuffle; without
it a GPU is left with a hazard inside a warp (__syncwarp would do), which no thread order here shows. So
are partial_sums.cuh's two __threadfence() and its __ldcg: the emulator runs one block at a time, with
one memory and no caches.

The unmutated tests run first in both settings; if they fail, nothing is measured. The figures:
a table, a summary line (killed dependably / total), and with --json, a file of them all.
"""

import argparse
import concurrent.futures
import datetime
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # as a script: the repository's autograd
CUDA = Path("autograd/kernels/cuda")
COPIED = ["autograd", "tinygpt", "train", "tests", "docs", "pyproject.toml", "README.md"]  # tests read docs
TESTS = "tests/autograd"
# the kernel tests, by the sources they aim at; a mutation runs its source's first, then the others
KERNEL_TESTS = {
    "adam.cu": ["test_kernels_adam.py"],
    "attention.cu": [
        "test_kernels_attention.py",
        "test_kernels_attention_mma.py",
        "test_kernels.py",
        "test_random.py",
    ],
    "column_sums.cu": ["test_kernels.py"],
    "partial_sums.cuh": ["test_kernels.py", "test_kernels_norm_gelu.py", "test_layer_norm.py"],
    "mma.cuh": ["test_emulator_mma.py"],
    "common.cuh": ["test_cuda_sources.py", "test_random.py"],
    "cross_entropy.cu": ["test_kernels_loss_embedding.py", "test_kernels.py"],
    "dropout.cu": ["test_random.py", "test_kernels.py"],
    "embedding.cu": ["test_kernels_loss_embedding.py"],
    "gelu.cu": ["test_kernels_norm_gelu.py", "test_kernels.py"],
    "layer_norm.cu": ["test_kernels_norm_gelu.py", "test_layer_norm.py", "test_kernels.py"],
}
EVERY_TEST = [
    "test_kernels.py",
    "test_kernels_adam.py",
    "test_kernels_attention.py",
    "test_kernels_attention_mma.py",
    "test_kernels_loss_embedding.py",
    "test_kernels_norm_gelu.py",
    "test_layer_norm.py",
    "test_random.py",
    "test_emulator.py",
    "test_emulator_mma.py",
    "test_cuda_sources.py",
]
SELECTION = "not cpu and not test_a_mutated_kernel_fails_its_check"
SETTINGS = ("ci", "seed")  # the runs that must both fail for a dependable kill


class Mutation(NamedTuple):
    name: str
    source: str  # a file of autograd/kernels/cuda
    old: str  # text found exactly once in it
    new: str
    what: str


MUTATIONS = [
    # ----- common.cuh: bfloat16 rounding, Philox, the dropout layout
    Mutation("bf16-ties-up", "common.cuh", "bits += 0x7FFFu + ((bits >> 16) & 1u);", "bits += 0x8000u;",
             "bfloat16 rounding: exact halves rounded up instead of to even"),
    Mutation("bf16-ties-down", "common.cuh", "bits += 0x7FFFu + ((bits >> 16) & 1u);", "bits += 0x7FFFu;",
             "bfloat16 rounding: exact halves rounded down instead of to even"),
    Mutation("bf16-nan-not-quieted", "common.cuh", "static_cast<bf16>((bits >> 16) | 0x40u);",
             "static_cast<bf16>(bits >> 16);",
             "a NaN whose payload lies in the low bits truncated to infinity"),
    Mutation("philox-weyl", "common.cuh", "k1 += 0xBB67AE85u;", "k1 += 0x9E3779B9u;",
             "Philox: the second key word bumped by the first's constant"),
    Mutation("mask-threshold", "common.cuh", "return u >= threshold;", "return u > threshold;",
             "dropout: a number equal to the threshold dropped"),
    Mutation("mask-halves", "common.cuh", "(j % 2) ? (word >> 16) : (word & 0xFFFFu)",
             "(j % 2) ? (word & 0xFFFFu) : (word >> 16)", "dropout: the two 16-bit halves of a word swapped"),
    Mutation("mask-seed-high", "common.cuh", "words[3] = static_cast<unsigned int>(key.seed >> 32);",
             "words[3] = 0u;", "dropout: the seed's upper 32 bits left out of the counter"),
    # ----- dropout.cu
    Mutation("dropout-first-example", "dropout.cu",
             "dropout_keeps(key, first_example + static_cast<unsigned int>(example), j)",
             "dropout_keeps(key, static_cast<unsigned int>(example), j)",
             "dropout: the mask ignores the stream's first example"),
    Mutation("dropout-position", "dropout.cu", "long long example = i / per_example, j = i % per_example;",
             "long long example = i / per_example, j = i;", "dropout: the position counted over the batch"),
    Mutation("dropout-scale", "dropout.cu", "kept ? to_float(x[i]) * scale : 0.0f",
             "kept ? to_float(x[i]) : 0.0f", "dropout: kept entries not scaled by 1 / (1 - p)"),
    Mutation("dropout-backward-bound", "dropout.cu", "i < n; i += stride) {\n        store(out, i, keep[i]",
             "i < n - 1; i += stride) {\n        store(out, i, keep[i]",
             "dropout's backward: the last entry left unwritten"),
    Mutation("dropout-backward-mask", "dropout.cu",
             "store(out, i, keep[i] ? to_float(grad[i]) * scale : 0.0f);",
             "store(out, i, to_float(grad[i]) * scale);", "dropout's backward: the mask not applied"),
    # ----- gelu.cu
    # ----- partial_sums.cuh: the column sums finished in a tree by the blocks that arrive last
    Mutation("ps-order", "partial_sums.cuh", "for (long long i = 0; i < n; ++i) sum +=",
             "for (long long i = n - 1; i >= 0; --i) sum +=",
             "partial sums: a group's rows added last first"),
    Mutation("ps-last", "partial_sums.cuh", "last = atomicAdd(counter, count) + count == total;",
             "last = atomicAdd(counter, count) == total;", "partial sums: no block ever the last to arrive"),
    Mutation("ps-reset", "partial_sums.cuh", "            *counter = 0;\n", "",
             "partial sums: a counter left at its total for the next launch"),
    Mutation("ps-last-barrier", "partial_sums.cuh",
             "            *counter = 0;\n        }\n    }\n    __syncthreads();\n",
             "            *counter = 0;\n        }\n    }\n",
             "partial sums: the block reads who is last before thread 0 has written it"),
    Mutation("ps-members", "partial_sums.cuh",
             "long long members = n - group * FAN_IN < FAN_IN ? n - group * FAN_IN : FAN_IN;",
             "long long members = FAN_IN;",
             "partial sums: a last group short of FAN_IN waits for rows never written"),
    Mutation("ps-group-rows", "partial_sums.cuh", "add_rows(to.scratch + group * FAN_IN * width,",
             "add_rows(to.scratch + group * width,",
             "partial sums: a group's rows read from the wrong place"),
    Mutation("ps-level-counters", "partial_sums.cuh", "        to.counters += groups;\n", "",
             "partial sums: a level counts on the level below's counters"),
    # ----- mma.cuh: what the emulated device runs of it (its inline PTX needs a GPU)
    Mutation("mma-pack-halves", "mma.cuh",
             "return static_cast<unsigned int>(halves[0]) | static_cast<unsigned int>(halves[1]) << 16;",
             "return static_cast<unsigned int>(halves[1]) | static_cast<unsigned int>(halves[0]) << 16;",
             "pack_bf16x2: the pair's halves swapped"),
    Mutation("mma-tf32-ties", "mma.cuh", "return (bits + 0x1000u) & 0xFFFFE000u;",
             "return (bits + 0x0FFFu) & 0xFFFFE000u;", "tf32_of: ties rounded toward zero"),
    Mutation("mma-bf16-as-tf32", "mma.cuh", "f32\", EMU_MMA_BF16)", "f32\", EMU_MMA_TF32)",
             "the bf16 mma run as a tf32 one"),
    Mutation("mma-ldmatrix-trans", "mma.cuh", "Transposed ? EMU_LDMATRIX_TRANS : EMU_LDMATRIX",
             "Transposed ? EMU_LDMATRIX : EMU_LDMATRIX_TRANS", "ldmatrix: .trans and the plain load swapped"),
    # ----- column_sums.cu
    Mutation("cs-chunk-end", "column_sums.cu", "row < last; ++row", "row <= last; ++row",
             "column sums: each chunk adds the first row of the next"),
    Mutation("cs-column-guard", "column_sums.cu", "j < width; j += column_step()) {",
             "j <= width; j += column_step()) {",
             "column sums: one thread past the last column writes a partial"),
    Mutation("cs-first-chunk", "column_sums.cu", "(blockIdx.x) * rows_per_chunk;",
             "(blockIdx.x) * rows_per_chunk + (blockIdx.x > 0);",
             "column sums: every chunk after the first skips its first row"),
    Mutation("gelu-cubic", "gelu.cu", "CUBIC * (x * x * x)", "CUBIC * (x * x)",
             "GELU: the cubic term squared"),
    Mutation("gelu-half", "gelu.cu", "store(out, i, 0.5f * v * (1.0f + gelu_tanh(v)));",
             "store(out, i, v * (1.0f + gelu_tanh(v)));", "GELU: the factor 1/2 dropped"),
    Mutation("gelu-slope", "gelu.cu", "(1.0f + 3.0f * CUBIC * v * v)", "(1.0f + CUBIC * v * v)",
             "GELU's backward: the derivative of the cubic without its 3"),
    Mutation("gelu-bound", "gelu.cu",
             "i < last * width; i += width) {\n            float v",
             "i < last * width - width; i += width) {\n            float v",
             "GELU's forward: the last row of each chunk left unwritten"),
    Mutation("gelu-bias-sum", "gelu.cu", "scratch[blockIdx.x * width + j] = sum;", "scratch[j] = sum;",
             "GELU's bias gradient: every chunk's partial sum written to the first chunk's row"),
    Mutation("gelu-tanh-square", "gelu.cu", "(1.0f - t * t)", "(1.0f - t)",
             "GELU's backward: the derivative of tanh as 1 - t"),
    # ----- layer_norm.cu
    Mutation("ln-barrier-after-read", "layer_norm.cu",
             "    __syncthreads();  // every warp has read warp_sums before the next call writes them\n", "",
             "layer norm: the barrier after a block sum's shared read removed (a race)"),
    Mutation("ln-shuffle-levels", "layer_norm.cu", "for (int offset = WARP / 2; offset > 0; offset /= 2)",
             "for (int offset = WARP / 4; offset > 0; offset /= 2)", "layer norm: a warp sum over 16 lanes"),
    Mutation("ln-eps-outside", "layer_norm.cu", "1.0f / sqrtf(group.sum(squares) / width + eps)",
             "1.0f / (sqrtf(group.sum(squares) / width) + eps)",
             "layer norm: eps added outside the square root"),
    Mutation("ln-unbiased-variance", "layer_norm.cu", "group.sum(squares) / width + eps",
             "group.sum(squares) / (width - 1) + eps", "layer norm: the unbiased variance"),
    Mutation("ln-dx-rstd", "layer_norm.cu",
             "source.store_gradient(row, j, (g - mean_g - n[k] * mean_gn) * rstd);",
             "source.store_gradient(row, j, g - mean_g - n[k] * mean_gn);",
             "layer norm's dx: the factor rstd dropped"),
    Mutation("ln-dy-mask", "layer_norm.cu", "d[k] = j < width ? to_float(dout[j]) : 0.0f;",
             "d[k] = to_float(dout[j]);", "layer norm's dx: dy read past the row's width"),
    Mutation("ln-chunk-end", "layer_norm.cu",
             "long long last = first + rows_per_chunk < rows ? first + rows_per_chunk : rows;",
             "long long last = first + rows_per_chunk;",
             "layer norm's backward: the last chunk read past the rows"),
    Mutation("ln-partial-stride", "layer_norm.cu",
             "write_partials<PER_THREAD>(group, partial + chunk * sums * width,",
             "write_partials<PER_THREAD>(group, partial + chunk * 2 * width,",
             "residual layer norm: a chunk's three sums written over the next chunk's"),
    Mutation("ln-dw-rstd", "layer_norm.cu", "sums[0][k] += d[k] * n[k];",
             "sums[0][k] += d[k] * (n[k] / rstd);", "layer norm's dw: x - mean not normalised"),
    Mutation("ln-warp-row-bound", "layer_norm.cu", "if (row >= rows) return;  // the whole warp",
             "if (row > rows) return;  // the whole warp",
             "layer norm, a warp per row: one row past the end"),
    Mutation("ln-block-sum-mask", "layer_norm.cu", "v = warp_sum(lane < warps ? warp_sums[lane] : 0.0f);",
             "v = warp_sum(warp_sums[lane]);", "layer norm, a block per row: lanes past the warps read"),
    Mutation("ln-chunks-written", "layer_norm.cu",
             "static_cast<unsigned int>(chunks - first < warps ? chunks - first : warps);",
             "static_cast<unsigned int>(warps);",
             "layer norm's backward: the last block counts chunks it has not"),
    Mutation("ln-chunk-bound", "layer_norm.cu", "if (chunk < chunks) {  // a whole warp or none",
             "if (chunk <= chunks) {  // a whole warp or none",
             "layer norm's backward, a warp per chunk: one chunk past the end"),
    Mutation("rln-dy-mask", "layer_norm.cu", "store(dy, row * width + j, kept(row, j) ? dh * scale : 0.0f);",
             "store(dy, row * width + j, dh * scale);",
             "residual layer norm's dy: the dropout mask not applied"),
    Mutation("rln-mask-example", "layer_norm.cu",
             "first_example + static_cast<unsigned int>(row / rows_per_example), at",
             "first_example + static_cast<unsigned int>(row), at",
             "residual layer norm: a row taken for an example"),
    Mutation("rln-scale", "layer_norm.cu", "(kept(row, j) ? branch * scale : 0.0f)",
             "(kept(row, j) ? branch : 0.0f)", "residual layer norm: the kept entries not scaled"),
    Mutation("rln-bias-sum", "layer_norm.cu", "return to_float(dy[row * width + j]);", "return dh * scale;",
             "residual layer norm's dbias: dy summed without its mask"),
    Mutation("rln-first-example", "layer_norm.cu",
             "dropout_keeps(key, first_example + static_cast<unsigned int>(row / rows_per_example), at)",
             "dropout_keeps(key, static_cast<unsigned int>(row / rows_per_example), at)",
             "residual layer norm: the mask of a stream's later examples drawn from its first"),
    Mutation("rln-sum-unrounded", "layer_norm.cu", "d[k] = rounded<T>(d[k] + to_float(dout2[j]));",
             "d[k] = d[k] + to_float(dout2[j]);", "residual layer norm: two bf16 gradients' sum not rounded"),
    Mutation("rln-second-offset", "layer_norm.cu",
             "const T* second = dout2 ? dout2 + row * width : nullptr;",
             "const T* second = dout2 ? dout2 + (row - first) * width : nullptr;",
             "residual layer norm's backward: the second gradient read from the chunk's first row on"),
    # ----- cross_entropy.cu
    Mutation("ce-max-from-zero", "cross_entropy.cu", "float row_max = bits_to_float(0xFF800000u);",
             "float row_max = 0.0f;", "cross-entropy: the row maximum starts from 0, not -inf"),
    Mutation("ce-identity-zero", "cross_entropy.cu",
             "const float identity = Max ? bits_to_float(0xFF800000u) : 0.0f;",
             "const float identity = 0.0f;",
             "cross-entropy: the maximum's identity 0 for the lanes past the warps"),
    Mutation("ce-barrier", "cross_entropy.cu",
             "    if (lane == 0) shared[warp] = value;\n    __syncthreads();\n",
             "    if (lane == 0) shared[warp] = value;\n",
             "cross-entropy: the barrier before the warps' sums are read"),
    Mutation("ce-shuffle-offset", "cross_entropy.cu",
             "    for (int offset = 16; offset > 0; offset /= 2) {\n"
             "        float other = __shfl_down_sync(0xFFFFFFFFu, value, offset);\n"
             "        value = Max ? fmaxf(value, other) : value + other;\n    }\n    if (lane == 0)",
             "    for (int offset = 8; offset > 0; offset /= 2) {\n"
             "        float other = __shfl_down_sync(0xFFFFFFFFu, value, offset);\n"
             "        value = Max ? fmaxf(value, other) : value + other;\n    }\n    if (lane == 0)",
             "cross-entropy: a warp reduction over 16 lanes"),
    Mutation("ce-forward-wrap", "cross_entropy.cu", "to_float(z[wrapped(t, n_classes)])", "to_float(z[t])",
             "cross-entropy's forward: a target outside [0, C) not wrapped"),
    Mutation("ce-backward-wrap", "cross_entropy.cu",
             "long long target = counted ? wrapped(t, n_classes) : -1;",
             "long long target = counted ? t : -1;",
             "cross-entropy's backward: a target outside [0, C) not wrapped"),
    Mutation("ce-ignored-weight", "cross_entropy.cu", "float weight = !counted ? 0.0f : divisor",
             "float weight = divisor", "cross-entropy's backward: ignored rows weighted"),
    Mutation("ce-ignored-unwritten", "cross_entropy.cu",
             "    float row_max = maxima[row], log_sum = log_sums[row];\n",
             "    if (!counted) return;\n    float row_max = maxima[row], log_sum = log_sums[row];\n",
             "cross-entropy's backward: ignored rows never written"),
    Mutation("ce-backward-max", "cross_entropy.cu",
             "expf((to_float(logits[row * n_classes + j]) - row_max) - log_sum)",
             "expf(to_float(logits[row * n_classes + j]) - log_sum)",
             "cross-entropy's backward: the maximum not subtracted"),
    Mutation("ce-ignored-loss", "cross_entropy.cu", "losses[row] = t == ignore_index ? 0.0f : log_sum",
             "losses[row] = log_sum", "cross-entropy's forward: ignored rows given a loss"),
    Mutation("ce-mean-of-none", "cross_entropy.cu", "float by = mean ? fmaxf(count, 1.0f) : 1.0f;",
             "float by = mean ? count : 1.0f;", "cross-entropy's mean: no target counted divides by 0"),
    Mutation("ce-count-ignored", "cross_entropy.cu", "count += targets[row] != ignore_index ? 1.0f : 0.0f;",
             "count += 1.0f;", "cross-entropy's mean: ignored targets counted"),
    Mutation("ce-mean-gradient", "cross_entropy.cu", "divisor ? grad[0] / *divisor : grad[row]",
             "divisor ? grad[0] : grad[row]", "cross-entropy's mean: the gradient not divided by the count"),
    # ----- embedding.cu
    Mutation("emb-swapped-index", "embedding.cu", "long long i = k / dim, c = k % dim;",
             "long long i = k % dim, c = k / dim;", "embedding: row and column of an entry swapped"),
    Mutation("emb-last-pick", "embedding.cu", "for (int p = 0; p < count; ++p) {",
             "for (int p = 0; p < count - 1; ++p) {", "embedding's backward: a tile's last pick left out"),
    Mutation("emb-warps-reversed", "embedding.cu", "if (w == warp) place += count;",
             "if (w > warp) place += warp_counts[w];",
             "embedding's backward: a tile's picks listed with the warps in reverse order"),
    Mutation("emb-rank-own-lane", "embedding.cu", "if (lane >= distance) place += below;", "place += below;",
             "embedding's backward: the lanes below the shuffle's distance count themselves again"),
    Mutation("emb-count-barrier", "embedding.cu",
             "    if (lane == LANES - 1) warp_counts[warp] = place;\n    __syncthreads();\n",
             "    if (lane == LANES - 1) warp_counts[warp] = place;\n",
             "embedding's backward: the warps' counts read before every warp has written its own"),
    Mutation("emb-list-barrier", "embedding.cu",
             "    __syncthreads();  // the list whole before any thread reads it\n",
             "", "embedding's backward: a tile's picks read before every thread has written its own"),
    Mutation("emb-negative-id", "embedding.cu", "return row < 0 ? row + n_rows : row;", "return row;",
             "embedding: a negative id outside the table not wrapped into it"),
    Mutation("emb-unpicked-unwritten", "embedding.cu",
             "if (c < dim) store(out, (first_row + r) * dim + c, sums[r][k]);",
             "if (c < dim && sums[r][k] != 0.0f) store(out, (first_row + r) * dim + c, sums[r][k]);",
             "embedding's backward: rows no id picks never written"),
    # ----- adam.cu
    Mutation("adam-coupled-root", "adam.cu", "__fadd_rn(__fdiv_rn(__fsqrt_rn(vi), root), eps)",
             "__fadd_rn(__fsqrt_rn(vi), eps)", "Adam, coupled: the second moment's bias correction dropped"),
    Mutation("adam-decay-of-gradient", "adam.cu", "if (decays) update = __fadd_rn(update, __fmul_rn(l2, w));",
             "if (decays) update = __fadd_rn(update, __fmul_rn(l2, g));",
             "Adam, decoupled: L2 of the gradient, not the weight"),
    Mutation("adam-vectors-decay", "adam.cu", "bool decays = ndims[c.tensor] > 1 ? l2_matrices : l2_vectors;",
             "bool decays = ndims[c.tensor] >= 1 ? l2_matrices : l2_vectors;",
             "Adam: vectors decayed as matrices"),
    Mutation("adam-betas-swapped", "adam.cu", "__fadd_rn(__fmul_rn(m[i], b1), __fmul_rn(one_minus_b1, g))",
             "__fadd_rn(__fmul_rn(m[i], one_minus_b1), __fmul_rn(b1, g))", "Adam: b1 and 1 - b1 swapped"),
    Mutation("adam-clip-barrier", "adam.cu",
             "sums[threadIdx.x] = __fadd_rn(sums[threadIdx.x], sums[threadIdx.x + half]);\n"
             "        __syncthreads();",
             "sums[threadIdx.x] = __fadd_rn(sums[threadIdx.x], sums[threadIdx.x + half]);",
             "clipping: the barrier between the levels of the tree sum removed"),
    Mutation("adam-clip-above-one", "adam.cu", "scale[0] = factor > 1.0f ? 1.0f : factor;",
             "scale[0] = factor;", "clipping: gradients scaled up when under the limit"),
    Mutation("adam-clip-first-partial", "adam.cu", "for (long long b = threadIdx.x; b < n_chunks;",
             "for (long long b = threadIdx.x + 1; b < n_chunks;", "clipping: a chunk's partial sum left out"),
    Mutation("adam-eps-inside-root", "adam.cu", "__fadd_rn(__fsqrt_rn(vi), eps)",
             "__fsqrt_rn(__fadd_rn(vi, eps))", "Adam, decoupled: eps added under the square root"),
    # ----- attention.cu
    Mutation("att-keys-end", "attention.cu", "min(n_keys, query_end + n_keys - n_queries)",
             "min(n_keys, query_end + n_keys - n_queries - 1)",
             "attention: the causal key range one key short"),
    Mutation("att-first-query", "attention.cu", "max(0, s - (n_keys - n_queries))",
             "max(0, s - (n_keys - n_queries) + 1)",
             "attention's backward: the first query seeing a key tile one late"),
    Mutation("att-sees", "attention.cu", "s <= t + n_keys - n_queries", "s < t + n_keys - n_queries",
             "attention: the causal mask hides the diagonal"),
    Mutation("att-first-example", "attention.cu", "return {a.first_example + r / a.rows_per_example,",
             "return {r / a.rows_per_example,",
             "attention's dropout: the mask ignores the stream's first example"),
    Mutation("att-barrier-after-loads", "attention.cu",
             "            __syncthreads();\n            float st[RM][CN] = {}, gwt[RM][CN] = {};",
             "            float st[RM][CN] = {}, gwt[RM][CN] = {};",
             "attention's backward over keys: the barrier after a query tile's loads removed"),
    Mutation("att-row-max-lanes", "attention.cu", "for (int lanes = 1; lanes < 8; lanes *= 2) x = fmaxf(",
             "for (int lanes = 1; lanes < 4; lanes *= 2) x = fmaxf(",
             "attention: a row's maximum over half its threads"),
    Mutation("att-row-sum-offset", "attention.cu", "for (int lanes = 1; lanes < 8; lanes *= 2) x +=",
             "for (int lanes = 1; lanes < 8; lanes *= 4) x +=",
             "attention: a row's sum with a wrong shuffle offset"),
    Mutation("att-dk-scale", "attention.cu", "store_rows(grad_k, gk, a.scale,",
             "store_rows(grad_k, gk, 1.0f,", "attention's dk: the scale dropped"),
    Mutation("att-dw-operand", "attention.cu", "(dw, u, w);\n}", "(dw, x, w);\n}",
             "attention's backward on CUDA cores: dW's product reads the scores' rows, not dy's"),
    Mutation("att-dropout-scale-keys", "attention.cu",
             "const float grad_p = gwt[i][j] * dropout_scale;",
             "const float grad_p = gwt[i][j] * (kept ? 1.0f : 0.0f);",
             "attention's backward over keys: dropout's 1 / (1 - p) dropped"),
    Mutation("att-lse-max", "attention.cu", "= m[i] + logf(l[i]);", "= logf(l[i]);",
             "attention: the log-sum-exp without the row's maximum"),
    Mutation("att-column-mask", "attention.cu", "(r0 + r < n_rows && c < width) ?", "(r0 + r < n_rows) ?",
             "attention: a tile's columns past the head's width loaded"),
    Mutation("att-output-bound", "attention.cu", "if (tx + 8 * j >= a.e) continue;",
             "if (tx + 8 * j > a.e) continue;", "attention: one column past the head written"),
    Mutation("att-mask-position", "attention.cu",
             "static_cast<unsigned long long>(r % a.rows_per_example) * a.n_keys",
             "static_cast<unsigned long long>(r % a.rows_per_example) * a.n_queries",
             "attention's dropout: a row's mask position counted in queries, not keys"),
    Mutation("att-mask-group", "attention.cu", "if (j / 8 != group)", "if (j / 16 != group)",
             "attention's dropout: one Philox draw kept for 16 positions, not 8"),
    Mutation("att-dq-scale", "attention.cu", "store_rows(grad_q, gq, a.scale,",
             "store_rows(grad_q, gq, 1.0f,", "attention's dq: the scale dropped"),
    Mutation("att-row-dot-lanes", "attention.cu", "for (int lanes = 16; lanes > 0; lanes /= 2) sum +=",
             "for (int lanes = 8; lanes > 0; lanes /= 2) sum +=",
             "attention's D = rowsum(dy y) over 16 lanes"),
    # attention.cu on tensor cores (bfloat16)
    Mutation("att-mma-a-lane", "attention.cu", "(a_frag, tile + (lane % 8 + 8 * (lane / 8 % 2)) * ld",
             "(a_frag, tile + ((lane + 1) % 8 + 8 * (lane / 8 % 2)) * ld",
             "attention on tensor cores: A's rows handed to lanes off by one"),
    Mutation("att-mma-p-halves", "attention.cu", "a_frag[j][0] = pack_bf16x2(c[2 * j][0], c[2 * j][1]);",
             "a_frag[j][0] = pack_bf16x2(c[2 * j][1], c[2 * j][0]);",
             "attention on tensor cores: the bfloat16 halves of P's (and dS's) registers swapped"),
    Mutation("att-mma-diagonal-skipped", "attention.cu",
             "k0 < keys_end; k0 += BC) {\n            __syncthreads();  // the last step's "
             "products are done with sk, sv (and",
             "k0 + BC < keys_end; k0 += BC) {\n            __syncthreads();  // the last step's "
             "products are done with sk, sv (and",
             "attention's forward on tensor cores: the tile of keys on the causal diagonal skipped"),
    Mutation("att-mma-diagonal-unmasked", "attention.cu", "a.sees(first_row, k0 + BC - 1)",
             "a.sees(first_row + 15, k0 + BC - 1)",
             "attention's forward on tensor cores: a tile the warp's first row does not wholly see unmasked"),
    Mutation("att-mma-barrier-after-loads", "attention.cu",
             "            __syncthreads();\n            float s[BC / 8][4] = {};",
             "            float s[BC / 8][4] = {};",
             "attention's forward on tensor cores: the barrier after a K/V tile's loads removed"),
    Mutation("att-mma-row-max-lanes", "attention.cu",
             "    return fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, 2));",
             "    return x;", "attention on tensor cores: a row's maximum over 2 lanes of its quad"),
    Mutation("att-mma-row-sum-offset", "attention.cu", "    return x + __shfl_xor_sync(0xFFFFFFFFu, x, 2);",
             "    return x + __shfl_xor_sync(0xFFFFFFFFu, x, 1);",
             "attention on tensor cores: a row's sum over its quad with a wrong shuffle offset"),
    Mutation("att-mma-lse-max", "attention.cu", "= m[h] + log2_of(l[h]);", "= log2_of(l[h]);",
             "attention on tensor cores: L2 without the row's maximum"),
    Mutation("att-mma-v-untransposed", "attention.cu", "    ldmatrix_x4<true>(b, tile + (k0",
             "    ldmatrix_x4<false>(b, tile + (k0",
             "attention on tensor cores: V's fragments loaded without transposing"),
    Mutation("att-mma-first-query", "attention.cu",
             "q0 = first / BR * BR; q0 < a.n_queries; q0 += BR) {\n            __syncthreads();  "
             "// the last step's products are done with sq, sg, sl",
             "q0 = (first + 1) / BR * BR; q0 < a.n_queries; q0 += BR) {\n            __syncthreads();  "
             "// the last step's products are done with sq, sg, sl",
             "attention's dk, dv on tensor cores: the first query tile of a key tile skipped at its edge"),
    Mutation("att-mma-w-scale", "attention.cu", "w_t[n][i] = p * dropout_scale;",
             "w_t[n][i] = kept ? p : 0.0f;", "attention's dv on tensor cores: dropout's 1 / (1 - p) dropped"),
    Mutation("att-mma-dq-barrier", "attention.cu",
             "            __syncthreads();\n            float s[BC / 8][4] = {}, dw[BC / 8][4] = {};",
             "            float s[BC / 8][4] = {}, dw[BC / 8][4] = {};",
             "attention's dq on tensor cores: the barrier after a K/V tile's loads removed"),
    Mutation("att-tf32-pack-halves", "attention.cu", "a_frag[j][r] = tf32_of(odd ? left[1] : left[0]);",
             "a_frag[j][r] = tf32_of(odd ? left[0] : left[1]);",
             "attention in tf32: P's columns t and t + 1 swapped as a quad's lanes hand them over"),
    Mutation("att-tf32-b-columns", "attention.cu",
             "b[i] = tf32_of(tile[(k0 + t + 4 * (i % 2)) * ld + n0 + g + 8 * (i / 2)]);",
             "b[i] = tf32_of(tile[(k0 + t + 4 * (i / 2)) * ld + n0 + g + 8 * (i % 2)]);",
             "attention in tf32: V's fragments with the two halves of k and of n swapped"),
    Mutation("att-tf32-unrounded", "attention.cu",
             "a_frag[i] = tf32_of(tile[(g + 8 * (i % 2)) * ld + k0 + t + 4 * (i / 2)]);",
             "a_frag[i] = float_to_bits(tile[(g + 8 * (i % 2)) * ld + k0 + t + 4 * (i / 2)]);",
             "attention in tf32: A's operands handed over unrounded (tensor cores drop their low bits)"),
    Mutation("att-keep-offset", "attention.cu", "offset[r] = static_cast<unsigned char>(first % 8);",
             "offset[r] = 0;", "attention on tensor cores: dropout's bits read as if each row began a draw"),
    Mutation("att-keep-draws", "attention.cu", "static constexpr int DRAWS = K / 8 + 1;",
             "static constexpr int DRAWS = K / 8;",
             "attention on tensor cores: dropout's bits one draw short where a row's keys straddle one"),
    Mutation("att-keep-barrier", "attention.cu",
             "keep.draw(a, bh, q0, k0);\n            __syncthreads();\n            float s[BC / 8][4] = {};",
             "__syncthreads();\n            keep.draw(a, bh, q0, k0);\n            float s[BC / 8][4] = {};",
             "attention's forward on tensor cores: dropout's bits drawn after the barrier, not before"),
]  # fmt: skip


def text_of(root, mutation):
    return (root / CUDA / mutation.source).read_text()


def catalogue_problems(root=ROOT, mutations=MUTATIONS):
    """What is wrong with the catalogue against the sources under `root`: texts not found exactly once,
    names given twice, replacements that change nothing."""
    problems = [
        f"{m.name}: named twice" for i, m in enumerate(mutations) if m.name in {n.name for n in mutations[:i]}
    ]
    for mutation in mutations:
        count = text_of(root, mutation).count(mutation.old)
        if count != 1:
            problems.append(f"{mutation.name}: its text is in {mutation.source} {count} times, not once")
        if mutation.old == mutation.new:
            problems.append(f"{mutation.name}: the replacement is the text itself")
    return problems


class Slot:
    """A copy of the repository's packages and tests at a fixed path, with its own emulator cache."""

    def __init__(self, folder):
        self.folder, self.cache = folder, folder / ".cache"
        for name in COPIED:
            copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
            kwargs = {"ignore": shutil.ignore_patterns("__pycache__")} if (ROOT / name).is_dir() else {}
            copy(ROOT / name, folder / name, **kwargs)

    def run(self, files, setting, seed, timeout):
        """One pytest run of `files` (of tests/autograd) in a setting: "ci", "seed", or "fixed" (CI=1 and
        the fixed cases alone, no hypothesis test): its outcome."""
        shutil.rmtree(self.folder / ".hypothesis", ignore_errors=True)  # no example kept from another run
        env = {**os.environ, "CI": "1", "PYTHONPATH": str(self.folder), "XDG_CACHE_HOME": str(self.cache)}
        env.pop("HYPOTHESIS_PROFILE", None)  # CI=1: the ci profile
        command = [sys.executable, "-m", "pytest", "-q", "-x", "-rfE", "-p", "no:cacheprovider"]
        markers = "not gpu and not hypothesis" if setting == "fixed" else "not gpu"
        command += ["-m", markers, "-k", SELECTION, *(f"{TESTS}/{f}" for f in files)]
        if setting == "seed":
            env["HYPOTHESIS_PROFILE"] = "dev"
            command.append(f"--hypothesis-seed={seed}")
        start = time.perf_counter()
        try:
            done = subprocess.run(
                command, cwd=self.folder, env=env, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return {
                "killed": True,
                "by": f"a timeout after {timeout} s",
                "seconds": round(time.perf_counter() - start),
            }
        seconds = round(time.perf_counter() - start, 1)
        failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", done.stdout, re.M)
        by = failed[0] if failed else None
        if done.returncode and not failed:
            by = f"pytest exit status {done.returncode}: {(done.stdout + done.stderr).strip()[-300:]}"
        return {"killed": done.returncode != 0, "by": by, "seconds": seconds}

    def mutated(self, mutation, files, seed, timeout, settings):
        """Both runs with `mutation` applied; the source and the cache are as before afterwards."""
        path = self.folder / CUDA / mutation.source
        original = path.read_text()
        if original.count(mutation.old) != 1:
            raise RuntimeError(f"{mutation.name} no longer applies to {mutation.source}")
        before = set(self.cache.rglob("*"))
        path.write_text(original.replace(mutation.old, mutation.new))
        try:
            return {setting: self.run(files, setting, seed, timeout) for setting in settings}
        finally:
            path.write_text(original)
            for built in set(self.cache.rglob("*")) - before:  # the mutated builds: never used again
                if built.is_file():
                    built.unlink()


def files_for(mutation):
    """The kernel test files, the mutated source's own first (-x: a kill ends the run early)."""
    own = KERNEL_TESTS[mutation.source]
    return own + [f for f in EVERY_TEST if f not in own]


def measure(mutations, jobs, seed, timeout, work, baseline=True, settings=SETTINGS):
    """{name: result} for each mutation, `jobs` slots at a time, after a baseline run of the unmutated
    tests in each slot (which builds the unmutated kernels into its cache), unless told not to."""
    start = time.perf_counter()
    slots = queue.Queue()

    def baseline_of(i):
        slot = Slot(work / f"slot-{i}")
        settings = ("ci", "seed") if baseline else ()
        runs = {setting: slot.run(EVERY_TEST, setting, seed, timeout) for setting in settings}
        slots.put(slot)
        return {setting: run["by"] for setting, run in runs.items() if run["killed"]}

    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        if failing := [f for f in pool.map(baseline_of, range(jobs)) if f]:
            sys.exit(f"the unmutated tests fail, nothing to measure: {failing[0]}")
    if baseline:
        print(f"the unmutated tests pass in both runs ({time.perf_counter() - start:.0f} s)", flush=True)

    def one(mutation):
        slot = slots.get()
        try:
            runs = slot.mutated(mutation, files_for(mutation), seed, timeout, settings)
        finally:
            slots.put(slot)
        result = {"source": mutation.source, "what": mutation.what, **runs}
        result["dependable"] = all(runs[setting]["killed"] for setting in SETTINGS)
        print(row(mutation.name, result), flush=True)
        return mutation.name, result

    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        return dict(pool.map(one, mutations))


def row(name, result):
    def mark(run):
        return f"{'killed' if run['killed'] else 'SURVIVED':8} {run['seconds']:6.0f} s"

    killed = [result[setting]["killed"] for setting in ("ci", "seed")]
    verdict = "dependably" if all(killed) else "by luck" if any(killed) else "no"
    by = result["ci"]["by"] or result["seed"]["by"] or "-"
    runs = "  ".join(mark(result[setting]) for setting in ("ci", "seed", "fixed") if setting in result)
    return f"{name:26} {result['source']:17} {runs}  {verdict:10} {by}"


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these mutations alone")
    parser.add_argument("--seed", type=int, default=1, help="the dev profile's hypothesis seed (default 1)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds a run may take (default 900)")
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--list", action="store_true", help="print the catalogue and stop")
    parser.add_argument(
        "--fixed",
        action="store_true",
        help="a third run, CI=1 without hypothesis' tests: killed by fixed cases?",
    )
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the unmutated runs (a quick look at a few mutations)"
    )
    args = parser.parse_args(argv)
    if problems := catalogue_problems():
        sys.exit("the catalogue does not match the sources:\n  " + "\n  ".join(problems))
    names = {mutation.name for mutation in MUTATIONS}
    if unknown := set(args.only or ()) - names:
        parser.error(f"no mutation named {', '.join(sorted(unknown))}")
    chosen = [mutation for mutation in MUTATIONS if not args.only or mutation.name in args.only]
    if args.list:
        for mutation in chosen:
            print(f"{mutation.name:26} {mutation.source:17} {mutation.what}")
        return
    print(f"{len(chosen)} mutations, {args.jobs} at a time; runs: CI=1, then dev with seed {args.seed}")
    fixed = f"{'fixed cases':17}  " if args.fixed else ""
    print(f"{'mutation':26} {'source':17} {'CI=1':17}  {'seed':17}  {fixed}{'killed':10} first failure")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tinygpt-mutations-") as work:
        settings = SETTINGS + (("fixed",) if args.fixed else ())
        results = measure(
            chosen, args.jobs, args.seed, args.timeout, Path(work), not args.no_baseline, settings
        )
    dependable = sorted(name for name, r in results.items() if r["dependable"])
    survivors = [name for name, r in results.items() if not r["dependable"]]
    share = len(dependable) / len(results)
    seconds = time.perf_counter() - start
    print(f"killed dependably: {len(dependable)} / {len(results)} ({share:.0%}), in {seconds:.0f} s")
    if survivors:
        print("not killed dependably: " + ", ".join(survivors))
    if args.fixed:
        by_fixed = sum(r["fixed"]["killed"] for r in results.values())
        print(f"killed by fixed cases alone (no hypothesis test): {by_fixed} / {len(results)}")
    if args.json:
        from autograd.emulator import (
            kernels as emulator_kernels,  # here: the runs build from the slots' copies
        )

        commit = subprocess.run(  # "-dirty": the tree measured held changes not yet committed
            ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        figures = {
            "date": datetime.date.today().isoformat(),
            "commit": commit,
            "seed": args.seed,
            "jobs": args.jobs,
            "thread_orders": list(emulator_kernels.ORDERS),
            "killed_dependably": len(dependable),
            "total": len(results),
            "mutations": results,
        }
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
