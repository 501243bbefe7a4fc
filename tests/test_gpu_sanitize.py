"""bench/gpu/gpu_cases.py and bench/gpu/gpu_sanitize.py on the CPU: the cases launch every kernel the CUDA
sources export, each case runs as a script of its own on the emulated device, and the sanitizer
part reads compute-sanitizer's summaries (from a stand-in that prints them), reports what it finds
per case and per tool, and tells the jobs that ran out of time from the ones that were not run."""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from autograd.emulator import kernels as emulator_kernels
from autograd.kernels import compiling, sources

BENCH = Path(__file__).parents[1] / "bench"
sys.path[:0] = [str(BENCH), str(BENCH / "gpu")]  # gpu_check and its parts
import gpu_cases  # noqa: E402
import gpu_report  # noqa: E402
import gpu_sanitize  # noqa: E402

# compute-sanitizer's command line (--tool T --print-limit N, then the program) and summary lines: it
# runs the program, then says it found something where FAKE_FINDS names the case, and first sleeps
# where FAKE_SLOW does
FAKE_SANITIZER = """\
import os, subprocess, sys, time
tool, program = sys.argv[2], sys.argv[5:]
case = program[2]
if case == os.environ.get("FAKE_SLOW"):
    time.sleep(60)
status = subprocess.run(program).returncode
found = int(case == os.environ.get("FAKE_FINDS"))
if found:
    print("========= Invalid __global__ read of size 4 bytes")
if tool == "racecheck":
    print(f"========= RACECHECK SUMMARY: {found} hazards displayed ({found} errors, 0 warnings)")
else:
    print(f"========= ERROR SUMMARY: {found} errors")
sys.exit(status)
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="the emulated device builds the kernels with g++")
def test_the_cases_launch_every_kernel_the_sources_export(monkeypatch):
    exported = set()
    for source in compiling.SOURCES.glob("*.cu"):
        exported |= emulator_kernels.kernel_declarations(compiling.text(source.stem)).keys()
    launched, kernel = set(), sources.kernel

    def recorded(name, function, dtype):
        launched.add(f"{function}_{compiling.SUFFIXES[np.dtype(dtype)]}")
        return kernel(name, function, dtype)

    monkeypatch.setattr(sources, "kernel", recorded)
    for case in gpu_cases.CASES:
        assert gpu_cases.run(case, "cuda-emulated"), case
    assert launched == exported


def test_a_case_that_fails_says_so_and_the_status_is_one(monkeypatch, capsys):
    def broken(device):
        raise ValueError("out of bounds")

    monkeypatch.setitem(gpu_cases.CASES, "broken", broken)
    assert gpu_cases.main(["gelu-f32", "broken", "--device", "cuda-emulated"]) == 1
    printed = capsys.readouterr().out
    assert "done gelu-f32" in printed and "failed broken:" in printed and "out of bounds" in printed


def test_sanitizer_findings_per_case_and_tool_and_jobs_out_of_time(monkeypatch, tmp_path):
    fake = tmp_path / "compute-sanitizer"
    fake.write_text(f"#!{sys.executable}\n{FAKE_SANITIZER}")
    fake.chmod(0o755)
    monkeypatch.setenv("FAKE_FINDS", "dropout-bf16")
    monkeypatch.setenv("FAKE_SLOW", "adam-clip")
    # long enough for a case's Python to start on a loaded machine (the tests may run side by side)
    monkeypatch.setattr(gpu_sanitize, "LIMIT_S", {"memcheck": 10, "racecheck": 10})
    monkeypatch.setattr(gpu_sanitize, "MIN_JOB_S", 1)
    cases = ["gelu-f32", "dropout-bf16", "adam-clip"]
    argv = ["--device", "cpu", "--out", str(tmp_path), "--sanitizer", str(fake), "--cases", *cases]
    assert gpu_sanitize.main(argv) == 1  # dropout-bf16's findings

    record = json.loads((tmp_path / "sanitize.json").read_text())
    jobs = record["cases"]
    assert all(jobs[case]["alone"] is None for case in cases)  # each ran without a tool first
    assert gpu_sanitize.clean(jobs["gelu-f32"]["memcheck"]) and gpu_sanitize.clean(
        jobs["gelu-f32"]["racecheck"]
    )
    assert jobs["dropout-bf16"]["memcheck"]["errors"] == 1
    assert jobs["dropout-bf16"]["racecheck"]["hazards"] == [1, 1, 0]
    assert not any(jobs["adam-clip"][tool]["finished"] for tool in gpu_sanitize.TOOLS)
    table = record["markdown"]
    assert "| gelu-f32 | ok | 0 errors | 0 hazards (0 errors, 0 warnings) |" in table
    assert "| dropout-bf16 | ok | 1 error | 1 hazard (1 error, 0 warnings) |" in table
    assert "| adam-clip | ok | did not finish in 10 s | did not finish in 10 s |" in table
    assert "Invalid __global__ read" in table


def test_a_job_the_budget_cannot_hold_is_not_run():
    job = gpu_sanitize.sanitize("compute-sanitizer", "racecheck", "gelu-f32", "cuda:0", gpu_report.Budget(5))
    assert job == {"ran": False, "why": "5 s of the budget left"}
    assert gpu_sanitize.cell(job) == "not run (5 s of the budget left)"


def test_a_job_whose_program_crashed_or_printed_no_summary_is_not_clean():
    crashed = gpu_report.Finished("========= ERROR SUMMARY: 0 errors\nSegmentation fault\n", -11, 3.0)
    job = {"ran": True, "limit_s": 60, **gpu_sanitize.read_report(crashed, "gelu-f32")}
    assert not gpu_sanitize.clean(job) and gpu_sanitize.cell(job) == "0 errors; the case stopped (status -11)"
    silent = gpu_report.Finished("done gelu-f32\n", 0, 3.0)
    job = {"ran": True, "limit_s": 60, **gpu_sanitize.read_report(silent, "gelu-f32")}
    assert not gpu_sanitize.clean(job) and gpu_sanitize.cell(job) == "no summary"
