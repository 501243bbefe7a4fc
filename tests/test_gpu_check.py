"""bench/gpu_check.py on the CPU: every part runs its logic (or says why it is skipped) in a process
of its own; the out folder holds at most 8 files, with plain names; a part that crashes or runs over
its time leaves the earlier parts' records whole; the deadline skips what it cannot hold. And the
tests part's pytest runs: their counts, failures and time limit."""

import importlib.util
import json
import re
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[1] / "bench"
sys.path[:0] = [str(BENCH), str(BENCH / "gpu")]  # gpu_check and its parts
import gpu_check  # noqa: E402
import gpu_modules  # noqa: E402
import gpu_report  # noqa: E402
import gpu_tests  # noqa: E402

SMALL = ["--device", "cpu", "--preset", "tiny", "--seq", "16", "--batch", "2", "--precision", "fp32"]


def test_every_part_on_the_cpu_and_a_crash_that_leaves_the_others_whole(monkeypatch, tmp_path):
    crash = tmp_path / "crash.py"
    crash.write_text("import os\nos.abort()\n")
    monkeypatch.delitem(gpu_check.PARTS, "attention")  # the crash takes its place among the 8 files
    monkeypatch.setitem(gpu_check.PARTS, "crash", gpu_check.Part(str(crash), 60))
    out = tmp_path / "out"
    assert gpu_check.main([*SMALL, "--out", str(out)]) == 1

    files = sorted(path.name for path in out.iterdir())
    assert len(files) <= 8 and all(re.fullmatch(r"[A-Za-z0-9._-]+", name) for name in files)
    records = {
        name: json.loads((out / f"{name}.json").read_text()) for name in gpu_check.PARTS if name != "crash"
    }
    assert records["modules"]["ok"] and all(r["ok"] for r in records["modules"]["checks"].values())
    assert all(case["alone"] is None for case in records["sanitize"]["cases"].values())  # on cuda-emulated
    assert "needs a GPU" in records["tests"]["skipped"] and "needs a GPU" in records["profile"]["skipped"]
    assert records["bench"]["rows"][0]["sides"]["tinygpt"]["tok_s"] > 0
    check = json.loads((out / "check.json").read_text())
    assert check["parts"]["crash"]["result"] == "CRASHED (status -6)" and check["ok"] is False
    summary = (out / "summary.md").read_text()
    assert all(f"\n## {name}\n" in summary for name in records)
    modules = gpu_check.PARTS["modules"].seconds
    assert "| crash | 60 | 60 |" in summary and f"| modules | {modules} | {modules} |" in summary


def test_a_part_past_its_limit_is_stopped_and_the_deadline_skips_the_rest(monkeypatch, tmp_path):
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import time\ntime.sleep(60)\n")
    monkeypatch.setattr(
        gpu_check, "PARTS", {"slow": gpu_check.Part(str(sleeper), 1), "next": gpu_check.Part("", 5)}
    )
    monkeypatch.setattr(gpu_check, "GRACE_S", 1)
    monkeypatch.setattr(gpu_check, "MIN_PART_S", 1)
    assert gpu_check.main(["--device", "cpu", "--out", str(tmp_path / "out"), "--deadline", "4"]) == 1
    check = json.loads((tmp_path / "out" / "check.json").read_text())
    assert check["parts"]["slow"]["result"] == "FAILED: stopped at its limit of 1 s"
    assert re.fullmatch(r"skipped: [01] s left before the deadline", check["parts"]["next"]["result"])
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == [
        "check.json",
        "slow.json",
        "summary.md",
    ]


def test_a_relative_out_folder_from_elsewhere_holds_every_record(monkeypatch, tmp_path):
    """The parts run from the repository root: a relative --out is made absolute first."""
    monkeypatch.chdir(tmp_path)
    assert gpu_check.main([*SMALL, "--parts", "sanitize", "tests", "--out", "relative"]) == 0
    assert sorted(path.name for path in (tmp_path / "relative").iterdir()) == [
        "check.json",
        "sanitize.json",
        "summary.md",
        "tests.json",
    ]


