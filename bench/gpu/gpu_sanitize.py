"""compute-sanitizer's memcheck and racecheck over every case of bench/gpu/gpu_cases.py (one small step
of each CUDA kernel variant), each case under each tool in a process of its own:

    PYTHONPATH=. python bench/gpu/gpu_sanitize.py [--out DIR] [--budget S] [--cases CASE ...]

First every case runs once without a tool, all in one process. That compiles every kernel into the
disk caches (the engine's NVRTC binaries and CuPy's own kernels), so that the processes under a
tool load them instead of compiling each, and it tells a case that fails by itself from one that a
tool stops. Then each (case, tool) job runs, several at a time, with its own time limit (LIMIT_S,
less where the budget ends sooner); a job that would start with less than MIN_JOB_S of the budget
left is recorded as not run. For each job: memcheck's errors (its "ERROR SUMMARY: N errors"),
racecheck's hazards ("RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)"), whether it
finished, and the tool's first reports.

With no compute-sanitizer, or on the CPU (the cases then run on cuda-emulated), only the first
run is made; --sanitizer PATH names a tool to use all the same.
"""

import os
import re
import shutil
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_cases  # noqa: E402
import gpu_report  # noqa: E402

CASES_SCRIPT = str(Path(gpu_cases.__file__).resolve())
TOOLS = ("memcheck", "racecheck")
LIMIT_S = {"memcheck": 60, "racecheck": 90}  # one job; racecheck follows every shared-memory access
WARM_S, MIN_JOB_S = 90, 15
WORKERS = max(2, min(12, (os.cpu_count() or 2) - 2))  # the GPU takes several processes at once
ERRORS = re.compile(r"ERROR SUMMARY: (\d+) errors?")
WORDS = ("hazard", "error", "warning")  # of racecheck's summary
HAZARDS = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")


def find_sanitizer():
    """compute-sanitizer on the PATH or in the CUDA toolkit's usual place; None where there is none."""
    found = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    return found if os.access(found, os.X_OK) else None


def warm(cases, device, budget):
    """Every case once, without a tool, in one process: {case: None where it ran to its end, else
    why not}."""
    seconds = min(WARM_S, budget.left())
    finished = gpu_report.run_limited([sys.executable, CASES_SCRIPT, *cases, "--device", device], seconds)
    lines, output = set(finished.output.splitlines()), finished.output
    results = {}
    for case in cases:
        if f"done {case}" in lines:
            results[case] = None
        elif f"failed {case}:" in output:  # its traceback follows
            results[case] = output[output.index(f"failed {case}:") :][:1000]
        else:
            results[case] = (
                f"not reached: the run stopped (status {finished.status}) after {finished.seconds} s"
            )
    return results


def sanitize(sanitizer, tool, case, device, budget):
    """One case under one tool, in its own process: what the tool found, or why it did not run."""
    seconds = min(LIMIT_S[tool], budget.left())
    if seconds < MIN_JOB_S:
        return {"ran": False, "why": f"{budget.left():.0f} s of the budget left"}
    command = [sanitizer, "--tool", tool, "--print-limit", "10"]
    finished = gpu_report.run_limited(
        [*command, sys.executable, CASES_SCRIPT, case, "--device", device], seconds
    )
    return {"ran": True, "limit_s": round(seconds), **read_report(finished, case)}


def read_report(finished, case):
    """A tool's findings from its output: counts from its summary line (None where it printed
    none), whether the case got to its end, and the tool's first reports."""
    errors, hazards = ERRORS.search(finished.output), HAZARDS.search(finished.output)
    reports = [
        line
        for line in finished.output.splitlines()
        if line.startswith("=========") and "SUMMARY" not in line and "COMPUTE-SANITIZER" not in line
    ]
    return {
        "finished": finished.status is not None,
        "status": finished.status,
        "done": f"done {case}" in finished.output,
        "seconds": finished.seconds,
        "errors": int(errors[1]) if errors else None,
        "hazards": [int(n) for n in hazards.groups()] if hazards else None,  # hazards, errors, warnings
        "reports": reports[:12],
        "tail": "" if f"done {case}" in finished.output else finished.output[-800:],
    }


