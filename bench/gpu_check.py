"""The GPU path, proven and measured in one command, from the repository root:

    PYTHONPATH=. python bench/gpu_check.py --out $OUT          on a machine with an NVIDIA GPU
    PYTHONPATH=. python bench/gpu_check.py --device cpu --preset tiny --seq 16 --batch 2 \\
        --precision fp32 --out DIR                             its logic, small, on a CPU

Its parts, in this order, each a script of its own run in a process of its own, with the seconds
planned for it on an H100 (PARTS) as its limit:

    modules    65 s  the training modules on the device, a resume and a second run bit for bit,
                     checkpoints across devices, a step's host reads         bench/gpu/gpu_modules.py
    sanitize   45 s  compute-sanitizer memcheck and racecheck over a small step of every kernel
                     variant, each in its own process                        bench/gpu/gpu_sanitize.py
    tests     120 s  pytest -m gpu, plain and with CUPY_TF32=1, side by side bench/gpu/gpu_tests.py
    attention  30 s  attention's forward and backward against PyTorch SDPA, batch 8 and 32, bf16
                     and tf32                                                bench/gpu/gpu_attention.py
    profile    65 s  one step of each precision, kernel by kernel, tinygpt beside PyTorch SDPA;
                     the engine's count of launches against the profiler's  bench/gpu/gpu_profile.py
    bench     165 s  tokens/s, peak memory, launches and MFU against transformers, SDPA eager and
                     SDPA under torch.compile, batch 8 and 32, bf16, tf32, fp32  bench/gpu/gpu_bench.py
              490 s (on an H100 the bench's eager rows and torch.compile's bf16 batch-32 row fit)

The command is held to DEADLINE_S (490 s, so that it ends inside 8.5 minutes): a part gets its
planned seconds or what is left before the deadline, less GRACE_S, whichever is less, and a part
with less than MIN_PART_S left is skipped and recorded as such. A part plans its work to end in its
time (--budget); one still running GRACE_S after it is stopped, with every process it started. A
part writes its record after each piece of its work, so a part that is stopped or crashes keeps
what it measured, and the parts before it are not touched.

Written under --out (default $OUT): <part>.json for each part, check.json (the plan and each part's
outcome) and summary.md (every part's section): 8 files. On a GPU each JSON is also written to
bench/results/, under the device's name. The status is 0 when every part that ran is ok.
"""

import os
import subprocess
import sys
import time
from datetime import date
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu"))
import gpu_report  # noqa: E402

HERE = Path(__file__).resolve().parent


class Part(NamedTuple):
    script: str  # under bench/gpu/
    seconds: int  # planned, on an H100


PARTS = {  # seconds taken on a fresh H100 (bench/results/gpu-check-nvidia-h100-80gb-hbm3.json)
    "modules": Part("gpu_modules.py", 65),  # 56 s; 8 s once NVRTC's cache is warm: the first part fills it
    "sanitize": Part("gpu_sanitize.py", 45),  # 32 s
    "tests": Part("gpu_tests.py", 120),  # 98 s: the tf32 run, beside the plain one's 82
    "attention": Part("gpu_attention.py", 30),  # not yet run on a GPU: 8 rows of 21 short runs, both sides
    "profile": Part("gpu_profile.py", 65),  # 57 s
    "bench": Part("gpu_bench.py", 165),  # 122 s: the eager rows and torch.compile's bf16 batch-32 row
}
DEADLINE_S, GRACE_S, MIN_PART_S = 490, 5, 20


def parse_args(argv=None):
    parser = gpu_report.Parser(__doc__)
    parser.add_argument(
        "--device",
        type=gpu_report.device_name,
        default="cuda",
        help="cuda, cuda:N; cpu or cuda-emulated to try its logic",
    )
    parser.add_argument(
        "--out", type=gpu_report.out_folder, default=os.environ.get("OUT"), help="folder for the files ($OUT)"
    )
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS), help="parts to run")
    parser.add_argument(
        "--deadline", type=gpu_report.seconds, default=DEADLINE_S, help="seconds for the whole command"
    )
    parser.add_argument(
        "--preset",
        default="gpt1",
        choices=gpu_report.PRESETS,
        help="the model the step, profile and bench time",
    )
    parser.add_argument("--seq", type=gpu_report.whole, default=512, help="tokens per sequence there")
    parser.add_argument(
        "--batch", type=gpu_report.whole, nargs="+", default=[8, 32], help="the bench's (the profile: first)"
    )
    parser.add_argument(
        "--precision", nargs="+", default=["bf16", "tf32", "fp32"], choices=["bf16", "tf32", "fp32"]
    )
    parser.add_argument(
        "--commit", default=commit(), help="the commit measured (default: git's, where there is a .git)"
    )
    args = parser.parse_args(argv)
    if not args.out:
        parser.error("--out (or $OUT) is needed: the folder the records go to")
    return args


