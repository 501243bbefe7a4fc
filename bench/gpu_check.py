"""The GPU path, proven in one command, from the repository root:

    PYTHONPATH=. python bench/gpu_check.py [--out DIR]          a machine with an NVIDIA GPU
    PYTHONPATH=. python bench/gpu_check.py --device cpu --preset tiny --skip tests
                                                               its logic, on a CPU, small

Needs CuPy, PyTorch (for the launch count and the comparison), pytest and hypothesis; no
network. It runs these checks in order, each recorded whether it passes or not:

    tests        pytest -m gpu, plain and with CUPY_TF32=1 (every float32 product of cuBLAS
                 in TF32; the fused kernels compute in float32 either way)
    modules      train.pretrain, a resume of it, train.finetune, train.generate and
                 train.evaluate perplexity, on the device
    resume       the resumed run logs the losses of the run that went on, bit for bit
    determinism  a second run with the same seed logs the same losses, bit for bit
    crossdevice  a checkpoint written on the device loads on the CPU with the same bits, a
                 checkpoint written on the CPU loads on the device with the same bits
    step         one training step of --preset at batch 8: host reads and kernel launches
    memory       the memory pool's peak over a training step at batch 8 and 32
    throughput   tokens/s of a step at batch 8 beside PyTorch's, in fp32, tf32 and bf16

and writes bench/results/gpu-check-<device>.json, a copy in --out (or $OUT) where given, and a
one-screen summary. The JSON is written again after each check, and a precision that fails keeps
the others' figures, so a crash late in the run loses nothing measured before it.
"""

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_step  # noqa: E402

import autograd as ag  # noqa: E402
from autograd import backend  # noqa: E402
from autograd import functional as F  # noqa: E402
from autograd.optim import Adam, clip_grad_norm  # noqa: E402
from autograd.serialization import load_file  # noqa: E402
from tinygpt import GPT, GPTConfig  # noqa: E402
from train import evaluate, finetune, generate, pretrain  # noqa: E402
from train.checkpoint import load_checkpoint  # noqa: E402
from train.run import read_config, read_metrics  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMALL_RUN = [
    "--preset",
    "tiny",
    "--vocab-size",
    "512",
    "--batch-size",
    "8",
    "--n-ctx",
    "64",
    "--log-every",
    "5",
]
SMALL_RUN += ["--eval-every", "10", "--eval-windows", "16", "--save-every", "10", "--sample-tokens", "8"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu to try the checks' logic")
    parser.add_argument(
        "--preset", default="gpt1", help="the model of the step, memory and throughput checks"
    )
    parser.add_argument("--seq", type=int, help="tokens per sequence there (default: the preset's n_ctx)")
    parser.add_argument("--skip", nargs="*", default=[], choices=list(CHECKS), help="checks to leave out")
    parser.add_argument(
        "--out", default=os.environ.get("OUT"), help="also write the JSON here (default $OUT)"
    )
    return parser.parse_args(argv)


# ----- the checks: each returns a dict of figures, with "ok" False where it fails -----------------
def check_tests(args, device, work):
    """pytest -m gpu twice, the second time with every float32 product in TF32."""
    if device == "cpu":
        return {"skipped": "the gpu tests need a GPU"}
    runs = {name: run_pytest(tf32) for name, tf32 in (("fp32", False), ("tf32", True))}
    return {"ok": all(r["failed"] == 0 and r["passed"] > 0 for r in runs.values()), **runs}


def run_pytest(tf32):
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "HYPOTHESIS_PROFILE": "ci",
        "CUPY_TF32": "1" if tf32 else "0",
    }
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-rf"]
    began = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|error)", done.stdout)}
    failures = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return {
        "passed": counts.get("passed", 0),
        "failed": counts.get("failed", 0) + counts.get("error", 0),
        "skipped": counts.get("skipped", 0),
        "seconds": round(time.perf_counter() - began, 1),
        "failures": failures[:20],
    }


