"""Time a GPT-1 training step (forward, cross-entropy, backward, Adam) in tinygpt and in PyTorch.

    python bench/train_step.py --config small        # 4 x 256 wide, vocab 8192, batch 8 x 256
    python bench/train_step.py --config gpt1-width   # 2 x 768 wide, vocab 40478, batch 1 x 512
    python bench/train_step.py --config gpt1 --no-memory   # the full gpt1 preset, batch 1 x 512
    python bench/train_step.py --preset mini --batch 8 --seq 256 [--device cpu|cuda] [--json PATH]
    python bench/train_step.py --preset gpt1 --batch 8 --device cuda --precision bf16 --no-memory

Both models have the same architecture, config, batch, dropout and thread count. Their steps run
in alternating rounds in this one process (so both see the same load on a shared machine) and
the median of the rounds is reported. Peak memory is measured separately for each side, each in
a child process of its own: the growth of the peak resident set size (VmHWM) over the resident
size after the imports, so the libraries' own code is not counted.

With --apart each side is also timed alone, in processes of its own taking turns, so that
neither finds the other's memory or threads in its way. PyTorch is optional (bench/torch_gpt.py
says how to install it); --no-torch times tinygpt alone.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import date

CONFIGS = {  # name: (preset, overrides, batch)
    "small": ("mini", {"vocab_size": 8192}, 8),
    "gpt1-width": ("gpt1", {"n_layer": 2}, 1),
    "gpt1": ("gpt1", {}, 1),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", choices=CONFIGS, help="one of the benchmark's configurations")
    parser.add_argument("--preset", default="mini")
    parser.add_argument("--vocab-size", type=int, default=None, help="override the preset's vocabulary")
    parser.add_argument("--n-layer", type=int, default=None, help="override the preset's number of layers")
    parser.add_argument(
        "--batch", type=int, default=None, help="sequences per step (default 8, or the config's)"
    )
    parser.add_argument("--seq", type=int, default=None, help="tokens per sequence (default: n_ctx)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "tf32", "bf16"), help="both sides")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for both libraries")
    parser.add_argument("--steps", type=int, default=7, help="timed rounds (one step of each side per round)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps of each side first")
    parser.add_argument("--no-torch", dest="torch", action="store_false", help="time tinygpt alone")
    parser.add_argument(
        "--no-memory", dest="memory", action="store_false", help="skip the peak-memory children"
    )
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--label", help="a note on what was timed, kept in the JSON")
    parser.add_argument(
        "--apart", action="store_true", help="also time each side alone, in processes of its own taking turns"
    )
    parser.add_argument("--child", choices=("tinygpt", "torch"), help=argparse.SUPPRESS)  # one side alone:
    parser.add_argument("--child-times", action="store_true", help=argparse.SUPPRESS)  # its times, not memory
    args = parser.parse_args(argv)
    preset, overrides, batch = CONFIGS[args.config] if args.config else (args.preset, {}, 8)
    args.preset, args.batch = preset, args.batch or batch
    given = {"vocab_size": args.vocab_size, "n_layer": args.n_layer}
    args.overrides = {**overrides, **{k: v for k, v in given.items() if v}}
    return args


ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None:  # before numpy and torch load: BLAS and OpenMP read these once, at import
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(ARGS.threads)

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt  # noqa: E402

import autograd as ag  # noqa: E402
from autograd import backend  # noqa: E402
from autograd import functional as F  # noqa: E402
from autograd.optim import Adam  # noqa: E402
from tinygpt import GPT, GPTConfig  # noqa: E402

LR, L2 = 2.5e-4, 0.01  # GPT-1's learning rate and L2


def tinygpt_step(config, ids, device, precision="fp32"):
    """A function that runs one tinygpt training step and returns the loss; and the model."""
    ag.manual_seed(0)
    model = GPT(config).to(device).train()
    optimizer = Adam(model.parameters(), lr=LR, l2=L2)
    ids = backend.to_device(ids, device)

    def step():
        with ag.use_precision(precision):
            loss = F.cross_entropy(model(ids[:, :-1]), ids[:, 1:])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return loss.item()  # brings the loss to the host, so the step has finished

    return step, model


BASELINES = {  # name: how to build the PyTorch model
    "torch": lambda config: torch_gpt.GPT(config),  # attention written out, as transformers does
    "torch-sdpa": lambda config: torch_gpt.GPT(config, sdpa=True),  # the strongest eager baseline
    "transformers": lambda config: torch_gpt.transformers_gpt(config),  # OpenAIGPTLMHeadModel
    "torch-compile": lambda config: torch_gpt.torch.compile(torch_gpt.GPT(config, sdpa=True)),
}


def torch_step(config, ids, threads, device="cpu", precision="fp32", baseline="torch"):
    """The same step in PyTorch: AdamW with GPT-1's L2 on matrices only, as tinygpt's Adam does;
    tf32 through PyTorch's TF32 switches, bf16 through autocast, as a PyTorch user would."""
    torch = torch_gpt.require_torch()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    model = BASELINES[baseline](config).to(device).train()
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for p in params if p.ndim > 1], "weight_decay": L2},
            {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0},
        ],
        lr=LR,
    )
    ids = torch.from_numpy(ids).to(device)
    autocast = torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=precision == "bf16")

    def step():
        with autocast:
            logits = model(ids[:, :-1])
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1)
            )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