def command(name, args, seconds):
    """The command line of one part, with its budget."""
    script = HERE / "gpu" / PARTS[name].script
    found = [sys.executable, str(script), "--device", args.device, "--out", args.out]
    found += ["--budget", f"{seconds:.0f}"]
    if name in ("modules", "profile", "bench"):
        found += ["--preset", args.preset, "--seq", str(args.seq)]
    if name == "profile":
        found += ["--batch", str(args.batch[0]), "--precision", *args.precision]
    if name == "bench":
        found += ["--batch", *map(str, args.batch), "--precision", *args.precision]
    if name == "attention":
        found += ["--batch", *map(str, args.batch), "--seq", str(args.seq)]
    return found


def run_part(name, args, seconds):
    """Run one part in its own process for at most `seconds` and GRACE_S more; its record as it
    wrote it, with how the process ended added (and written back)."""
    path = Path(args.out) / f"{name}.json"
    path.unlink(missing_ok=True)  # an earlier run's
    finished = gpu_report.run_limited(command(name, args, seconds), seconds + GRACE_S)
    path.with_name(path.name + ".partial").unlink(missing_ok=True)  # what it was writing when stopped
    record = gpu_report.read(path)
    recorded_failure = finished.status == 1 and record is not None and record.get("ok") is False
    explained = record is not None and finished.status == 0 or recorded_failure  # the part's own words
    record = record or {"part": name, "device": gpu_report.describe(args.device)}
    if not explained:  # no record, a crash, a traceback, or stopped: its output tells
        record["output_tail"] = finished.output[-3000:]
    ok = record.get("ok", False) and finished.status == 0
    record.update(ok=ok, status=finished.status, stopped=finished.status is None)
    record["took_s"], record["limit_s"] = finished.seconds, round(seconds)
    gpu_report.write(record, args.out, f"{name}.json")
    return record


def brief(record):
    """What check.json keeps of a part's record."""
    kept = ("ok", "skipped", "status", "stopped", "took_s", "limit_s")
    return {key: record[key] for key in kept if key in record} | {"result": outcome(record)}


def outcome(record):
    """A part's result in a few words."""
    if "skipped" in record:
        return f"skipped: {record['skipped']}"
    if record["stopped"]:
        return f"FAILED: stopped at its limit of {record['limit_s']} s"
    if record["status"] not in (0, 1):
        return f"CRASHED (status {record['status']})"
    return "ok" if record["ok"] else "FAILED"


def summary(check, records):
    """summary.md: the plan and each part's outcome, then each part's own section."""
    device = check["device"]
    lines = [f"# GPU check on {device['name']}, {check['date']}", ""]
    lines += [
        f"Commit {check['commit']}; " + ", ".join(f"{k} {v}" for k, v in check["versions"].items()) + ".",
        "",
    ]
    lines += ["| part | planned s | limit s | took s | result |", "| --- | --- | --- | --- | --- |"]
    for name, record in records.items():
        took, limit = record.get("took_s", ""), record.get("limit_s", "")
        lines.append(f"| {name} | {PARTS[name].seconds} | {limit} | {took} | {outcome(record)} |")
    lines.append(f"\nIn all {check['seconds']:.0f} s of a deadline of {check['deadline_s']:.0f} s.")
    for name, record in records.items():
        lines += ["", f"## {name}", "", record.get("markdown") or f"No record: {outcome(record)}."]
        if record.get("output_tail"):
            lines += ["", "```", record["output_tail"][-1500:], "```"]
    return "\n".join(lines) + "\n"


def commit():
    """The commit the working tree is at, with '+' where it has changes; None outside a git tree."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True
        )
        changed = subprocess.run(["git", "status", "--porcelain"], cwd=HERE, capture_output=True, text=True)
    except OSError:
        return None
    return head.stdout.strip() + ("+" if changed.stdout.strip() else "") if head.returncode == 0 else None


def main(argv=None):
    args = parse_args(argv)
    began = time.monotonic()
    check = {
        "device": gpu_report.describe(args.device),
        "date": date.today().isoformat(),
        "versions": gpu_report.versions(),
        "commit": args.commit,
        "plan_s": {name: PARTS[name].seconds for name in args.parts},
        "deadline_s": args.deadline,
    }
    records = {}
    for name in args.parts:
        left = args.deadline - (time.monotonic() - began) - GRACE_S
        seconds = min(PARTS[name].seconds, left)
        if seconds < MIN_PART_S:
            records[name] = {"skipped": f"{max(left, 0):.0f} s left before the deadline", "ok": True}
        else:
            records[name] = run_part(name, args, seconds)
        print(f"{name}: {outcome(records[name])}", flush=True)
        check["parts"] = {n: brief(r) for n, r in records.items()}
        check["seconds"] = round(time.monotonic() - began, 1)
        ran = [r for r in records.values() if "skipped" not in r]
        check["ok"] = bool(ran) and all(r["ok"] for r in ran)  # nothing measured is no success
        gpu_report.write(check, args.out, "check.json")
        gpu_report.write_whole(Path(args.out) / "summary.md", summary(check, records))
    return 0 if check["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
