"""The progress of one phase of train.prepare (reading, counting words, merging, encoding)."""

import os
import sys
import time

from tqdm import tqdm

EVERY = 5.0  # seconds between progress lines off a terminal


class Progress:
    """One phase's progress: a tqdm bar on a terminal; off one, a plain line every EVERY seconds."""

    def __init__(self, phase, total, unit):
        off = not sys.stderr.isatty() or bool(os.environ.get("TQDM_DISABLE"))
        self.bar = tqdm(total=total, desc=phase, unit=unit, unit_scale=True, disable=off, dynamic_ncols=True)
        self.phase, self.unit, self.total, self.done = phase, unit, total, 0
        self.began = self.shown = time.monotonic()

    def update(self, n):
        self.bar.update(n)
        self.done += n
        if self.bar.disable and time.monotonic() - self.shown >= EVERY:
            self.shown = time.monotonic()
            print(self.line(), flush=True)

    def line(self):
        seconds = max(time.monotonic() - self.began, 1e-9)
        rate = self.done / seconds
        left = f", {(self.total - self.done) / rate:.0f} s left" if rate and self.done < self.total else ""
        if self.unit == "B":  # in MB, to a tenth
            done, total, rate = (f"{n / 2**20:,.1f}" for n in (self.done, self.total, rate))
            return f"{self.phase}: {done} of {total} MB ({rate} MB/s{left})"
        return f"{self.phase}: {self.done:,} of {self.total:,} {self.unit} ({rate:,.0f} {self.unit}/s{left})"

    def close(self):
        self.bar.close()
        if self.bar.disable and self.total:
            print(self.line().split(" (")[0] + f" in {time.monotonic() - self.began:.1f} s", flush=True)
