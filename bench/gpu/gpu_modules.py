"""The training modules on a device, and what a run there must keep: each check recorded whether it
passes or not, the record written again after each.

    PYTHONPATH=. python bench/gpu/gpu_modules.py [--out DIR] [--preset gpt1 --seq 512]

    modules      train.pretrain, a resume of it, train.finetune, train.generate and
                 train.evaluate perplexity, small (the tiny preset), on the device
    resume       the resumed run logs the losses of the run that went on, bit for bit
    determinism  a second run with the same seed logs the same losses, bit for bit
    crossdevice  a checkpoint written on the device loads on the CPU with the same bits, a
                 checkpoint written on the CPU loads on the device with the same bits
    step         one training step of --preset at batch 8 reads nothing back to the host
"""

import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_report  # noqa: E402

import autograd as ag  # noqa: E402
from autograd import backend, host_reads  # noqa: E402
from autograd import functional as F  # noqa: E402
from autograd.optim import Adam, clip_grad_norm  # noqa: E402
from autograd.serialization import load_file  # noqa: E402
from tinygpt import GPT, GPTConfig  # noqa: E402
from train import evaluate, finetune, generate, pretrain  # noqa: E402
from train.checkpoint import load_checkpoint  # noqa: E402
from train.run_folder import read_config, read_metrics  # noqa: E402

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


def check_modules(args, work):
    """Every training module once, small, on the device; the run folder is kept for the checks
    that follow."""
    corpus, data, run, device = write_corpus(work), write_task(work), work / "run", args.device
    finetuning = ["--init-from", str(run), "--task", "jsonl", "--train", str(data), "--dev", str(data)]
    finetuning += ["--out", str(work / "finetune"), "--epochs", "1", "--batch-size", "8", "--device", device]
    perplexity = ["perplexity", "--run", str(run), "--data", str(corpus), "--max-tokens", "2000"]
    steps = {
        "pretrain": lambda: pretrain.main(
            ["--data", str(corpus), "--out", str(run), "--steps", "20", "--device", device, *SMALL_RUN]
        ),
        "resume": lambda: resume(run, device),
        "finetune": lambda: finetune.main(finetuning),
        "generate": lambda: generate.main(
            ["--run", str(run), "--prompt", "The", "--max-new-tokens", "20", "--device", device]
        ),
        "evaluate": lambda: evaluate.main([*perplexity, "--device", device]),
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


def check_resume(args, work):
    logged = json.loads((work / "resume.json").read_text())
    first, second = logged["uninterrupted"], logged["resumed"]
    return {"ok": first == second and len(first) == 20, "steps": len(second), "bit_for_bit": first == second}


def check_determinism(args, work):
    again = work / "again"
    run = ["--data", str(work / "corpus.txt"), "--out", str(again), "--steps", "20", "--device", args.device]
    quietly(lambda: pretrain.main([*run, *SMALL_RUN]))
    first, second = losses(work / "run"), losses(again)
    return {"ok": first == second, "steps": len(second), "bit_for_bit": first == second}


def check_crossdevice(args, work):
    """The device's checkpoint on the CPU, and a CPU checkpoint on the device: weights and Adam's
    moments with the same bits as where they were written."""
    cpu_run = work / "cpu-run"
    run = ["--data", str(work / "corpus.txt"), "--out", str(cpu_run), "--steps", "10", "--device", "cpu"]
    quietly(lambda: pretrain.main([*run, *SMALL_RUN]))
    there = {
        "device to cpu": (work / "run" / "checkpoints" / "20", "cpu"),
        "cpu to device": (cpu_run / "checkpoints" / "10", args.device),
    }
    same = {name: same_state(checkpoint, to) for name, (checkpoint, to) in there.items()}
    return {"ok": all(same.values()), **same}


def same_state(checkpoint, device):
    """Whether a checkpoint loaded on `device` holds the bits of the safetensors files."""
    config, _ = read_config(checkpoint.parent.parent)
    model = GPT(config).to(device)
    optimizer = Adam(model.parameters())
    load_checkpoint(str(checkpoint), model, optimizer)
    weights = load_file(str(checkpoint / "model.safetensors"))
    moments = load_file(str(checkpoint / "optimizer.safetensors"))
    names = [name for name, _ in model.named_parameters()]
    loaded = {name: backend.to_host(p.data) for name, p in model.named_parameters()}
    loaded_m = {f"m.{n}": backend.to_host(m) for n, m in zip(names, optimizer.m)}
    return all(np.array_equal(loaded[n], weights[n]) for n in names) and all(
        np.array_equal(loaded_m[k], moments[k]) for k in loaded_m
    )


def check_step(args, work):
    """One training step of the preset at batch 8 (forward, loss, backward, clipping, Adam), after
    two that compile the kernels and fill the memory pool: host reads it makes (none is right)."""
    config = GPTConfig.preset(args.preset)
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (8, args.seq + 1))
    ids = backend.to_device(ids, args.device)
    ag.manual_seed(0)
    model = GPT(config).to(args.device).train()
    optimizer = Adam(model.parameters(), lr=2.5e-4, l2=0.01)

    def step():
        with ag.random.use_masks(ag.random.MaskStream(0)):
            loss = F.cross_entropy(model(ids[:, :-1]), ids[:, 1:])
            optimizer.zero_grad()
            loss.backward()
            clip_grad_norm(model.parameters(), 1.0)
            optimizer.step()

    for _ in range(2):
        step()
    with host_reads.counting() as reads:
        step()
    return {"ok": reads.count == 0, "host_reads": reads.count}


