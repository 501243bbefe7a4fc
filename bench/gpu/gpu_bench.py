"""tinygpt against PyTorch on one GPU: a GPT-1 training step (forward, loss, backward, Adam), side
by side.

    PYTHONPATH=. python bench/gpu/gpu_bench.py [--batch 8 32] [--precision bf16 tf32 fp32]
                                           [--sides ...] [--steps 5] [--budget S] [--out DIR]

The sides, each alone (built, warmed up, timed, then freed):
    tinygpt         the engine
    torch-sdpa      a plain PyTorch GPT-1 whose attention is torch's scaled_dot_product_attention
                    (cuDNN's flash attention on an H100): the strongest eager baseline
    transformers    transformers' OpenAIGPTLMHeadModel, as a user of it would run it
    torch-compile   the SDPA model under torch.compile (tens of seconds to compile per shape)
PyTorch's tf32 is its TF32 switches, its bf16 autocast. Each side's tokens/s, peak memory (CuPy's
pool; torch.cuda.max_memory_allocated), kernel launches per step (torch.profiler) and MFU (6N + 12
L D T FLOPs per token against the GPU's dense peak); each row's tinygpt / SDPA and tinygpt / compile.

The measurements go in order of use, each only where the budget still holds what it needs
(needs_s): the eager sides row by row, bf16 before tf32 before fp32, batch 8 before 32; then
torch.compile, bf16 first, the largest batch first. What does not fit is recorded as not run. A
side that fails keeps its error, the table says FAILED, and the exit status is 1. On the CPU
(--device cpu, a small --preset and --seq) the same logic runs, without memory figures or launches.
"""

import gc
import os
import statistics
import sys
import time
from collections import defaultdict

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # the check's parts, and bench/'s torch_gpt and train_step
import gpu_profile  # noqa: E402
import gpu_report  # noqa: E402
import torch_gpt  # noqa: E402
import train_step  # noqa: E402

from autograd import backend  # noqa: E402
from tinygpt import GPT, GPTConfig  # noqa: E402

SIDES = {"tinygpt": "tinygpt", "torch-sdpa": "SDPA", "transformers": "HF", "torch-compile": "compile"}
EAGER = ("tinygpt", "torch-sdpa", "transformers")
WARMUP = 2


def plan(args):
    """(side, batch, precision) in the order they are measured: the eager sides row by row, then
    torch.compile's rows, the largest batch of each precision first: bf16 at batch 32 is the figure
    to beat."""
    rows = [(batch, precision) for precision in args.precision for batch in args.batch]
    eager = [(side, *row) for row in rows for side in EAGER if side in args.sides]
    largest_first = [(batch, precision) for precision in args.precision for batch in sorted(args.batch)[::-1]]
    return eager + [("torch-compile", *row) for row in largest_first if "torch-compile" in args.sides]


def needs_s(side, batch):
    """The seconds one side takes on an H100, its model built (and compiled) and its steps timed."""
    return (60 if side == "torch-compile" else 10) + batch / 3


def make_step(side, config, ids, device, precision):
    """A function that runs one training step of `side` and reads its loss back."""
    if side == "tinygpt":
        return train_step.tinygpt_step(config, ids, device, precision)[0]
    torch_device = device if gpu_report.on_gpu(device) else "cpu"
    return train_step.torch_step(config, ids, os.cpu_count(), torch_device, precision, side)


def measure(side, config, ids, args, precision):
    """One side's figures at one batch and precision: tokens/s, peak GB, launches per step."""
    free_gpu_memory(args.device)
    step = make_step(side, config, ids, args.device, precision)
    for _ in range(WARMUP):
        step()  # compiles, and fills the caches and the memory pool
    times = []
    for _ in range(args.steps):
        began = time.perf_counter()
        step()  # ends with a read of the loss: the GPU has finished
        times.append(time.perf_counter() - began)
    tokens = ids.shape[0] * (ids.shape[1] - 1)
    figures = {"tok_s": round(tokens / statistics.median(times), 1), "peak_gb": None, "launches": None}
    if gpu_report.on_gpu(args.device):
        figures["peak_gb"] = round(peak_gb(side), 2)
        figures["launches"] = gpu_profile.launches(step, args.device) if torch_gpt.torch else None
    return figures


def free_gpu_memory(device):
    """Give back what the last side held, so that the next side's peak is its own."""
    gc.collect()
    if gpu_report.on_gpu(device):
        backend.cupy.get_default_memory_pool().free_all_blocks()
        if torch_gpt.torch is not None:
            torch_gpt.torch.cuda.empty_cache()
            torch_gpt.torch.cuda.reset_peak_memory_stats()


def peak_gb(side):
    if side == "tinygpt":
        return backend.cupy.get_default_memory_pool().total_bytes() / 1e9
    return torch_gpt.torch.cuda.max_memory_allocated() / 1e9


