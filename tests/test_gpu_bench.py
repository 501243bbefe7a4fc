"""bench/gpu/gpu_bench.py, gpu_profile.py and gpu_attention.py on the CPU: a side that fails is FAILED
in the table and the benchmark's status is 1, what the budget cannot hold is not run, and the
profile's sums (busy time as the union of the kernels' intervals, time per category and per kernel) and
its comparison with the engine's own count of launches."""

import json
import sys
from pathlib import Path

import numpy as np

from autograd import gpu_costs
from tinygpt import GPTConfig

BENCH = Path(__file__).parents[1] / "bench"
sys.path[:0] = [str(BENCH), str(BENCH / "gpu")]  # gpu_check and its parts
import gpu_attention  # noqa: E402
import gpu_bench  # noqa: E402
import gpu_profile  # noqa: E402
import gpu_report  # noqa: E402
import torch_gpt  # noqa: E402

SMALL = ["--device", "cpu", "--preset", "tiny", "--seq", "16", "--batch", "2", "--precision", "fp32"]


def test_a_side_that_fails_is_failed_in_the_table_and_the_status_is_one(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch_gpt, "torch", None)  # as in CI: every PyTorch side fails
    assert gpu_bench.main([*SMALL, "--out", str(tmp_path)]) == 1
    record = json.loads((tmp_path / "bench.json").read_text())
    (row,) = record["rows"]
    assert row["sides"]["tinygpt"]["tok_s"] > 0 and record["ok"] is False
    assert all("PyTorch is not installed" in row["sides"][side]["error"] for side in gpu_bench.EAGER[1:])
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| 2 | fp32 |"))
    assert line.count("FAILED") == 3 + 3 + 1 + 1 and "None" not in line  # tok/s, memory; SDPA's launches, MFU
    assert (
        "- FAILED: torch-sdpa 2 fp32, transformers 2 fp32, torch-compile 2 fp32: SystemExit"
        in record["markdown"]
    )


def test_what_the_budget_cannot_hold_is_not_run(tmp_path):
    assert gpu_bench.main([*SMALL, "--out", str(tmp_path), "--budget", "0"]) == 0
    (row,) = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert set(row["sides"]) == set(gpu_bench.SIDES)
    assert all(figures == {"not_run": "0 s of the budget left"} for figures in row["sides"].values())


def test_the_plan_measures_eager_rows_bf16_first_and_compile_last_largest_batch_first():
    args = gpu_report.parser("", model=True).parse_args(["--device", "cpu"])
    args.batch, args.precision, args.sides = [8, 32], ["bf16", "fp32"], list(gpu_bench.SIDES)
    order = gpu_bench.plan(args)
    assert order[:4] == [("tinygpt", 8, "bf16"), ("torch-sdpa", 8, "bf16"), ("transformers", 8, "bf16")] + [
        ("tinygpt", 32, "bf16")
    ]
    assert order[-4:] == [("torch-compile", batch, p) for p in ("bf16", "fp32") for batch in (32, 8)]


def test_ratios_and_mfu():
    row = {"precision": "bf16", "sides": {"tinygpt": {"tok_s": 100.0}, "torch-sdpa": {"tok_s": 200.0}}}
    row["sides"]["torch-compile"] = {"error": "..."}
    gpu_bench.ratios(row, flops=1e12, peaks={"bf16": 1000})
    assert row["ratio_sdpa"] == 0.5 and "ratio_compile" not in row
    assert row["sides"]["tinygpt"]["mfu"] == 0.1 and row["sides"]["torch-sdpa"]["mfu"] == 0.2


EVENTS = [  # (name, start µs, end µs) as the profiler gives them: two kernels overlap, a copy, a gap
    ("attention_forward_mma_d64_bf16", 0.0, 100.0),
    ("cupy_add__float32_float32_float32", 50.0, 150.0),
    ("Memcpy DtoH (Device -> Pageable)", 200.0, 210.0),
    ("attention_forward_mma_d64_bf16", 300.0, 400.0),
]


def test_busy_time_is_the_union_of_the_intervals_and_copies_are_no_launches():
    assert gpu_profile.busy_us(EVENTS) == 150 + 10 + 100
    profile = gpu_profile.summary(EVENTS, wall_s=0.0005)
    assert profile["busy_ms"] == 0.26 and profile["wall_ms"] == 0.5 and profile["launches"] == 3
    assert profile["categories"] == {
        "attention": {"launches": 2, "ms": 0.2},
        "elementwise": {"launches": 1, "ms": 0.1},
        "copies": {"launches": 1, "ms": 0.01},
    }
    assert list(profile["kernels"])[0] == "attention_forward_mma_d64_bf16"


def test_the_engines_count_is_compared_with_the_profilers_names():
    config = GPTConfig.preset("tiny", vocab_size=256)
    ids = np.random.default_rng(0).integers(0, 256, (2, 17))
    step, _ = gpu_profile.train_step.tinygpt_step(config, ids, "cuda-emulated", "fp32")
    with gpu_costs.count_launches(run=False) as counted:
        step()
    names = [launch.name for launch in counted.launches]  # what a profiler would show, in full
    assert gpu_profile.engine_count(config, ids, "fp32", names)["differences"] == []
    missed = next(name for name in names if gpu_costs.is_project_kernel(name))
    names.remove(missed)  # one launch the profiler did not see
    compared = gpu_profile.engine_count(config, ids, "fp32", names)
    assert compared["total"] == (counted.kernels, counted.kernels - 1)
    assert any(line.startswith(f"{missed}: model") for line in compared["differences"])
    figures = {"tinygpt": gpu_profile.summary(EVENTS, 0.001), "engine_count": compared}
    text = gpu_profile.markdown({"batch": 2, "precisions": {"fp32": figures}})
    assert "| attention | 0.20 (2) |" in text and "- launches counted by the engine on the CPU" in text


def test_on_the_cpu_the_profile_says_why_it_is_skipped(tmp_path):
    assert gpu_profile.main(["--device", "cpu", "--preset", "tiny", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "profile.json").read_text())
    assert record["markdown"] == "Skipped: the profile needs a GPU and PyTorch (torch.profiler)."


def test_attention_times_each_row_on_both_sides_and_runs_what_the_budget_holds(tmp_path):
    """On the emulated device, small: a row per precision and dropout with tinygpt's milliseconds, and
    PyTorch's (on the CPU here) with their ratio where PyTorch is installed; a budget of 0 runs none."""
    args = [
        "--device",
        "cuda-emulated",
        "--batch",
        "1",
        "--seq",
        "16",
        "--repeat",
        "1",
        "--out",
        str(tmp_path),
    ]
    assert gpu_attention.main(args) == 0
    record = json.loads((tmp_path / "attention.json").read_text())
    rows = [(row["precision"], row["dropout"]) for row in record["rows"]]
    assert rows == [("bf16", 0.0), ("bf16", 0.1), ("tf32", 0.0), ("tf32", 0.1)]
    assert all(row["tinygpt_ms"] > 0 for row in record["rows"])
    assert all((row["torch_ms"] is None) == (torch_gpt.torch is None) for row in record["rows"])
    assert "| bf16 | 1 | 0.1 |" in record["markdown"]
    assert gpu_attention.main([*args, "--budget", "0"]) == 0
    record = json.loads((tmp_path / "attention.json").read_text())
    assert record["rows"] == [] and len(record["not_run"]) == 4