def check_modules(args, device, work):
    """Every training module once, small, on the device; the run folder is kept for the checks
    that follow."""
    corpus, data = write_corpus(work), write_task(work)
    run = work / "run"
    steps = {
        "pretrain": lambda: pretrain.main(
            ["--data", str(corpus), "--out", str(run), "--steps", "20", "--device", device, *SMALL_RUN]
        ),
        "resume": lambda: resume(run, device),
        "finetune": lambda: finetune.main(
            [
                "--init-from",
                str(run),
                "--task",
                "jsonl",
                "--train",
                str(data),
                "--dev",
                str(data),
                "--out",
                str(work / "finetune"),
                "--epochs",
                "1",
                "--batch-size",
                "8",
                "--device",
                device,
            ]
        ),
        "generate": lambda: generate.main(
            ["--run", str(run), "--prompt", "The", "--max-new-tokens", "20", "--device", device]
        ),
        "evaluate": lambda: evaluate.main(
            [
                "perplexity",
                "--run",
                str(run),
                "--data",
                str(corpus),
                "--max-tokens",
                "2000",
                "--device",
                device,
            ]
        ),
    }
    results = {name: attempt(step) for name, step in steps.items()}
    return {"ok": all(r["ok"] for r in results.values()), **results}


def resume(run, device):
    """Resume the run from its step-10 checkpoint: what it logs after step 10 must equal what the
    run logged when it went on (kept in resume.json for check_resume)."""
    uninterrupted = losses(run)
    pretrain.main(["--resume", str(run / "checkpoints" / "10"), "--device", device])
    (run.parent / "resume.json").write_text(
        json.dumps({"uninterrupted": uninterrupted, "resumed": losses(run)})
    )


def check_resume(args, device, work):
    logged = json.loads((work / "resume.json").read_text())
    first, second = logged["uninterrupted"], logged["resumed"]
    return {"ok": first == second and len(first) == 20, "steps": len(second), "bit_for_bit": first == second}


def check_determinism(args, device, work):
    again = work / "again"
    quietly(
        lambda: pretrain.main(
            [
                "--data",
                str(work / "corpus.txt"),
                "--out",
                str(again),
                "--steps",
                "20",
                "--device",
                device,
                *SMALL_RUN,
            ]
        )
    )
    first, second = losses(work / "run"), losses(again)
    return {"ok": first == second, "steps": len(second), "bit_for_bit": first == second}


def check_crossdevice(args, device, work):
    """The device's checkpoint on the CPU, and a CPU checkpoint on the device: weights and Adam's
    moments with the same bits as where they were written."""
    cpu_run = work / "cpu-run"
    quietly(
        lambda: pretrain.main(
            [
                "--data",
                str(work / "corpus.txt"),
                "--out",
                str(cpu_run),
                "--steps",
                "10",
                "--device",
                "cpu",
                *SMALL_RUN,
            ]
        )
    )
    there = {
        "device to cpu": (work / "run" / "checkpoints" / "20", "cpu"),
        "cpu to device": (cpu_run / "checkpoints" / "10", device),
    }
    same = {name: same_state(checkpoint, to) for name, (checkpoint, to) in there.items()}
    return {"ok": all(same.values()), **same}


def same_state(checkpoint, device):
    """Whether a checkpoint loaded on `device` holds the bits of the safetensors files."""
    config, _ = read_config(checkpoint.parent.parent)
    model = GPT(config).to(device)
    optimizer = Adam(model.parameters())
    load_checkpoint(str(checkpoint), model, optimizer)
    weights, moments = (
        load_file(str(checkpoint / "model.safetensors")),
        load_file(str(checkpoint / "optimizer.safetensors")),
    )
    names = [name for name, _ in model.named_parameters()]
    loaded = {name: backend.to_host(p.data) for name, p in model.named_parameters()}
    loaded_m = {f"m.{n}": backend.to_host(m) for n, m in zip(names, optimizer.m)}
    return all(np.array_equal(loaded[n], weights[n]) for n in names) and all(
        np.array_equal(loaded_m[k], moments[k]) for k in loaded_m
    )


