"""The paper's fine-tuning ablations, small: one pre-trained run fine-tuned on GLUE tasks with
(a) the auxiliary LM loss, (b) without it, (c) no pre-training at all, and (d) only the
embeddings and the first K blocks transferred (Table 5 and Figure 2, left).

    python bench/finetune_ablations.py --pretrained RUN [--tasks sst2 rte] [--glue DIR]
        [--out runs/ablations] [--jobs 2] [--lr 2.5e-4] [--limit-train sst2=10000] [--json PATH]
        [--variants full scratch ...]

Every configuration is one `python -m train.finetune` run in --out/<task>-<variant>; the exact
command of each is printed before it starts. Finished runs are kept and a half-done one resumes,
so the script can be stopped and started again. The table at the end gives each run's dev metric
after the last epoch (no choice of epoch on the dev set).
"""

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from train.tasks import TASKS as RECORDS

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_GLUE = ROOT.parent / "shared" / "data" / "glue"
TASKS = ("sst2", "cola", "rte", "stsb", "mrpc")  # the tasks with a train and a dev file
METRIC = {task: RECORDS[task].main or RECORDS[task].metrics[0] for task in TASKS}  # what picks the best epoch


def variants(n_layer):
    """(name, description, extra finetune arguments) of every configuration, in table order."""
    rows = [
        ("full", f"pre-trained, aux LM (lambda 0.5), all {n_layer} blocks", []),
        ("no-aux", "pre-trained, no aux LM (lambda 0)", ["--lm-coef", "0"]),
        ("scratch", "no pre-training", ["--from-scratch"]),
    ]
    rows += [
        (f"transfer{k}", f"embeddings + {k} of {n_layer} blocks transferred", ["--transfer-layers", str(k)])
        for k in range(n_layer)
    ]
    return rows


def is_finished(run_dir, epochs):
    path = run_dir / "results.json"
    return path.is_file() and len(json.loads(path.read_text())["epochs"]) == epochs


def command(args, task, run_dir, extra):
    """The finetune command of one configuration: a fresh run, or --resume of a half-done one."""
    if (run_dir / "checkpoints").is_dir():
        return [sys.executable, "-m", "train.finetune", "--resume", str(run_dir), "--device", args.device]
    data = Path(args.glue) / task
    limit = ["--limit-train", str(args.limit_train[task])] if task in args.limit_train else []
    return [
        sys.executable,
        "-m",
        "train.finetune",
        "--init-from",
        args.pretrained,
        "--task",
        task,
        "--train",
        str(data / "train.tsv"),
        "--dev",
        str(data / "dev.tsv"),
        "--out",
        str(run_dir),
        "--lr",
        str(args.lr),
        "--epochs",
        str(args.epochs),
        "--seed",
        str(args.seed),
        "--device",
        args.device,
        *limit,
        *extra,
    ]


def run(args, task, name, extra):
    """Run one configuration unless it is finished; its output goes to <run>.log."""
    run_dir = Path(args.out) / f"{task}-{name}"
    if is_finished(run_dir, args.epochs):
        return
    cmd = command(args, task, run_dir, extra)
    print("+ " + " ".join(cmd), flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // args.jobs))}
    with open(f"{run_dir}.log", "a") as log:
        done = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode:
        raise RuntimeError(f"{task}-{name} exited with {done.returncode}; see {run_dir}.log")


def table(args, rows):
    """The markdown table of dev metrics after the last epoch, and the same as a dict."""
    header = "| configuration | " + " | ".join(f"{task} dev {METRIC[task]}" for task in args.tasks) + " |"
    lines = [header, "|---" * (len(args.tasks) + 1) + "|"]
    figures = {}
    for name, description, _ in rows:
        cells = []
        for task in args.tasks:
            path = Path(args.out) / f"{task}-{name}" / "results.json"
            last = json.loads(path.read_text())["epochs"][-1] if path.is_file() else None
            figures[f"{task}-{name}"] = last
            cells.append(f"{last[METRIC[task]]:.3f}" if last else "-")
        lines.append(f"| {description} | " + " | ".join(cells) + " |")
    return "\n".join(lines), figures


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pretrained", required=True, help="the pretraining run to fine-tune")
    p.add_argument("--tasks", nargs="+", choices=TASKS, default=["sst2", "rte"])
    p.add_argument("--glue", default=str(DEFAULT_GLUE), help="folder with <task>/train.tsv and dev.tsv")
    p.add_argument("--out", default="runs/ablations")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time; the cores are shared among them")
    p.add_argument("--lr", type=float, default=2.5e-4)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--limit-train",
        nargs="*",
        default=["sst2=10000"],
        metavar="TASK=N",
        help="train on N examples of TASK",
    )
    p.add_argument(
        "--variants",
        nargs="+",
        metavar="NAME",
        help="run only these configurations: full, no-aux, scratch, transfer0, transfer1, ...",
    )
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args()
    try:
        args.limit_train = {task: int(n) for task, n in (item.split("=") for item in args.limit_train)}
    except ValueError:
        p.error(f"--limit-train takes TASK=N items, got {args.limit_train}")
    try:
        n_layer = json.loads((Path(args.pretrained) / "config.json").read_text())["model"]["n_layer"]
    except (OSError, KeyError, ValueError) as error:
        p.error(f"--pretrained: {args.pretrained} is not a pretraining run folder ({error})")

    rows = variants(n_layer)
    unknown = set(args.variants or []) - {name for name, _, _ in rows}
    if unknown:
        p.error(
            f"--variants: no configuration named {sorted(unknown)}; there are {[name for name, _, _ in rows]}"
        )
    rows = [row for row in rows if not args.variants or row[0] in args.variants]
    os.makedirs(args.out, exist_ok=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        for future in [
            pool.submit(run, args, task, name, extra) for task in args.tasks for name, _, extra in rows
        ]:
            future.result()
    text, figures = table(args, rows)
    print(text)
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k != "json"}
        Path(args.json).write_text(json.dumps({"settings": settings, "last_epoch_dev": figures}, indent=2))


if __name__ == "__main__":
    main()