# Dense matrix-product peaks (TFLOP/s) of GPUs by name, for the model FLOPs utilisation (MFU)
PEAK_TFLOPS = {"H100": {"fp32": 67, "tf32": 494, "bf16": 989}, "H200": {"fp32": 67, "tf32": 494, "bf16": 989}}


def flops_per_token(config, n_parameters, seq):
    """nanoGPT's count of a training step's FLOPs per token: 6N + 12 L D T."""
    return 6 * n_parameters + 12 * config.n_layer * config.n_embd * seq


def sgemm_rate(rows, n_in, n_out, rounds=5):
    """FLOP/s of numpy's float32 product of a (rows, n_in) and an (n_in, n_out) matrix, its own BLAS
    threads: the rate a CPU step's products could reach at best, the best of `rounds` runs after a
    first."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((rows, n_in), np.float32), rng.standard_normal((n_in, n_out), np.float32)
    a @ b  # a first run, not counted
    best = min(timed(lambda: a @ b) for _ in range(rounds))
    return 2 * rows * n_in * n_out / best


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def gpu_peak_memory_gb(side):
    """The most memory a side's allocator has held on the GPU, in GB: CuPy's memory pool (which
    keeps what it once allocated) for tinygpt, torch.cuda.max_memory_allocated for PyTorch."""
    if side == "tinygpt":
        return backend.cupy.get_default_memory_pool().total_bytes() / 1e9
    return torch_gpt.torch.cuda.max_memory_allocated() / 1e9


def memory_kib(field):
    """A memory figure of this process from /proc/self/status (Linux), in KiB: VmRSS is the
    resident size now, VmHWM its peak (the high-water mark of this process image, unlike
    ru_maxrss, which a child inherits from the parent that forked it)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def peak_memory(side, args, config, ids):
    """Child process: a few steps of one side; prints the growth of its peak resident size in
    MiB over its resident size after the imports."""
    if side == "torch":
        torch_gpt.require_torch()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # restart the high-water mark from the present resident size
    before = memory_kib("VmRSS")
    step = (
        tinygpt_step(config, ids, args.device, args.precision)[0]
        if side == "tinygpt"
        else torch_step(config, ids, args.threads, args.device, args.precision)
    )
    for _ in range(3):
        step()
    print(json.dumps({"peak_mib": round((memory_kib("VmHWM") - before) / 1024, 1)}))