def check_step(args, device, work):
    """One training step at batch 8 (forward, loss, backward, clipping, Adam): host reads it makes
    (none is right) and kernels it launches (counted by PyTorch's profiler, which sees every
    kernel of the process)."""
    step, _ = model_step(args, device, 8)
    for _ in range(2):
        step()  # compiles the kernels and fills the memory pool
    with backend.count_host_reads() as reads:
        step()
    launches, kinds = count_launches(step) if device != "cpu" else (None, None)
    return {"ok": reads.count == 0, "host_reads": reads.count, "launches": launches, "most_launched": kinds}


def model_step(args, device, batch, precision="fp32"):
    """A training step of the preset on random ids, with nothing read back; and the model."""
    config = GPTConfig.preset(args.preset)
    seq = args.seq or config.n_ctx
    ids = backend.to_device(np.random.default_rng(0).integers(0, config.vocab_size, (batch, seq + 1)), device)
    ag.manual_seed(0)
    model = GPT(config).to(device).train()
    optimizer = Adam(model.parameters(), lr=2.5e-4, l2=0.01)

    def step():
        with ag.use_precision(precision), ag.random.use_masks(ag.random.MaskStream(0)):
            loss = F.cross_entropy(model(ids[:, :-1]), ids[:, 1:])
            optimizer.zero_grad()
            loss.backward()
            clip_grad_norm(model.parameters(), 1.0)
            optimizer.step()

    return step, model


def count_launches(step):
    """(kernels launched by one step, the 10 most launched with their counts)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.init()
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        step()
        backend.cupy.cuda.Device().synchronize()
    kernels = [
        e.name
        for e in profiler.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))
    ]
    counts = {name: kernels.count(name) for name in set(kernels)}
    return len(kernels), sorted(counts.items(), key=lambda item: -item[1])[:10]


def check_memory(args, device, work):
    """Peak bytes of the memory pool over a training step, at batch 8 and 32 (the pool keeps what
    it allocated, so after the step it holds the peak)."""
    if device == "cpu":
        return {"skipped": "the memory pool is the GPU's"}
    peaks = {}
    for batch in (8, 32):
        pool = backend.cupy.get_default_memory_pool()
        pool.free_all_blocks()
        step, model = model_step(args, device, batch)
        step()
        backend.cupy.cuda.Device().synchronize()
        peaks[f"batch_{batch}_gb"] = round(pool.total_bytes() / 1e9, 2)
        del step, model
    return peaks


def check_throughput(args, device, work):
    """bench/train_step.py's step of tinygpt and of PyTorch at batch 8, in each precision; one that
    fails is recorded with its error, and the others are measured all the same."""
    config = GPTConfig.preset(args.preset)
    seq = args.seq or config.n_ctx
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (8, seq + 1))
    figures = {}
    for precision in ("fp32", "tf32", "bf16"):
        try:
            figures[precision] = throughput(config, ids, device, precision)
        except Exception as error:
            figures[precision] = failure(error)
    return {"ok": all(f.get("ok", True) for f in figures.values()), **figures}


def throughput(config, ids, device, precision):
    """Tokens/s of tinygpt's and PyTorch's training steps on `ids`, and their ratio."""
    tinygpt, _ = train_step.tinygpt_step(config, ids, device, precision)
    torch = train_step.torch_step(config, ids, os.cpu_count(), device, precision)
    medians = train_step.time_rounds({"tinygpt": tinygpt, "torch": torch}, rounds=5, warmup=2, settle_s=0)
    tokens = ids.shape[0] * (ids.shape[1] - 1)
    figures = {f"{side}_tok_s": round(tokens / s, 1) for side, s in medians.items()}
    return {**figures, "ratio": round(medians["torch"] / medians["tinygpt"], 3)}


CHECKS = {
    "tests": check_tests,
    "modules": check_modules,
    "resume": check_resume,
    "determinism": check_determinism,
    "crossdevice": check_crossdevice,
    "step": check_step,
    "memory": check_memory,
    "throughput": check_throughput,
}


# ----- what the checks share ----------------------------------------------------------------------
def failure(error):
    """What a check records of an error: not ok, and the traceback's last lines."""
    return {"ok": False, "error": "".join(traceback.format_exception(error))[-1500:]}


