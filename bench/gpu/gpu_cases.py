"""One small step of every CUDA kernel variant of the engine, a case each, for compute-sanitizer
(bench/gpu/gpu_sanitize.py runs each case in a process of its own under memcheck and racecheck):

    PYTHONPATH=. python bench/gpu/gpu_cases.py CASE [CASE ...] [--device cuda | cuda-emulated]
    PYTHONPATH=. python bench/gpu/gpu_cases.py --all      every case, one after another
    PYTHONPATH=. python bench/gpu/gpu_cases.py --list

A case runs its op's GPU path forward and backward on small random inputs: one batch entry, two
heads, tens of rows, one layer. Small, because racecheck follows every shared-memory access and
must finish in a minute; uneven sizes, so that the last tile, warp and chunk are partly empty.
On a GPU, CuPy's memory pool is off: every array is an allocation of its own, and an access past
its end meets the allocation's edge. Each case prints "done CASE" when its kernels have finished,
or "failed CASE: error"; the status is 1 where any failed. On cuda-emulated (the kernels built for
the CPU) every case runs in CI.
"""

import argparse
import sys
import traceback

import numpy as np

import autograd as ag
from autograd import backend
from autograd import functional as F
from autograd.functional import Embedding
from autograd.optim import Adam, clip_grad_norm
from autograd.random import MaskStream, use_masks
from tinygpt import GPT, GPTConfig

DTYPES = {"f32": np.float32, "bf16": ag.bfloat16}


def leaf(rng, shape, dtype, device):
    """A random tensor of `shape` on `device` that takes a gradient."""
    return ag.tensor(rng.standard_normal(shape), dtype=dtype, device=device, requires_grad=True)


def backward(y, rng):
    """y's backward pass from a random gradient of its shape."""
    y.backward(rng.standard_normal(y.shape).astype(np.float32))


def attention(width, dtype, causal, precision=None):
    """Attention of 40 queries, two heads of `width`, without and with dropout, under `precision` (None:
    the one in force; "tf32": float32 on the tensor cores). Causal: over 73 keys, one more than a
    multiple of the key tiles (the range of keys a query sees ends inside a tile); else over 50.
    Dropout's examples start at 3, not 0."""

    def case(device):
        rng = np.random.default_rng(0)
        n_keys = 73 if causal else 50
        q, k, v = (leaf(rng, (1, 2, n, width), dtype, device) for n in (40, n_keys, n_keys))
        for dropout_p in (0.0, 0.1):
            with ag.use_precision(precision), use_masks(MaskStream(0, first_example=3)):
                backward(F.scaled_dot_product_attention(q, k, v, causal=causal, dropout_p=dropout_p), rng)

    return case


def layer_norm(width, dtype):
    """Layer norm of 40 rows of `width`, plain and residual (with dropout): up to 1024 a warp per row,
    wider a block per row; the column sums of the gradients in two chunks of rows."""

    def case(device):
        rng = np.random.default_rng(0)
        x = leaf(rng, (40, width), dtype, device)
        weight, bias = (leaf(rng, (width,), np.float32, device) for _ in range(2))
        backward(F.layer_norm(x, weight, bias), rng)
        y, ln_bias = leaf(rng, (40, width), dtype, device), leaf(rng, (width,), np.float32, device)
        backward(F.residual_layer_norm(x, y, bias, weight, ln_bias, dropout_p=0.1), rng)

    return case


def cross_entropy(dtype):
    """Cross-entropy of 14 rows of 1000 classes, one target ignored."""

    def case(device):
        rng = np.random.default_rng(0)
        logits = leaf(rng, (2, 7, 1000), dtype, device)
        targets = rng.integers(0, 1000, (2, 7))
        targets[1, 3] = -100
        F.cross_entropy(logits, targets).backward()

    return case


def embedding(weight_dtype, out_dtype):
    """An embedding of 300 rows of 96 read as `weight_dtype`, written as `out_dtype`; its backward
    reads `out_dtype` and writes `weight_dtype`. Ids repeat, and some rows are never picked."""

    def case(device):
        rng = np.random.default_rng(0)
        weight = leaf(rng, (300, 96), weight_dtype, device)
        ids = backend.to_device(rng.integers(0, 200, (2, 30)), device)
        backward(Embedding.apply(ids, weight, dtype=np.dtype(out_dtype)), rng)

    return case