CHECKS = {
    "modules": check_modules,
    "resume": check_resume,
    "determinism": check_determinism,
    "crossdevice": check_crossdevice,
    "step": check_step,
}


def attempt(work):
    """Run work() quietly: {"ok": True}, or {"ok": False, "error": its last lines}."""
    try:
        quietly(work)
        return {"ok": True}
    except BaseException as error:  # a module's usage error is a SystemExit
        if isinstance(error, KeyboardInterrupt):
            raise
        return {"ok": False, "error": gpu_report.failure(error)}


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


def errors(name, result):
    """(what, error) of a check's result and of the results inside it (check_modules' steps)."""
    found = [(name, result["error"])] if "error" in result else []
    inner = [(f"{name} {k}", v["error"]) for k, v in result.items() if isinstance(v, dict) and "error" in v]
    return found + inner


def markdown(data):
    lines = ["| check | result | figures |", "| --- | --- | --- |"]
    for name, result in data["checks"].items():
        figures = {
            k: v.get("ok") if isinstance(v, dict) else v
            for k, v in result.items()
            if k not in ("ok", "error")
        }
        lines.append(f"| {name} | {'ok' if result['ok'] else 'FAILED'} | {json.dumps(figures)} |")
    for name, result in data["checks"].items():
        for what, error in errors(name, result):
            lines += ["", f"{what}:", "```", error.strip().splitlines()[-1], "```"]
    return "\n".join(lines)


def main(argv=None):
    args = gpu_report.parser(__doc__, model=True).parse_args(argv)
    backend.use_device(args.device)
    record = gpu_report.Record("modules", args, markdown)
    record["checks"] = {}
    budget, work = gpu_report.Budget(args.budget), Path(tempfile.mkdtemp(prefix="gpu-modules-"))
    for name, check in CHECKS.items():
        if not budget.allows(1):
            result = {"ok": False, "error": "not run: the part's budget was spent"}
        else:
            try:
                result = check(args, work)
            except Exception as error:
                result = {"ok": False, "error": gpu_report.failure(error)}
        record["checks"][name] = result
        if not result["ok"]:
            record.fail()
        record.save()
    shutil.rmtree(work, ignore_errors=True)
    return record.exit_status()


if __name__ == "__main__":
    sys.exit(main())
