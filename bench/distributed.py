"""Pretraining throughput of one process against several ranks (train.pretrain --distributed).

    python bench/distributed.py --json bench/results/cpu-distributed.json
        # the CPU: 1 process x 1 thread, 1 process x 2 threads, 2 ranks x 1 thread each
    python bench/distributed.py --device cuda --preset mini --batch-size 64
        # the GPUs: 1 GPU against every GPU of the machine, one rank each (NCCL)

Every side is a real `python -m train.pretrain` run (ranks started by mpiexec), with the same
model, global batch, seed and data (Python's pydoc topics, or --data), and one BPE tokenizer
trained here first. A side's figure is the tokens per second of its training steps after the
first --skip: tokens over the growth of the `elapsed` compute time that rank 0 logs in
metrics.jsonl, which leaves out evaluation and checkpoints but not the waiting for other ranks.
The sides take turns, --rounds times, and each figure is the median of its rounds. Other work on
the machine is in every figure: the load average before and after is kept with them.
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

import numpy as np

from autograd import backend
from tinygpt.tokenizer import BPETokenizer
from train import data
from train.run_folder import read_config, read_metrics


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument(
        "--ranks", type=int, help="ranks of the parallel side (default: 2 on the CPU, every GPU)"
    )
    parser.add_argument("--preset", default="tiny", choices=["tiny", "mini", "gpt1"])
    parser.add_argument(
        "--batch-size", type=int, default=16, help="the global batch, in windows of n_ctx tokens"
    )
    parser.add_argument("--steps", type=int, default=40, help="training steps of each run")
    parser.add_argument("--skip", type=int, default=10, help="first steps left out of the figure (warm-up)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each side, taking turns")
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--data", nargs="+", help="text files or folders (default: Python's pydoc topics)")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)
    if not 1 <= args.skip < args.steps:
        parser.error(f"--skip must lie in 1..--steps - 1, got {args.skip}")
    return args


def find_mpiexec():
    """The mpiexec beside this Python (pip install 'tinygpt[mpi]'), else the first on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    found = str(beside) if beside.exists() else shutil.which("mpiexec")
    if found is None:
        sys.exit("no mpiexec found: pip install 'tinygpt[mpi]'")
    return found


def sides(args):
    """{name: (command, threads per process, --device)} of the runs to compare."""
    pretrain = [sys.executable, "-m", "train.pretrain"]
    if args.device == "cpu":
        ranks = args.ranks or 2
        return {
            "1 process x 1 thread": (pretrain, 1, "cpu"),
            f"1 process x {ranks} threads": (pretrain, ranks, "cpu"),
            f"{ranks} ranks x 1 thread": (
                [find_mpiexec(), "-n", str(ranks), *pretrain, "--distributed"],
                1,
                "cpu",
            ),
        }
    if not backend.cuda_available():
        sys.exit("--device cuda: CuPy sees no GPU here")
    ranks = args.ranks or backend.cupy.cuda.runtime.getDeviceCount()
    return {
        "1 GPU": (pretrain, 1, "cuda:0"),
        f"{ranks} GPUs": ([find_mpiexec(), "-n", str(ranks), *pretrain, "--distributed"], 1, "cuda"),
    }


def run_side(command, threads, device, args, common, out):
    """One run; its tokens per second over the steps after --skip."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads)}
    finished = subprocess.run(
        [*command, *common, "--device", device, "--out", str(out)], env=env, capture_output=True, text=True
    )
    if finished.returncode:
        sys.exit(f"{' '.join(command)} failed:\n{finished.stdout[-2000:]}{finished.stderr[-3000:]}")
    steps = [m for m in read_metrics(out) if "loss" in m]
    first, last = steps[args.skip - 1], steps[-1]
    tokens = (last["step"] - first["step"]) * args.batch_size * read_config(out)[0].n_ctx
    return tokens / (last["elapsed"] - first["elapsed"])


def main(args):
    runs = sides(args)
    folder = Path(tempfile.mkdtemp(prefix="tinygpt-bench-distributed-"))
    os.environ["TINYGPT_CACHE"] = str(folder / "cache")
    texts = data.read_texts(args.data) if args.data else data.default_corpus()
    BPETokenizer.train(texts, args.vocab_size).save(str(folder / "tokenizer"))
    common = [
        "--tokenizer",
        str(folder / "tokenizer"),
        "--preset",
        args.preset,
        "--batch-size",
        str(args.batch_size),
        "--steps",
        str(args.steps),
        "--log-every",
        "1",
        "--eval-every",
        str(args.steps),
        "--eval-windows",
        str(args.batch_size),
        "--save-every",
        str(args.steps),
        "--sample-tokens",
        "1",
        "--seed",
        "0",
    ]
    common += ["--data", *args.data] if args.data else []
    load = {"before": [round(x, 2) for x in os.getloadavg()]}
    rates = {name: [] for name in runs}
    for round_ in range(args.rounds):
        for i, (name, (command, threads, device)) in enumerate(runs.items()):
            rates[name].append(run_side(command, threads, device, args, common, folder / f"run-{round_}-{i}"))
    load["after"] = [round(x, 2) for x in os.getloadavg()]
    shutil.rmtree(folder, ignore_errors=True)

    medians = {name: statistics.median(r) for name, r in rates.items()}
    baseline = next(iter(medians.values()))
    print(
        f"{args.preset}, global batch {args.batch_size}, steps {args.skip + 1}-{args.steps}, "
        f"median of {args.rounds} rounds; load average {load['before'][0]} -> {load['after'][0]}"
    )
    for name, median in medians.items():
        print(f"  {name:24s} {median:10,.0f} tokens/s  x{median / baseline:.2f}")
    if args.json:
        result = {
            "preset": args.preset,
            "batch_size": args.batch_size,
            "steps": args.steps,
            "skip": args.skip,
            "rounds": args.rounds,
            "vocab_size": args.vocab_size,
            "data": args.data or "pydoc topics",
            "sides": {
                name: {
                    "tok_s": round(median, 1),
                    "rounds": [round(r, 1) for r in rates[name]],
                    "speedup": round(median / baseline, 3),
                }
                for name, median in medians.items()
            },
            "load_average": load,
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
            "versions": {"python": platform.python_version(), "numpy": np.__version__},
            "date": date.today().isoformat(),
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main(parse_args())
