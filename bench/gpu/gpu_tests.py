"""pytest -m gpu on a GPU, twice side by side: as the process is, and with CUPY_TF32=1 (CuPy's
float32 matrix products in TF32; the fused kernels compute in float32 either way):

    PYTHONPATH=. python bench/gpu/gpu_tests.py [--out DIR] [--budget S]

Each run takes pytest-xdist workers where it is installed (half the cores less one each), a time
limit per test where pytest-timeout is (TEST_LIMIT_S), and the part's budget as a whole; a run
stopped there is recorded as unfinished, with the tail of its output. On the CPU the part is
skipped: CI runs these tests on the emulated device.
"""

import importlib.util
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_report  # noqa: E402

RUNS = {"fp32": {"CUPY_TF32": "0"}, "tf32": {"CUPY_TF32": "1"}}
TEST_LIMIT_S = 180
WORKERS = max(1, (os.cpu_count() or 2) // 2 - 1)  # each of the two runs
COUNTED = ("passed", "failed", "skipped", "error", "xfailed", "xpassed")


def command(paths=(), workers=WORKERS):
    """The pytest command line of one run."""
    found = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-rfE"]
    if workers > 1 and importlib.util.find_spec("xdist"):
        found += ["-n", str(workers)]
    if importlib.util.find_spec("pytest_timeout"):
        found += [f"--timeout={TEST_LIMIT_S}"]
    return found + list(paths)


def run_pytest(env, seconds, paths=(), workers=WORKERS):
    """One run of pytest for at most `seconds`: its counts (from its last line, "3 passed, 1 failed
    in 2.0s"), its failures, and whether it finished."""
    finished = gpu_report.run_limited(
        command(paths, workers), seconds, env={"HYPOTHESIS_PROFILE": "ci", **env}
    )
    lines = finished.output.strip().splitlines() or [""]
    counts = {kind: 0 for kind in COUNTED}
    for n, kind in re.findall(r"(\d+) (\w+)", lines[-1]):
        kind = kind.removesuffix("s") if kind.startswith("error") else kind
        if kind in counts:
            counts[kind] = int(n)
    return {
        "finished": finished.status is not None,
        "status": finished.status,
        "seconds": finished.seconds,
        **counts,
        "failures": [line for line in lines if line.startswith(("FAILED", "ERROR"))][:30],
        "tail": "" if finished.status == 0 else finished.output[-1500:],
    }


def passed(run):
    return run["finished"] and run["passed"] > 0 and run["failed"] == run["error"] == 0


def markdown(data):
    if "skipped" in data:
        return f"Skipped: {data['skipped']}."
    lines = ["| run | passed | failed | errors | skipped | seconds |", "|" + " --- |" * 6]
    for name, run in data["runs"].items():
        seconds = run["seconds"] if run["finished"] else f"stopped at {run['seconds']}"
        counts = " | ".join(str(run[kind]) for kind in ("passed", "failed", "error", "skipped"))
        lines.append(f"| {name} | {counts} | {seconds} |")
    for name, run in data["runs"].items():
        lines += [f"- {name}: {failure}" for failure in run["failures"]]
    return "\n".join(lines)


def main(argv=None):
    args = gpu_report.parser(__doc__).parse_args(argv)
    record = gpu_report.Record("tests", args, markdown)
    if not gpu_report.on_gpu(args.device):
        record["skipped"] = "pytest -m gpu needs a GPU (CI runs these tests on the emulated device)"
    else:
        seconds = gpu_report.Budget(args.budget).left()
        with ThreadPoolExecutor(len(RUNS)) as pool:
            runs = {name: pool.submit(run_pytest, env, seconds) for name, env in RUNS.items()}
            record["runs"] = {name: run.result() for name, run in runs.items()}
        if not all(passed(run) for run in record["runs"].values()):
            record.fail()
    record.save()
    return record.exit_status()


if __name__ == "__main__":
    sys.exit(main())
