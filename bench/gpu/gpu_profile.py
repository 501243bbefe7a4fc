"""Where a training step's GPU time goes, kernel by kernel: tinygpt beside PyTorch with SDPA, one
step of each precision under torch.profiler, which sees every kernel of the process (CuPy's too).

    PYTHONPATH=. python bench/gpu/gpu_profile.py [--out DIR] [--budget S] [--batch 8] [--precision ...]

For each precision (bf16, then tf32, then fp32, or those given; while the budget holds PRECISION_S
more) and each side, the step of bench/train_step.py (forward, loss, backward, Adam) after WARMUP
steps: its busy time (the union of its kernels' intervals), its wall time (the median of WALL_STEPS
steps without the profiler), and per category (autograd.gpu_costs.category: attention, matrix
products, layer norm, elementwise, reductions, casts, optimizer, ...) and per kernel name the
launches and the time.

Then the engine's own count of the same step's launches, made on the CPU (gpu_costs.count_launches
on the emulated device, its kernels and products not run), against the profiler's:
gpu_costs.compare, per category and per kernel of the project, with the differences.

Needs PyTorch and a GPU: elsewhere the part says so and stops.
"""

import os
import statistics
import sys
import time
from collections import Counter, defaultdict

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # the check's parts, and bench/'s torch_gpt and train_step
import gpu_report  # noqa: E402
import torch_gpt  # noqa: E402
import train_step  # noqa: E402

from autograd import backend, emulator, gpu_costs  # noqa: E402
from tinygpt import GPTConfig  # noqa: E402

PRECISIONS = ("bf16", "tf32", "fp32")
SIDES = {"tinygpt": "tinygpt", "torch-sdpa": "PyTorch SDPA"}
WARMUP, WALL_STEPS, TOP = 2, 3, 15
PRECISION_S = 20  # both sides' profiles and the engine's count, at GPT-1's size on an H100


def kernel_events(step, device):
    """(name, start µs, end µs) of every kernel, copy and memset the GPU ran for one step()."""
    from torch.profiler import ProfilerActivity, profile

    torch = torch_gpt.require_torch()
    torch.cuda.init()
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        step()
        synchronize(device)
    gpu = torch.autograd.DeviceType.CUDA
    return [(e.name, e.time_range.start, e.time_range.end) for e in profiler.events() if e.device_type == gpu]


def synchronize(device):
    """Wait for CuPy's and PyTorch's work on the device."""
    backend.cupy.cuda.Device(backend.gpu_index(device)).synchronize()
    torch_gpt.torch.cuda.synchronize()


def launches(step, device):
    """The kernels one step() launches, as the profiler counts them."""
    return sum(gpu_costs.is_kernel(name) for name, _, _ in kernel_events(step, device))


def busy_us(events):
    """Microseconds in which the GPU ran at least one of the events: their intervals' union."""
    total, reached = 0.0, -np.inf
    for _, start, end in sorted(events, key=lambda event: event[1]):
        if end > reached:
            total += end - max(start, reached)
            reached = end
    return total


def tally(events, key):
    """{key(name): {"launches", "ms"}} over the events, the most time first."""
    found = defaultdict(lambda: {"launches": 0, "ms": 0.0})
    for name, start, end in events:
        found[key(name)]["launches"] += 1
        found[key(name)]["ms"] += (end - start) / 1000
    ranked = sorted(found.items(), key=lambda item: -item[1]["ms"])
    return {k: {"launches": v["launches"], "ms": round(v["ms"], 3)} for k, v in ranked}


def summary(events, wall_s):
    """A side's profile: busy and wall time, launches, the time per category and per kernel (the TOP
    kernels), and the launches of every kernel by name."""
    return {
        "busy_ms": round(busy_us(events) / 1000, 2),
        "wall_ms": round(wall_s * 1000, 2),
        "launches": sum(gpu_costs.is_kernel(name) for name, _, _ in events),
        "categories": tally(events, gpu_costs.category),
        "kernels": dict(list(tally(events, lambda name: name).items())[:TOP]),
        "launches_by_name": dict(Counter(name for name, _, _ in events).most_common()),
    }


def profile_side(make_step, device):
    """(summary, kernel names) of one step of a side, after WARMUP steps."""
    step = make_step()
    for _ in range(WARMUP):
        step()
    walls = []
    for _ in range(WALL_STEPS):
        began = time.perf_counter()
        step()  # ends with a read of the loss: the GPU has finished
        walls.append(time.perf_counter() - began)
    events = kernel_events(step, device)
    return summary(events, statistics.median(walls)), [name for name, _, _ in events]


def engine_count(config, ids, precision, profiler_names):
    """gpu_costs.compare of the engine's count of the step (on the emulated device, nothing run)
    with the profiler's kernel names."""
    step, _ = train_step.tinygpt_step(config, ids, emulator.NAME, precision)
    with gpu_costs.count_launches(run=False) as counted, np.errstate(all="ignore"):
        step()  # on arrays the kernels and products left unwritten
    return gpu_costs.compare(counted, profiler_names)


