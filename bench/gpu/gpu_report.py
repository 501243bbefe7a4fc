"""What the parts of bench/gpu_check.py share: their command line, their time budget, and their
record, a JSON file written whole after each piece of work, so that a part that is stopped (by its
time limit, or a crash) leaves everything it measured before.

A part's record goes to <out>/<part>.json and, on a GPU, to bench/results/gpu-<part>-<device>.json.
It holds the part's figures, "ok" (False where something failed), and "markdown": the part's
section of the summary, rendered from the figures at each write.
"""

import argparse
import contextlib
import importlib.metadata
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import date
from pathlib import Path
from typing import NamedTuple

from autograd import backend, emulator

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"


PRESETS = ("gpt1", "mini", "tiny")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage error is one line (status 2); --help shows the usage."""

    def __init__(self, description):
        super().__init__(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def parser(description, model=False):
    """The command line every part takes; `model`: also the model and sequence length it times."""
    found = Parser(description)
    found.add_argument(
        "--device",
        type=device_name,
        default="cuda",
        help="cuda, cuda:N; cpu or cuda-emulated to try its logic",
    )
    found.add_argument(
        "--out", type=out_folder, default=os.environ.get("OUT"), help="folder for <part>.json (default $OUT)"
    )
    found.add_argument("--budget", type=seconds, help="seconds the part may take (default: no limit)")
    if model:
        found.add_argument(
            "--preset", default="gpt1", choices=PRESETS, help="the model (tiny to try the logic on a CPU)"
        )
        found.add_argument("--seq", type=whole, default=512, help="tokens per sequence")
    return found


def device_name(name):
    """A device name as backend.parse_device gives it; a usage error for one it refuses."""
    try:
        return backend.parse_device(name)
    except (ValueError, RuntimeError) as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def out_folder(path):
    """An absolute folder path (the parts run from the repository root), made if needed; a usage
    error for a file or a folder that cannot be written."""
    path = Path(path).absolute()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{path}: not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise argparse.ArgumentTypeError(f"{path}: {error.strerror}") from None
    if not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"{path}: not writable")
    return str(path)


def whole(text):
    """A whole number, 1 or more; a usage error otherwise."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text}: not a whole number (1 or more)")
    return int(text)


def seconds(text):
    """A number of seconds, 0 or more; a usage error otherwise."""
    value = float(text)
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"{text}: not a number of seconds (0 or more)")
    return value


class Budget:
    """The time a part has left: seconds from now, or no limit (None)."""

    def __init__(self, seconds=None):
        self.ends = time.monotonic() + (math.inf if seconds is None else seconds)

    def left(self):
        return max(self.ends - time.monotonic(), 0.0)

    def allows(self, seconds):
        """Whether `seconds` of work still fit."""
        return self.left() >= seconds


class Finished(NamedTuple):
    """How a command ended: its output (stdout and stderr together), its exit status (None where it
    ran out of time and was stopped), and the seconds it took."""

    output: str
    status: object
    seconds: float


def run_limited(command, seconds, env=None):
    """Run `command` from the repository root for at most `seconds`, in a session of its own; then
    stop whatever of it is still running (all of it, past its time; else what it left behind, such
    as compile workers), and remove the temporary files it made (its TMPDIR). Its output goes
    through a file: a process it left behind holding a pipe open would keep a reader waiting."""
    began = time.monotonic()
    with tempfile.TemporaryFile("w+", errors="replace") as log, tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": scratch, **(env or {})}
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            status = process.wait(timeout=None if seconds == math.inf else max(seconds, 0))
        except subprocess.TimeoutExpired:
            status = None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        log.seek(0)
        return Finished(log.read(), status, round(time.monotonic() - began, 1))


def on_gpu(device):
    """True for a real GPU's name ('cuda:N'), False for 'cpu' and the emulated device."""
    return device.startswith("cuda:")


def median_seconds(run, repeat, device):
    """The median seconds of `run` over `repeat` calls, after one that compiles and allocates, each
    waited for: the whole GPU's work, CuPy's and PyTorch's (nothing to wait for on a CPU)."""
    run()
    times = []
    for _ in range(repeat):
        if on_gpu(device):
            backend.cupy.cuda.Device(backend.gpu_index(device)).synchronize()
        start = time.perf_counter()
        run()
        if on_gpu(device):
            backend.cupy.cuda.Device(backend.gpu_index(device)).synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def describe(device):
    """The device's name (and memory, for a GPU)."""
    if not on_gpu(device):
        return {"name": device}
    props = backend.cupy.cuda.runtime.getDeviceProperties(backend.gpu_index(device))
    return {"name": props["name"].decode(), "memory_gb": round(props["totalGlobalMem"] / 1e9, 1)}


def slug(name):
    """A device name as a file-name part: 'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def versions():
    """The versions of Python and of the packages the parts use, read without importing them."""
    found = {"python": sys.version.split()[0]}
    installed = importlib.metadata.packages_distributions()  # {"cupy": ["cupy-cuda13x"], ...}
    for name in ("numpy", "cupy", "torch", "transformers", "ml_dtypes"):
        for distribution in installed.get(name, [])[:1]:
            found[name] = importlib.metadata.version(distribution)
    return found


def count(n, word):
    """'1 error', '2 errors'."""
    return f"{n} {word}" + ("" if n == 1 else "s")


def failure(error):
    """What a record keeps of an error: its type, message and the traceback's last lines."""
    return "".join(traceback.format_exception(error))[-1500:]


def write(data, out, file_name):
    """`data` as JSON in out/<file_name> (where out is given) and, for a GPU, in bench/results under
    the device's name."""
    text = json.dumps(data, indent=2, default=str)
    paths = [Path(out) / file_name] if out else []
    device = data["device"]["name"]
    if device not in ("cpu", emulator.NAME):
        stem, suffix = file_name.rsplit(".", 1)
        paths.append(RESULTS / f"gpu-{stem}-{slug(device)}.{suffix}")
    for path in paths:
        write_whole(path, text)


def write_whole(path, text):
    """`text` in the file `path`, whole or not at all (through path.partial): a reader, or a process
    stopped halfway, never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


def read(path):
    """A record written by `write`; None where there is none (its part never got to write it)."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None


class Record:
    """A part's figures, written out after each piece of work. `render(data)` gives the part's
    Markdown section; `ok` is False once anything has failed."""

    def __init__(self, part, args, render):
        self.part, self.out, self.render = part, args.out, render
        self.data = {
            "part": part,
            "device": describe(args.device),
            "date": date.today().isoformat(),
            "versions": versions(),
            "budget_s": args.budget,
            "ok": True,
        }
        self.began = time.monotonic()

    def __getitem__(self, key):
        return self.data[key]

    def __setitem__(self, key, value):
        self.data[key] = value

    def fail(self):
        self.data["ok"] = False

    def save(self):
        self.data["seconds"] = round(time.monotonic() - self.began, 1)
        self.data["markdown"] = self.render(self.data)
        write(self.data, self.out, f"{self.part}.json")

    def exit_status(self):
        return 0 if self.data["ok"] else 1
