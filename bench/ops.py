"""Forward + backward time of each heavy op of a GPT-1 step, tinygpt against plain NumPy.

    python bench/ops.py [--threads N] [--repeat 7] [--json PATH]

Each op runs at GPT-1's sizes (one sequence of 512 tokens, width 768, 12 heads, 40478 classes)
twice: through tinygpt (a Function's forward, then backward from a fixed upstream gradient) and
as the fastest plain-NumPy code of the same math written out by hand, with no graph at all. The
ratio shows what the engine costs on top of the arithmetic, and the times show where a training
step goes. Adam is one update of all 116M parameters of GPT-1. Medians of --repeat runs.
"""

import argparse
import json
import math
import os
import statistics
import time

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--threads", type=int, default=os.cpu_count())
parser.add_argument("--repeat", type=int, default=7)
parser.add_argument("--json", help="write the figures to this file")
ARGS = parser.parse_args() if __name__ == "__main__" else None
if ARGS is not None:  # before numpy loads: OpenBLAS reads this once, at import
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(ARGS.threads)

import numpy as np  # noqa: E402

import autograd as ag  # noqa: E402
from autograd import functional as F  # noqa: E402
from autograd.optim import Adam  # noqa: E402
from tinygpt import GPT, GPTConfig  # noqa: E402

T, D, H, V, P = 512, 768, 12, 40478, 0.1  # tokens, width, heads, classes, dropout
rng = np.random.default_rng(0)


def normal(*shape):
    return rng.standard_normal(shape, dtype=np.float32)


def tinygpt_case(fn, *arrays):
    """A run of fn's forward and backward through the engine, on fresh leaf tensors."""
    upstream = None

    def run():
        nonlocal upstream
        leaves = [ag.Tensor(a, requires_grad=True) for a in arrays]
        out = fn(*leaves)
        if upstream is None:
            upstream = normal(*out.shape) if out.ndim else np.ones((), np.float32)
        out.backward(upstream)

    return run


# ----- plain NumPy: forward and backward of the same math, written out for speed
def numpy_embedding(ids, table, grad):
    out = table[ids]
    grad_table = np.zeros_like(table)
    np.add.at(grad_table, ids, grad)
    return out, grad_table


def numpy_linear(x, w, b, grad):
    out = x @ w
    out += b
    return out, grad @ w.T, x.T @ grad, grad.sum(axis=0)


def numpy_softmax(x, grad):
    out = x - x.max(axis=-1, keepdims=True)
    np.exp(out, out=out)
    out /= out.sum(axis=-1, keepdims=True)
    grad_x = grad * out
    grad_x -= out * grad_x.sum(axis=-1, keepdims=True)
    return out, grad_x


def numpy_attention(q, k, v, grad, generator):
    scores = (q * (1 / math.sqrt(q.shape[-1]))) @ k.swapaxes(-1, -2)
    np.copyto(scores, -np.inf, where=~np.tri(T, T, dtype=bool))
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores, out=scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    weights = probs * (generator.random(probs.shape, dtype=np.float32) >= P)
    weights *= 1 / (1 - P)
    out = weights @ v
    grad_v = weights.swapaxes(-1, -2) @ grad
    grad_scores = grad @ v.swapaxes(-1, -2)
    grad_scores *= weights
    grad_scores -= probs * grad_scores.sum(axis=-1, keepdims=True)
    return out, grad_scores @ k / math.sqrt(q.shape[-1]), grad_scores.swapaxes(-1, -2) @ q, grad_v


def numpy_layer_norm(x, w, b, grad):
    normed = x - x.mean(axis=-1, keepdims=True)
    rstd = 1 / np.sqrt((normed * normed).mean(axis=-1, keepdims=True) + 1e-5)
    normed *= rstd
    out = normed * w + b
    g = grad * w
    grad_x = g - g.mean(axis=-1, keepdims=True)
    grad_x -= normed * (g * normed).mean(axis=-1, keepdims=True)
    grad_x *= rstd
    return out, grad_x, (grad * normed).sum(axis=0), grad.sum(axis=0)


def numpy_gelu(x, grad):
    c = math.sqrt(2 / math.pi)
    t = np.tanh(c * (x + 0.044715 * x * x * x))
    out = 0.5 * x * (1 + t)
    slope = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x)
    return out, grad * slope


def numpy_cross_entropy(logits, targets):
    shifted = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(shifted)
    total = probs.sum(axis=1, keepdims=True)
    loss = (np.log(total[:, 0]) - shifted[np.arange(len(targets)), targets]).mean()
    probs /= total
    probs[np.arange(len(targets)), targets] -= 1
    probs /= len(targets)
    return loss, probs