def gelu(dtype):
    """GELU of 40 rows of 1000 (two chunks of the bias gradient's sums), without a bias and with a
    float32 one."""

    def case(device):
        rng = np.random.default_rng(0)
        backward(F.gelu(leaf(rng, (40, 1000), dtype, device)), rng)
        bias = leaf(rng, (1000,), np.float32, device)
        backward(F.gelu(leaf(rng, (40, 1000), dtype, device), bias=bias), rng)

    return case


def dropout(dtype):
    """Dropout of 3 examples of 1000, numbered from 5."""

    def case(device):
        rng = np.random.default_rng(0)
        x = leaf(rng, (3, 1000), dtype, device)
        backward(F.dropout(x, 0.1, training=True, generator=MaskStream(0, first_example=5)), rng)

    return case


def adam(device):
    """Two steps of Adam, decoupled then coupled L2, each after clipping the gradients' norm (which
    clips: the norm is above 0.5): a matrix, a vector one chunk and one number long, a short one."""
    rng = np.random.default_rng(0)
    params = [leaf(rng, shape, np.float32, device) for shape in ((70, 90), (4097,), (3,))]
    for mode in ("decoupled", "coupled"):
        optimizer = Adam(params, lr=1e-3, l2=0.01, l2_mode=mode)
        for p in params:
            p.grad = backend.to_device(rng.standard_normal(p.shape).astype(np.float32), device)
        clip_grad_norm(params, 0.5)
        optimizer.step()


def model_step(precision):
    """A training step of a one-layer model (two heads of 64, 40 tokens, batch 2) under `precision`:
    the kernels as the model launches them, attention reading q, k and v out of one array."""

    def case(device):
        config = GPTConfig(vocab_size=300, n_ctx=40, n_embd=128, n_layer=1, n_head=2)
        ag.manual_seed(0)
        model = GPT(config).to(device).train()
        optimizer = Adam(model.parameters(), lr=1e-3, l2=0.01)
        ids = backend.to_device(np.random.default_rng(0).integers(0, 300, (2, 41)), device)
        with ag.use_precision(precision), use_masks(MaskStream(0)):
            F.cross_entropy(model(ids[:, :-1]), ids[:, 1:]).backward()
            clip_grad_norm(model.parameters(), 1.0)
            optimizer.step()

    return case


CASES = {
    **{
        f"attention-d{width}-{name}-{'causal' if causal else 'full'}": attention(width, dtype, causal)
        for width in (32, 64, 128)
        for name, dtype in DTYPES.items()
        for causal in (True, False)
    },
    **{
        f"attention-d{width}-tf32-{'causal' if causal else 'full'}": attention(
            width, np.float32, causal, "tf32"
        )
        for width in (32, 64)
        for causal in (True, False)
    },
    **{
        f"layer_norm-{path}-{name}": layer_norm(width, dtype)
        for path, width in (("warps", 100), ("blocks", 1500))
        for name, dtype in DTYPES.items()
    },
    **{f"cross_entropy-{name}": cross_entropy(dtype) for name, dtype in DTYPES.items()},
    **{
        f"embedding-{read}-{write}": embedding(DTYPES[read], DTYPES[write])
        for read in DTYPES
        for write in DTYPES
    },
    **{f"gelu-{name}": gelu(dtype) for name, dtype in DTYPES.items()},
    **{f"dropout-{name}": dropout(dtype) for name, dtype in DTYPES.items()},
    "adam-clip": adam,
    **{f"step-{precision}": model_step(precision) for precision in ("fp32", "bf16")},
}


def run(name, device):
    """Run one case and wait for its kernels; True when it finished."""
    try:
        CASES[name](device)
        if device.startswith("cuda:"):  # a launch's error shows when its kernel has run
            backend.cupy.cuda.Device(backend.gpu_index(device)).synchronize()
    except Exception:
        print(f"failed {name}: {traceback.format_exc()[-1000:]}", flush=True)
        return False
    print(f"done {name}", flush=True)
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("cases", nargs="*", metavar="CASE", help="cases to run (--list names them)")
    parser.add_argument("--all", action="store_true", help="run every case")
    parser.add_argument("--list", action="store_true", help="print the cases' names")
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cuda-emulated")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(CASES))
        return 0
    unknown = set(args.cases) - CASES.keys()
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}: --list names them")
    device = backend.parse_device(args.device)
    if device.startswith("cuda:"):
        backend.use_device(device)
        backend.cupy.cuda.set_allocator(None)  # no pool: each array its own allocation
    results = [run(name, device) for name in (list(CASES) if args.all else args.cases)]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
