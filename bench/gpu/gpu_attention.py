"""Attention on a GPU, forward and backward: tinygpt's kernels (autograd/kernels/cuda/attention.cu: on
tensor cores in bf16 and tf32) against PyTorch's scaled_dot_product_attention, the same computation on
the same packed qkv: GPT-1's attention, causal, T 512, 12 heads of 64, batch 8 and 32, with GPT-1's
attention dropout (0.1) and without. Milliseconds per forward and backward (the median of --repeat,
each waited for) and tinygpt's time over PyTorch's; the target in bf16 is 2x or less.

    PYTHONPATH=. python bench/gpu/gpu_attention.py [--out DIR] [--budget S]
    PYTHONPATH=. python bench/gpu/gpu_attention.py --device cuda-emulated --batch 1 --seq 64 --repeat 1 \
        --out DIR

(the second tries its logic on a CPU, PyTorch there on the CPU: its times mean nothing).
"""

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # the check's parts, and bench/'s torch_gpt and train_step
import gpu_report  # noqa: E402
import torch_gpt  # noqa: E402

import autograd as ag  # noqa: E402
from autograd import functional as F  # noqa: E402
from autograd import random  # noqa: E402

HEADS, WIDTH = 12, 64
PRECISIONS = ("bf16", "tf32")
DROPOUTS = (0.0, 0.1)


def tinygpt_attention(device, precision, batch, seq, dropout_p):
    """One forward and backward of F.multi_head_attention on qkv (batch, seq, 3 x 768)."""
    dtype = ag.bfloat16 if precision == "bf16" else np.float32
    rng = np.random.default_rng(0)
    qkv = ag.tensor(rng.standard_normal((batch, seq, 3 * HEADS * WIDTH)), dtype=dtype, device=device)
    qkv.requires_grad = True
    grad = ag.tensor(rng.standard_normal((batch, seq, HEADS * WIDTH)), dtype=dtype, device=device)
    generator = random.MaskStream(0)

    def run():
        with ag.use_precision("tf32" if precision == "tf32" else None):
            qkv.grad = None
            out = F.multi_head_attention(qkv, HEADS, dropout_p=dropout_p, generator=generator)
            out.backward(grad.data)

    return run


def torch_attention(device, precision, batch, seq, dropout_p):
    """The same in PyTorch: q, k, v viewed out of qkv, scaled_dot_product_attention, causal."""
    torch = torch_gpt.torch
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    on = "cuda" if gpu_report.on_gpu(device) else "cpu"
    qkv = torch.randn(batch, seq, 3 * HEADS * WIDTH, device=on, dtype=dtype, requires_grad=True)
    grad = torch.randn(batch, seq, HEADS * WIDTH, device=on, dtype=dtype)

    def run():
        qkv.grad = None
        heads = qkv.view(batch, seq, 3, HEADS, WIDTH).permute(2, 0, 3, 1, 4)  # (3, batch, heads, seq, width)
        q, k, v = heads.unbind(0)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        y.transpose(1, 2).reshape(batch, seq, -1).backward(grad)

    return run


def milliseconds(run, args):
    return round(gpu_report.median_seconds(run, args.repeat, args.device) * 1e3, 3)


def measure(args, precision, batch, dropout_p):
    """One row: both sides' milliseconds and their ratio (PyTorch's side None where it is missing)."""
    shape = (args.device, precision, batch, args.seq, dropout_p)
    row = {"precision": precision, "batch": batch, "seq": args.seq, "dropout": dropout_p}
    row["tinygpt_ms"] = milliseconds(tinygpt_attention(*shape), args)
    row["torch_ms"] = None
    if torch_gpt.torch is not None:
        row["torch_ms"] = milliseconds(torch_attention(*shape), args)
        row["ratio"] = round(row["tinygpt_ms"] / row["torch_ms"], 2)
    return row


def markdown(data):
    if "skipped" in data:
        return f"Skipped: {data['skipped']}."
    lines = [
        "| precision | batch | dropout | tinygpt ms | PyTorch SDPA ms | tinygpt / SDPA |",
        "|" + " --- |" * 6,
    ]
    for row in data["rows"]:
        sdpa = "not run" if row["torch_ms"] is None else row["torch_ms"]
        ratio = row.get("ratio", "")
        cells = [row["precision"], row["batch"], row["dropout"], row["tinygpt_ms"], sdpa, ratio]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    shape = f"causal, T {data['seq']}, {HEADS} heads of {WIDTH}"
    lines.append(f"\nForward and backward, {shape}; the median of {data['repeat']}.")
    return "\n".join(lines + [f"- {row}" for row in data.get("not_run", [])])


def main(argv=None):
    parser = gpu_report.parser(__doc__)
    parser.add_argument("--batch", type=gpu_report.whole, nargs="+", default=[8, 32])
    parser.add_argument("--seq", type=gpu_report.whole, default=512)
    parser.add_argument("--precision", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    parser.add_argument("--repeat", type=gpu_report.whole, default=20)
    args = parser.parse_args(argv)
    record = gpu_report.Record("attention", args, markdown)
    record["seq"], record["repeat"], record["rows"], record["not_run"] = args.seq, args.repeat, [], []
    budget = gpu_report.Budget(args.budget)
    for precision in args.precision:
        for batch in args.batch:
            for dropout_p in DROPOUTS:
                if not budget.allows(2 + batch / 4):
                    record["not_run"].append(f"{precision}, batch {batch}, dropout {dropout_p}: out of time")
                    continue
                record["rows"].append(measure(args, precision, batch, dropout_p))
                record.save()
    record.save()
    return record.exit_status()


if __name__ == "__main__":
    sys.exit(main())