def numpy_adam(params, grads, ms, vs, lr=2.5e-4, b1=0.9, b2=0.999, eps=1e-8, l2=0.01, t=1):
    lr_t = lr * math.sqrt(1 - b2**t) / (1 - b1**t)
    for p, g, m, v in zip(params, grads, ms, vs):
        m *= b1
        m += (1 - b1) * g
        v *= b2
        v += (1 - b2) * g * g
        update = np.sqrt(v)
        update += eps
        np.divide(m, update, out=update)
        if p.ndim > 1:
            update += l2 * p
        update *= lr_t
        p -= update


def cases():
    """(name, shape, tinygpt run, numpy run) for each op."""
    x, g = normal(T, D), normal(T, D)
    ids = rng.integers(0, V, T)
    table, w, b = normal(V, D) * 0.02, normal(D, 4 * D) * 0.02, normal(4 * D)
    q, k, v = (normal(1, H, T, D // H) for _ in range(3))
    scores, h = normal(H, T, T), normal(T, 4 * D)
    logits, targets = normal(T, V), rng.integers(0, V, T)
    stream, numpy_rng = ag.random.MaskStream(0), np.random.default_rng(0)  # dropout masks of each side
    yield (
        "embedding",
        f"{T} ids of {V}x{D}",
        tinygpt_case(lambda t: F.embedding(ids, t), table),
        lambda: numpy_embedding(ids, table, g),
    )
    yield (
        "linear",
        f"{T}x{D} @ {D}x{4 * D}",
        tinygpt_case(F.linear, x, w, b),
        lambda: numpy_linear(x, w, b, h),
    )
    yield (
        "attention",
        f"{H} heads, {T}x{T}, causal, dropout {P}",
        tinygpt_case(lambda *a: F.scaled_dot_product_attention(*a, dropout_p=P, generator=stream), q, k, v),
        lambda: numpy_attention(q, k, v, q, numpy_rng),
    )
    if hasattr(F, "multi_head_attention"):  # the fused op GPT's blocks use (not in older tinygpt)
        qkv = np.concatenate([a.transpose(0, 2, 1, 3).reshape(1, T, D) for a in (q, k, v)], axis=-1)
        yield (
            "multi-head attn",
            f"qkv 1x{T}x{3 * D}, {H} heads, dropout {P}",
            tinygpt_case(lambda x: F.multi_head_attention(x, H, dropout_p=P, generator=stream), qkv),
            lambda: numpy_attention(q, k, v, q, numpy_rng),
        )
    yield ("softmax", f"{H}x{T}x{T}", tinygpt_case(F.softmax, scores), lambda: numpy_softmax(scores, scores))
    yield (
        "layer norm",
        f"{T}x{D}",
        tinygpt_case(F.layer_norm, x, normal(D), normal(D)),
        lambda: numpy_layer_norm(x, b[:D], b[D : 2 * D], g),
    )
    yield ("gelu", f"{T}x{4 * D}", tinygpt_case(F.gelu, h), lambda: numpy_gelu(h, h))
    yield (
        "cross-entropy",
        f"{T}x{V}",
        tinygpt_case(lambda z: F.cross_entropy(z, targets), logits),
        lambda: numpy_cross_entropy(logits, targets),
    )
    yield adam_case()


def adam_case():
    """One Adam step over GPT-1's 116M parameters, with gradients in place."""
    model = GPT(GPTConfig.gpt1())
    params = model.parameters()
    for p in params:
        p.grad = rng.standard_normal(p.shape, dtype=np.float32) * 1e-3
    optimizer = Adam(params, lr=2.5e-4, l2=0.01)
    arrays = [p.data.copy() for p in params]
    grads = [p.grad for p in params]
    moments = [np.zeros_like(a) for a in arrays], [np.zeros_like(a) for a in arrays]
    count = sum(p.size for p in params)
    return (
        "adam",
        f"{count / 1e6:.1f}M parameters",
        optimizer.step,
        lambda: numpy_adam(arrays, grads, *moments),
    )


def median_ms(run, repeat):
    run()  # warm up: first-touch page faults, BLAS buffers
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main(args):
    rows = []
    print(f"forward + backward, median of {args.repeat}, {args.threads} threads, numpy {np.__version__}")
    print(f"{'op':14s} {'shape':34s} {'tinygpt ms':>11s} {'numpy ms':>9s} {'ratio':>6s}")
    for name, shape, ours, plain in cases():
        ours_ms, plain_ms = median_ms(ours, args.repeat), median_ms(plain, args.repeat)
        rows.append(
            {"op": name, "shape": shape, "tinygpt_ms": round(ours_ms, 2), "numpy_ms": round(plain_ms, 2)}
        )
        print(f"{name:14s} {shape:34s} {ours_ms:11.2f} {plain_ms:9.2f} {ours_ms / plain_ms:6.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "numpy": np.__version__, "ops": rows}, f, indent=2)


if __name__ == "__main__":
    main(ARGS)