def run_child(side, args, *flags):
    """Run this script as a --child for one side; what it prints (JSON) as a dict."""
    argv = [
        "--preset",
        args.preset,
        "--batch",
        str(args.batch),
        "--threads",
        str(args.threads),
        "--device",
        args.device,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
    ]
    argv += [f"--{key.replace('_', '-')}={value}" for key, value in args.overrides.items()]
    argv += [f"--seq={args.seq}"] if args.seq else []
    out = subprocess.run(
        [sys.executable, __file__, *argv, "--child", side, *flags], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def time_apart(sides, args):
    """Median seconds per step of each side timed alone, in its own processes (two each, taking
    turns): no side's memory or threads are left in the other's way."""
    times = {side: [] for side in sides}
    for _ in range(2):
        for side in sides:
            times[side] += run_child(side, args, "--child-times")["times"]
    return {side: statistics.median(t) for side, t in times.items()}


SETTLE_S = 0.5  # idle time before each timed step: the other library's threads stop spinning


def time_rounds(steps, rounds, warmup, all_times=False, settle_s=SETTLE_S):
    """Median seconds per step of each named step (or all the times), timed in alternating rounds.
    BLAS and OpenMP threads keep spinning a while after their work; the pause before each step
    lets them stop, so neither side is timed while the other's threads still hold the cores (a
    GPU's steps need none: settle_s=0)."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    times = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            time.sleep(settle_s)
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return times if all_times else {name: statistics.median(t) for name, t in times.items()}


def machine():
    """The CPU's model and core count (Linux's /proc/cpuinfo where there is one)."""
    model = platform.processor() or platform.machine()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            model = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model
            )
    return f"{model}, {os.cpu_count()} cores"


def gpu_name():
    """The name of the current CUDA device, as the driver gives it."""
    return backend.cupy.cuda.runtime.getDeviceProperties(backend.cupy.cuda.Device().id)["name"].decode()


def versions():
    found = {"python": platform.python_version(), "numpy": np.__version__}
    if torch_gpt.torch is not None:
        found["torch"] = torch_gpt.torch.__version__
    return found


def main(args):
    config = GPTConfig.preset(args.preset, **args.overrides)
    seq = args.seq or config.n_ctx
    device = backend.parse_device(args.device)
    backend.use_device(device)  # --device cuda:1: its memory pool and its name are the ones reported
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (args.batch, seq + 1))
    if args.child and args.child_times:
        side = args.child
        step = (
            tinygpt_step(config, ids, device, args.precision)[0]
            if side == "tinygpt"
            else torch_step(config, ids, args.threads, device, args.precision)
        )
        times = time_rounds({side: step}, args.steps, args.warmup, all_times=True)[side]
        return print(json.dumps({"times": times}))
    if args.child:
        return peak_memory(args.child, args, config, ids)

    with_torch = args.torch
    if with_torch:
        torch_gpt.require_torch()
    tinygpt, model = tinygpt_step(config, ids, device, args.precision)
    steps = {"tinygpt": tinygpt}
    if with_torch:
        steps["torch"] = torch_step(config, ids, args.threads, device, args.precision)
    load = {"before": [round(x, 2) for x in os.getloadavg()]}  # other processes on the machine
    medians = time_rounds(steps, args.steps, args.warmup, settle_s=SETTLE_S if device == "cpu" else 0)
    load["after"] = [round(x, 2) for x in os.getloadavg()]
    tokens = args.batch * seq
    name = args.config or args.preset
    result = {
        "config": name,
        "label": args.label,
        "preset": args.preset,
        "overrides": args.overrides,
        "parameters": model.num_parameters(),
        "batch": args.batch,
        "seq": seq,
        "device": device if device == "cpu" else f"{device} ({gpu_name()})",
        "precision": args.precision,
        "threads": args.threads,
        "rounds": args.steps,
        "load_average": load,
        "machine": machine(),
        "versions": versions(),
        "date": date.today().isoformat(),
    }
    peak = next((p for name, p in PEAK_TFLOPS.items() if name in result["device"]), {}).get(args.precision)
    flops = flops_per_token(config, result["parameters"], seq)
    for side, median in medians.items():
        result[side] = {"step_s": round(median, 4), "tok_s": round(tokens / median, 1)}
        if device != "cpu":
            result[side]["peak_mem_gb"] = round(gpu_peak_memory_gb(side), 2)
            result[side]["mfu"] = round(tokens / median * flops / (peak * 1e12), 4) if peak else None
    if with_torch:
        result["ratio"] = round(medians["torch"] / medians["tinygpt"], 3)  # tinygpt tokens/s over torch's
    print(
        f"{name} ({result['parameters']:,} parameters), batch {args.batch} x {seq} on {device}, "
        f"{args.threads} threads, median of {args.steps} rounds:"
    )
    for side, median in medians.items():
        gpu = f", peak {result[side]['peak_mem_gb']} GB, MFU {result[side]['mfu']}" if device != "cpu" else ""
        print(f"  {side:8s} {median:7.3f} s per step  {tokens / median:9,.0f} tokens/s{gpu}")
    if with_torch:
        print(f"  tinygpt / torch tokens/s: {result['ratio']:.2f}")
    if device == "cpu":  # the step's FLOPs a second against the rate of numpy's own products
        result["sgemm_gflops"] = round(sgemm_rate(tokens, config.n_embd, config.n_inner) / 1e9, 1)
        result["tinygpt"]["gflops"] = round(tokens / medians["tinygpt"] * flops / 1e9, 1)
        share = result["tinygpt"]["gflops"] / result["sgemm_gflops"]
        shape = f"({tokens}, {config.n_embd}) x ({config.n_embd}, {config.n_inner})"
        print(
            f"  tinygpt  {result['tinygpt']['gflops']:.0f} GFLOP/s, {share:.0%} of numpy's float32 products "
            f"({result['sgemm_gflops']:.0f} GFLOP/s at {shape})"
        )
    if args.apart and device == "cpu":
        apart = time_apart(list(steps), args)
        for side, median in apart.items():
            result[side]["apart"] = {"step_s": round(median, 4), "tok_s": round(tokens / median, 1)}
            rate = f"{tokens / median:9,.0f} tokens/s alone, in its own processes"
            print(f"  {side:8s} {median:7.3f} s per step  {rate}")
        if with_torch:
            result["ratio_apart"] = round(apart["torch"] / apart["tinygpt"], 3)
            print(f"  tinygpt / torch tokens/s, each alone: {result['ratio_apart']:.2f}")
    if args.memory and device == "cpu":
        for side in steps:
            result[side]["peak_mib"] = run_child(side, args)["peak_mib"]
            peak = f"{result[side]['peak_mib']:,.0f} MiB (growth of peak RSS over the imports)"
            print(f"  {side:8s} peak memory {peak}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main(ARGS)
