"""bench/gpu_check.py keeps what it measured: a precision whose step fails leaves the others'
throughput, and the JSON is written after each check, so a check that brings the process down
loses nothing measured before it."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
import gpu_check  # noqa: E402
import train_step  # noqa: E402


def test_a_precision_that_fails_keeps_the_figures_of_the_others(monkeypatch):
    def tinygpt_step(config, ids, device, precision):
        if precision == "bf16":  # as CuPy 14's batched matmul did
            raise TypeError("data type 'E' not understood")
        return (lambda: None), None

    monkeypatch.setattr(train_step, "tinygpt_step", tinygpt_step)
    monkeypatch.setattr(train_step, "torch_step", lambda *args: lambda: None)
    monkeypatch.setattr(train_step, "time_rounds", lambda steps, **kw: {"tinygpt": 0.5, "torch": 1.0})
    args = gpu_check.parse_args(["--device", "cpu", "--preset", "tiny", "--seq", "8"])
    figures = gpu_check.check_throughput(args, "cpu", None)
    assert figures["ok"] is False and "data type 'E' not understood" in figures["bf16"]["error"]
    for precision in ("fp32", "tf32"):
        assert figures[precision] == {"tinygpt_tok_s": 128.0, "torch_tok_s": 64.0, "ratio": 2.0}


def test_the_report_is_written_after_each_check(monkeypatch, tmp_path):
    def crash(args, device, work):
        raise SystemExit("the process went down")  # not an Exception: nothing after it runs

    monkeypatch.setattr(
        gpu_check, "CHECKS", {"step": lambda args, device, work: {"host_reads": 0}, "crash": crash}
    )
    with pytest.raises(SystemExit):
        gpu_check.main(["--device", "cpu", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "gpu-check-cpu.json").read_text())
    assert report["checks"]["step"]["host_reads"] == 0 and "crash" not in report["checks"]