def counts_agree(figures):
    """Whether the engine's count equals the profiler's in every category but the matrix products,
    whose kernels cuBLAS chooses (gpu_costs leaves them to it)."""
    counted = figures.get("engine_count", {})
    if "error" in counted:
        return False
    products = {"total", "matrix products"}
    return all(line.split(":")[0] in products for line in counted.get("differences", []))


def profile_precision(args, config, precision):
    """Both sides' profiles at one precision, and the engine's count against the profiler's."""
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (args.batch, args.seq + 1))
    makers = {
        "tinygpt": lambda: train_step.tinygpt_step(config, ids, args.device, precision)[0],
        "torch-sdpa": lambda: train_step.torch_step(
            config, ids, os.cpu_count(), args.device, precision, "torch-sdpa"
        ),
    }
    figures, names = {}, {}
    for side, make_step in makers.items():
        try:
            figures[side], names[side] = profile_side(make_step, args.device)
        except Exception as error:
            figures[side] = {"error": gpu_report.failure(error)}
    if "tinygpt" in names:
        try:
            figures["engine_count"] = engine_count(config, ids, precision, names["tinygpt"])
        except Exception as error:
            figures["engine_count"] = {"error": gpu_report.failure(error)}
    return figures


def side_table(figures):
    """Per category, each side's milliseconds and launches."""
    sides = [side for side in SIDES if "categories" in figures.get(side, {})]
    lines = ["| category | " + " | ".join(f"{SIDES[s]} ms (launches)" for s in sides) + " |"]
    lines.append("|" + " --- |" * (len(sides) + 1))
    for kind in gpu_costs.CATEGORIES:
        cells = [figures[s]["categories"].get(kind) for s in sides]
        if any(cells):
            shown = (f"{c['ms']:.2f} ({c['launches']})" if c else "" for c in cells)
            lines.append(f"| {kind} | " + " | ".join(shown) + " |")
    return lines


def kernel_table(side, profile):
    lines = [f"| {SIDES[side]}: kernel | category | ms | launches |", "| --- | --- | --- | --- |"]
    for name, k in profile["kernels"].items():
        lines.append(f"| `{name[:100]}` | {gpu_costs.category(name)} | {k['ms']:.2f} | {k['launches']} |")
    return lines


def last_line(error):
    return error.strip().splitlines()[-1]


def headline(figures):
    """A precision's lines above its tables: each side's times, and the engine's count."""
    lines = [f"- not run: {figures['not_run']}"] if "not_run" in figures else []
    for side, name in SIDES.items():
        profile = figures.get(side, {})
        if "error" in profile:
            lines.append(f"- {name}: FAILED, {last_line(profile['error'])}")
        elif profile:
            times = f"{profile['busy_ms']} ms busy, {profile['wall_ms']} ms wall"
            lines.append(f"- {name}: {times}, {profile['launches']} launches")
    counted = figures.get("engine_count", {})
    if "error" in counted:
        lines.append(f"- the engine's count on the CPU: FAILED, {last_line(counted['error'])}")
    elif counted:
        model, profiler = counted["total"]
        agree = "the same" if not counted["differences"] else "differences:"
        lines.append(
            f"- launches counted by the engine on the CPU {model}, by the profiler {profiler}: {agree}"
        )
        lines += [f"  - {difference}" for difference in counted["differences"]]
    return lines


def markdown(data):
    if "skipped" in data:
        return f"Skipped: {data['skipped']}."
    lines = []
    for precision, figures in data["precisions"].items():
        lines += ["", f"### {precision}, batch {data['batch']}", "", *headline(figures)]
        lines += ["", *side_table(figures)]
        for side in SIDES:
            if "kernels" in figures.get(side, {}):
                lines += ["", *kernel_table(side, figures[side])]
    return "\n".join(lines).strip()


def main(argv=None):
    parser = gpu_report.parser(__doc__, model=True)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--precision", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    args = parser.parse_args(argv)
    backend.use_device(args.device)
    budget = gpu_report.Budget(args.budget)
    record = gpu_report.Record("profile", args, markdown)
    record["batch"], record["seq"], record["precisions"] = args.batch, args.seq, {}
    if not gpu_report.on_gpu(args.device) or torch_gpt.torch is None:
        record["skipped"] = "the profile needs a GPU and PyTorch (torch.profiler)"
        record.save()
        return 0
    config = GPTConfig.preset(args.preset)
    for precision in args.precision:
        if not budget.allows(PRECISION_S):
            record["precisions"][precision] = {"not_run": f"{budget.left():.0f} s of the budget left"}
            continue
        record["precisions"][precision] = figures = profile_precision(args, config, precision)
        if any("error" in figures.get(side, {}) for side in SIDES) or not counts_agree(figures):
            record.fail()
        record.save()
    record.save()
    return record.exit_status()


if __name__ == "__main__":
    sys.exit(main())