def row_of(rows, batch, precision):
    found = next((r for r in rows if r["batch"] == batch and r["precision"] == precision), None)
    if found is None:
        found = {"batch": batch, "precision": precision, "sides": {}}
        rows.append(found)
    return found


def ratios(row, flops, peaks):
    """tinygpt's tokens/s over SDPA's and over compile's; each side's MFU where the GPU's peak is known."""
    rate = {side: figures.get("tok_s") for side, figures in row["sides"].items()}
    for other, key in (("torch-sdpa", "ratio_sdpa"), ("torch-compile", "ratio_compile")):
        if rate.get("tinygpt") and rate.get(other):
            row[key] = round(rate["tinygpt"] / rate[other], 3)
    peak = peaks.get(row["precision"])
    for figures in row["sides"].values():
        if peak and figures.get("tok_s"):
            figures["mfu"] = round(figures["tok_s"] * flops / (peak * 1e12), 4)


def run(args, record, budget):
    """Every planned measurement that fits in the budget, the record saved after each."""
    config = GPTConfig.preset(args.preset)
    flops = train_step.flops_per_token(config, GPT(config).num_parameters(), args.seq)
    peaks = next((p for name, p in train_step.PEAK_TFLOPS.items() if name in record["device"]["name"]), {})
    for side, batch, precision in plan(args):
        row = row_of(record["rows"], batch, precision)
        if not budget.allows(needs_s(side, batch)):
            row["sides"][side] = {"not_run": f"{budget.left():.0f} s of the budget left"}
        else:
            ids = np.random.default_rng(0).integers(0, config.vocab_size, (batch, args.seq + 1))
            try:
                row["sides"][side] = measure(side, config, ids, args, precision)
            except BaseException as error:  # a missing package is a SystemExit: the other sides go on
                if isinstance(error, KeyboardInterrupt):
                    raise
                row["sides"][side] = {"error": gpu_report.failure(error)}
                record.fail()
        ratios(row, flops, peaks)
        record.save()


def cell(figures, key, form="{:,.0f}"):
    """A side's figure for the table: the number, FAILED, "not run", or "n/a" where none is measured."""
    if figures is None:
        return ""
    if "error" in figures:
        return "FAILED"
    if "not_run" in figures:
        return "not run"
    value = figures.get(key)
    return "n/a" if value is None else form.format(value)


def table(rows):
    """The rows as a Markdown table (docs/performance.md), and below it each failure's last line with
    the sides and rows it stopped."""
    short = " / ".join(SIDES.values())
    head = ["batch", "precision", *(f"{name} tok/s" for name in SIDES.values()), "tinygpt / SDPA"]
    head += ["tinygpt / compile", f"peak GB {short}", "launches tinygpt / SDPA", "MFU tinygpt / SDPA"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        sides = [r["sides"].get(side) for side in SIDES]
        cells = [str(r["batch"]), r["precision"], *(cell(s, "tok_s") for s in sides)]
        cells += [str(r.get("ratio_sdpa", "")), str(r.get("ratio_compile", ""))]
        cells.append(" / ".join(cell(s, "peak_gb", "{:.2f}") for s in sides))
        cells.append(" / ".join(cell(s, "launches") for s in sides[:2]))
        cells.append(" / ".join(cell(s, "mfu", "{:.1%}") for s in sides[:2]))
        lines.append("| " + " | ".join(cells) + " |")
    failures = defaultdict(list)
    for r in rows:
        for side, figures in r["sides"].items():
            if "error" in figures:
                failures[figures["error"].strip().splitlines()[-1]].append(
                    f"{side} {r['batch']} {r['precision']}"
                )
    lines += [f"- FAILED: {', '.join(where)}: {error}" for error, where in failures.items()]
    return "\n".join(lines)


def markdown(data):
    return f"GPT-1 preset `{data['preset']}`, T {data['seq']}.\n\n" + table(data["rows"])


def main(argv=None):
    parser = gpu_report.parser(__doc__, model=True)
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 32])
    parser.add_argument(
        "--precision", nargs="+", default=["bf16", "tf32", "fp32"], choices=["bf16", "tf32", "fp32"]
    )
    parser.add_argument("--sides", nargs="+", default=list(SIDES), choices=list(SIDES))
    parser.add_argument("--steps", type=int, default=5, help="timed steps of each side")
    args = parser.parse_args(argv)
    backend.use_device(args.device)
    record = gpu_report.Record("bench", args, markdown)
    record["preset"], record["seq"], record["rows"] = args.preset, args.seq, []
    run(args, record, gpu_report.Budget(args.budget))
    print(table(record["rows"]))
    return record.exit_status()


if __name__ == "__main__":
    sys.exit(main())