@pytest.mark.parametrize(
    "argument, message",
    [
        (["--device", "gpu"], "device must be"),
        (["--out", "a-file"], "a-file: not a folder"),
        (["--deadline", "-1"], "-1: not a number of seconds"),
    ],
)
def test_a_bad_argument_is_one_line_of_usage(monkeypatch, tmp_path, capsys, argument, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("")
    for main in (gpu_check.main, gpu_modules.main):
        with pytest.raises(SystemExit) as exited:
            main(["--device", "cpu", "--out", "out", *argument])
        error = capsys.readouterr().err.strip().splitlines()[-1]
        assert exited.value.code == 2 and message in error and "Traceback" not in error
        if argument[0] == "--deadline":
            break  # the driver's alone


def test_no_gpu_is_one_line_and_status_2(monkeypatch, tmp_path, capsys):
    """The default --device cuda on a machine without CuPy or a GPU: one line, not a usage block."""
    monkeypatch.setattr(gpu_report.backend, "cupy", None)
    with pytest.raises(SystemExit) as exited:
        gpu_check.main(["--out", str(tmp_path)])
    [error] = capsys.readouterr().err.splitlines()
    assert exited.value.code == 2 and ": error: argument --device: device 'cuda'" in error


def test_nothing_measured_is_no_success(tmp_path):
    assert gpu_check.main([*SMALL, "--deadline", "1", "--out", str(tmp_path)]) == 1
    check = json.loads((tmp_path / "check.json").read_text())
    assert all(part["result"].startswith("skipped") for part in check["parts"].values())


def test_a_stopped_part_leaves_no_process_and_no_temporary_file(tmp_path):
    """run_limited stops the part's whole session at its limit, a child it started included, and
    removes what it wrote in its TMPDIR."""
    script = tmp_path / "starts_a_child.py"
    script.write_text(
        "import os, subprocess, sys, tempfile, time\n"
        "tempfile.NamedTemporaryFile(delete=False)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, tempfile.gettempdir(), flush=True)\n"
        "time.sleep(60)\n"
    )
    finished = gpu_report.run_limited([sys.executable, str(script)], 3)
    child, scratch = finished.output.split()
    assert finished.status is None and not Path(scratch).exists()
    time.sleep(0.2)
    state = Path(f"/proc/{child}/stat")  # gone, or a zombie its new parent has yet to reap
    assert not state.exists() or state.read_text().split(")")[1].split()[0] == "Z"


def test_a_part_writes_its_record_after_each_check(monkeypatch, tmp_path):
    def crash(args, work):
        raise SystemExit("the process went down")  # not an Exception: nothing after it runs

    checks = {"step": lambda args, work: {"ok": True, "host_reads": 0}, "crash": crash}
    monkeypatch.setattr(gpu_modules, "CHECKS", checks)
    with pytest.raises(SystemExit):
        gpu_modules.main(["--device", "cpu", "--out", str(tmp_path)])
    record = json.loads((tmp_path / "modules.json").read_text())
    assert record["checks"] == {"step": {"ok": True, "host_reads": 0}}


TESTS = """\
import time
import pytest

@pytest.mark.gpu
def test_passes():
    pass

@pytest.mark.gpu
def test_fails():
    assert 1 == 2

@pytest.mark.gpu
def test_waits():
    time.sleep(float(__import__("os").environ.get("WAIT", "0")))

def test_not_on_a_gpu():
    pass
"""


def test_a_pytest_run_gives_its_counts_its_failures_and_stops_at_its_limit(monkeypatch, tmp_path):
    tests = tmp_path / "test_some.py"
    tests.write_text(TESTS)
    run = gpu_tests.run_pytest({}, 60, [str(tests)], workers=1)
    assert run["finished"] and (run["passed"], run["failed"], run["skipped"]) == (2, 1, 0)
    assert len(run["failures"]) == 1 and "test_fails" in run["failures"][0] and not gpu_tests.passed(run)
    stopped = gpu_tests.run_pytest({"WAIT": "60"}, 2, [str(tests)], workers=1)
    assert not stopped["finished"] and stopped["status"] is None


def test_the_runs_take_workers_where_xdist_is_installed():
    command = gpu_tests.command(["tests"], workers=4)
    assert command[-1] == "tests" and ("-m", "gpu") == tuple(command[3:5])
    assert ("-n" in command) == (importlib.util.find_spec("xdist") is not None)
    assert "-n" not in gpu_tests.command(["tests"], workers=1)