def attempt(work):
    """Run work() quietly: {"ok": True}, or {"ok": False, "error": its last lines}."""
    try:
        quietly(work)
        return {"ok": True}
    except BaseException as error:  # a module's usage error is a SystemExit
        if isinstance(error, KeyboardInterrupt):
            raise
        return failure(error)


def quietly(work):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        work()


def losses(run):
    return [(m["step"], m["loss"]) for m in read_metrics(run) if "loss" in m]


def write_corpus(work):
    sentences = [
        f"The {animal} number {i} walked over the {place} and sat down quietly. "
        for i in range(400)
        for animal, place in [("cat", "hill"), ("dog", "bridge")]
    ]
    path = work / "corpus.txt"
    path.write_text("".join(sentences), encoding="utf-8")
    return path


def write_task(work):
    rows = [
        {"text": f"the {animal} sat on the {place}", "label": label}
        for animal, place, label in [("cat", "mat", "pos"), ("dog", "log", "neg")] * 24
    ]
    path = work / "task.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def describe(device):
    if device == "cpu":
        return {"name": "cpu"}
    props = backend.cupy.cuda.runtime.getDeviceProperties(backend.cupy.cuda.Device().id)
    return {"name": props["name"].decode(), "memory_gb": round(props["totalGlobalMem"] / 1e9, 1)}


def versions():
    found = {"python": sys.version.split()[0], "numpy": np.__version__}
    for name in ("cupy", "torch", "ml_dtypes"):
        with contextlib.suppress(ImportError):
            found[name] = __import__(name).__version__
    return found


def summary(report):
    lines = [f"gpu check on {report['device']['name']} ({report['date']}), {report['seconds']:.0f} s:"]
    for name, result in report["checks"].items():
        status = "skipped" if "skipped" in result else "ok" if result.get("ok", True) else "FAILED"
        figures = {k: v for k, v in result.items() if k not in ("ok", "seconds", "error", "most_launched")}
        lines.append(f"  {name:12} {status:8} {json.dumps(figures)[:150]}")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    device = backend.parse_device(args.device)
    backend.use_device(device)
    report = {
        "device": describe(device),
        "versions": versions(),
        "date": date.today().isoformat(),
        "preset": args.preset,
        "checks": {},
    }
    began, work = time.perf_counter(), Path(tempfile.mkdtemp(prefix="gpu-check-"))
    os.environ["TINYGPT_CACHE"] = str(work / "cache")
    for name, check in CHECKS.items():
        if name in args.skip:
            continue
        start = time.perf_counter()
        try:
            result = check(args, device, work)
        except Exception as error:
            result = failure(error)
        report["checks"][name] = {**result, "seconds": round(time.perf_counter() - start, 1)}
        write(report, args.out)  # what is measured so far, should a later check bring the process down
        print(
            f"{name}: {'ok' if result.get('ok', True) else 'FAILED'} ({report['checks'][name]['seconds']} s)",
            flush=True,
        )
    report["seconds"] = round(time.perf_counter() - began, 1)
    shutil.rmtree(work, ignore_errors=True)
    write(report, args.out)
    print(summary(report))
    return 0 if all(r.get("ok", True) for r in report["checks"].values()) else 1


def write(report, out):
    """bench/results/gpu-check-<device>.json (not for a trial on the CPU), and a copy in `out`."""
    name = re.sub(r"[^a-z0-9]+", "-", report["device"]["name"].lower()).strip("-")
    text = json.dumps(report, indent=2)
    if name != "cpu":
        (ROOT / "bench" / "results" / f"gpu-check-{name}.json").write_text(text)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"gpu-check-{name}.json").write_text(text)


if __name__ == "__main__":
    sys.exit(main())
