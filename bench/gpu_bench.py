"""tinygpt against PyTorch eager on one GPU: a GPT-1 training step, side by side.

    PYTHONPATH=. python bench/gpu_bench.py [--batch 8 32] [--precision tf32 bf16] [--compile] [--out DIR]

For each batch and precision, each side alone (built, warmed up, timed over --steps steps, then
freed): tinygpt; transformers' OpenAIGPTLMHeadModel as a user would run it; a plain PyTorch GPT-1
whose attention is torch's scaled_dot_product_attention (the strongest eager baseline); with
--compile, that model under torch.compile too. PyTorch's tf32 is its TF32 switches, its bf16 is
autocast. Each row records tokens/s, tinygpt / PyTorch (the SDPA baseline), peak memory of both
(CuPy's pool against torch.cuda.max_memory_allocated), kernel launches per step and the MFU
(nanoGPT's 6N + 12 L D T FLOPs per token against the GPU's dense peak). Writes
bench/results/gpu-bench-<device>.json (and a copy in --out or $OUT), and prints a Markdown table.
"""

import argparse
import gc
import json
import os
import re
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_check  # noqa: E402
import torch_gpt  # noqa: E402
import train_step  # noqa: E402

from autograd import backend  # noqa: E402
from tinygpt import GPTConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="gpt1")
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--precision", nargs="+", default=["tf32", "bf16"], choices=["fp32", "tf32", "bf16"])
    parser.add_argument("--steps", type=int, default=10, help="timed steps of each side")
    parser.add_argument("--compile", action="store_true", help="also time the SDPA model under torch.compile")
    parser.add_argument("--out", default=os.environ.get("OUT"))
    return parser.parse_args(argv)


def time_side(make_step, steps):
    """(median seconds per step, kernel launches of one step) of a side built by make_step()."""
    free_gpu_memory()
    step = make_step()
    for _ in range(3):
        step()  # compiles and fills the caches
    launches, _ = gpu_check.count_launches(step)
    times = []
    for _ in range(steps):
        began = time.perf_counter()
        step()  # ends with a read of the loss, so the GPU has finished
        times.append(time.perf_counter() - began)
    return statistics.median(times), launches


def free_gpu_memory():
    """Give back what the last side held, so that the next side's peak is its own."""
    gc.collect()
    backend.cupy.get_default_memory_pool().free_all_blocks()
    torch = torch_gpt.require_torch()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def peak_gb(side):
    if side == "tinygpt":
        return backend.cupy.get_default_memory_pool().total_bytes() / 1e9
    return torch_gpt.torch.cuda.max_memory_allocated() / 1e9


def torch_side(config, ids, precision, baseline):
    """A PyTorch step of one baseline; torch-compile is the SDPA model under torch.compile."""
    if baseline == "torch-compile":
        torch = torch_gpt.require_torch()
        train_step.BASELINES[baseline] = lambda c: torch.compile(torch_gpt.GPT(c, sdpa=True))
    return train_step.torch_step(config, ids, os.cpu_count(), "cuda", precision, baseline)


def measure(args, config, batch, precision, flops_per_token, peak_tflops):
    """One row: every side's tokens/s, peak memory and launches at one batch and precision; the
    ratio against the SDPA baseline, and tinygpt's MFU."""
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (batch, args.seq + 1))
    sides = {"tinygpt": lambda: train_step.tinygpt_step(config, ids, "cuda", precision)[0]}
    for baseline in ("transformers", "torch-sdpa") + (("torch-compile",) if args.compile else ()):
        sides[baseline] = lambda b=baseline: torch_side(config, ids, precision, b)
    row = {"config": args.preset, "batch": batch, "seq": args.seq, "precision": precision}
    for side, make_step in sides.items():
        try:
            seconds, launches = time_side(make_step, args.steps)
        except Exception as error:  # one side failing (out of memory, a missing package) keeps the rest
            row[f"{side}_error"] = f"{type(error).__name__}: {error}"[:300]
            continue
        row[f"{side}_tok_s"] = round(batch * args.seq / seconds, 1)
        row[f"{side}_peak_mem_gb"] = round(peak_gb(side), 2)
        row[f"{side}_launches_per_step"] = launches
    tinygpt, pytorch = row.get("tinygpt_tok_s"), row.get("torch-sdpa_tok_s")
    row.update(
        tinygpt_tok_s=tinygpt,
        pytorch_tok_s=pytorch,
        ratio=round(tinygpt / pytorch, 3) if tinygpt and pytorch else None,
        tinygpt_peak_mem_gb=row.get("tinygpt_peak_mem_gb"),
        pytorch_peak_mem_gb=row.get("torch-sdpa_peak_mem_gb"),
        launches_per_step=row.get("tinygpt_launches_per_step"),
        mfu=round(tinygpt * flops_per_token / (peak_tflops * 1e12), 4) if tinygpt and peak_tflops else None,
    )
    return row


def table(rows):
    """The rows as a Markdown table (docs/performance.md)."""
    lines = [
        "| batch | precision | tinygpt tok/s | PyTorch SDPA tok/s | ratio | transformers tok/s "
        "| peak GB tinygpt / PyTorch | launches | MFU |",
        "|" + " --- |" * 9,
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['precision']} | {r['tinygpt_tok_s']} | {r['pytorch_tok_s']} | {r['ratio']} "
            f"| {r.get('transformers_tok_s')} | {r['tinygpt_peak_mem_gb']} / {r['pytorch_peak_mem_gb']} "
            f"| {r['launches_per_step']} | {r['mfu']} |"
        )
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    backend.use_device(backend.parse_device("cuda"))
    config = GPTConfig.preset(args.preset)
    device = gpu_check.describe("cuda")
    peaks = next((p for name, p in train_step.PEAK_TFLOPS.items() if name in device["name"]), {})
    flops = train_step.flops_per_token(config, train_step.GPT(config).num_parameters(), args.seq)
    rows = [
        measure(args, config, batch, precision, flops, peaks.get(precision))
        for batch in args.batch
        for precision in args.precision
    ]
    report = {
        "device": device,
        "versions": gpu_check.versions(),
        "date": date.today().isoformat(),
        "rows": rows,
    }
    name = re.sub(r"[^a-z0-9]+", "-", device["name"].lower()).strip("-")
    text = json.dumps(report, indent=2)
    (ROOT / "bench" / "results" / f"gpu-bench-{name}.json").write_text(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"gpu-bench-{name}.json").write_text(text)
    print(table(rows))


if __name__ == "__main__":
    main()