def clean(job):
    """Whether a job that ran found nothing: the case got to its end, and the tool's summary counts
    nothing (memcheck's errors; racecheck's hazards, and errors where it prints both)."""
    counts = [n for n in (job["errors"], job["hazards"] and job["hazards"][0]) if n is not None]
    return job["done"] and job["status"] == 0 and bool(counts) and not any(counts)


def run_jobs(record, sanitizer, cases, device, budget):
    """Every (case, tool) job, WORKERS at a time, each result saved as it comes. One that finds
    something, or crashes, fails the part; one that runs out of time is only reported."""
    jobs = [(case, tool) for case in cases for tool in TOOLS]
    lock = threading.Lock()

    def job(case, tool):
        result = sanitize(sanitizer, tool, case, device, budget)
        with lock:
            record["cases"][case][tool] = result
            if result["ran"] and result["finished"] and not clean(result):
                record.fail()
            record.save()

    with ThreadPoolExecutor(WORKERS) as pool:
        for done in [pool.submit(job, case, tool) for case, tool in jobs]:
            done.result()


def cell(job):
    """A job's result in a few words, for the summary's table."""
    if job is None:
        return ""
    if not job["ran"]:
        return f"not run ({job['why']})"
    if not job["finished"]:
        return f"did not finish in {job['limit_s']} s"
    found = None
    if job["hazards"] is not None:
        hazards, errors, warnings = (gpu_report.count(*pair) for pair in zip(job["hazards"], WORDS))
        found = f"{hazards} ({errors}, {warnings})"
    elif job["errors"] is not None:
        found = gpu_report.count(job["errors"], "error")
    if job["done"] and job["status"] == 0:
        return found or "no summary"
    return (f"{found}; " if found else "") + f"the case stopped (status {job['status']})"


def markdown(data):
    lines = [f"compute-sanitizer: {data.get('sanitizer') or 'not run'}; cases on {data['case_device']}.", ""]
    lines += ["| case | alone | " + " | ".join(TOOLS) + " |", "|" + " --- |" * (2 + len(TOOLS))]
    for case, result in data["cases"].items():
        alone = "ok" if result["alone"] is None else "FAILED"
        lines.append(f"| {case} | {alone} | " + " | ".join(cell(result.get(tool)) for tool in TOOLS) + " |")
    for case, result in data["cases"].items():
        if result["alone"]:
            lines += ["", f"{case} without a tool:", "```", result["alone"][-800:], "```"]
        for tool in TOOLS:
            job = result.get(tool)
            if job and job["ran"] and not clean(job):
                lines += ["", f"{case} under {tool}:", "```", *(job["reports"] or [job["tail"]]), "```"]
    return "\n".join(lines)


def main(argv=None):
    parser = gpu_report.parser(__doc__)
    parser.add_argument("--cases", nargs="+", default=list(gpu_cases.CASES), choices=list(gpu_cases.CASES))
    parser.add_argument("--sanitizer", help="the compute-sanitizer to run (default: the toolkit's, on a GPU)")
    args = parser.parse_args(argv)
    budget = gpu_report.Budget(args.budget)
    record = gpu_report.Record("sanitize", args, markdown)
    case_device = args.device if gpu_report.on_gpu(args.device) else "cuda-emulated"
    sanitizer = args.sanitizer or (find_sanitizer() if gpu_report.on_gpu(args.device) else None)
    record["sanitizer"], record["case_device"] = sanitizer, case_device
    alone = warm(args.cases, case_device, budget)
    record["cases"] = {case: {"alone": error} for case, error in alone.items()}
    if any(alone.values()):
        record.fail()
    record.save()
    if sanitizer:
        run_jobs(record, sanitizer, [case for case in args.cases if alone[case] is None], case_device, budget)
    return record.exit_status()


if __name__ == "__main__":
    sys.exit(main())
