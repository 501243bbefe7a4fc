"""A linear layer's bias gradient on a GPU, the sum of the output gradient's rows: column_sums
(autograd/kernels/cuda/column_sums.cu, one launch that reads the gradient in its own type) against the
reference's CuPy sum of a float32 copy, and PyTorch's grad.sum(0) where PyTorch is installed. GPT-1's
shapes at batch 8 (4,096 rows; widths 768, 2,304 and 3,072), bfloat16 and float32; microseconds per
sum, the median of --repeat, and the bytes read per microsecond.

    PYTHONPATH=. python bench/gpu/gpu_column_sums.py [--device cuda] [--rows 4096] [--repeat 50] [--json PATH]

--device cuda-emulated --rows 40 --repeat 1 tries its logic on a CPU (its times mean nothing there).
"""

import argparse
import functools
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_report  # noqa: E402

from autograd import backend  # noqa: E402
from autograd.kernels import linear  # noqa: E402
from autograd.precision import bfloat16, widened  # noqa: E402

WIDTHS = (768, 2304, 3072)


def microseconds(run, args):
    return gpu_report.median_seconds(run, args.repeat, args.device) * 1e6


def reference_sum(grad):
    """The reference's bias gradient (autograd/functional.py's Linear.backward)."""
    return widened(grad).sum(axis=0)


def torch_side(grad):
    try:
        import torch
    except ImportError:
        return None
    if grad.dtype == bfloat16:
        g = torch.from_dlpack(grad.view(np.uint16)).view(torch.bfloat16)
    else:
        g = torch.from_dlpack(grad)
    return lambda: g.sum(0, dtype=torch.float32)


def main(argv=None):
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--device", default="cuda", type=backend.parse_device)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)
    rows = []
    print("| type | width | column_sums µs | CuPy (float32 copy) µs | PyTorch µs | column_sums GB/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for dtype in (bfloat16, np.float32):
        for width in WIDTHS:
            host = np.random.default_rng(0).standard_normal((args.rows, width)).astype(dtype)
            grad = backend.to_device(host, args.device)
            with backend.device_scope(grad):
                ours = microseconds(functools.partial(linear.column_sums, grad), args)
                cupy = microseconds(functools.partial(reference_sum, grad), args)
                torch_run = torch_side(grad) if args.device.startswith("cuda:") else None
                torch_us = microseconds(torch_run, args) if torch_run else None
                sums = backend.to_host(linear.column_sums(grad))
            same = np.allclose(sums, host.astype(np.float64).sum(0), rtol=1e-4, atol=1e-3)
            row = dict(
                dtype=str(np.dtype(dtype)), width=width, column_sums_us=ours, cupy_us=cupy, torch_us=torch_us
            )
            row.update(gb_s=grad.nbytes / ours / 1e3, agrees=bool(same))
            rows.append(row)
            torch_text = f"{torch_us:.1f}" if torch_us else ""
            print(
                f"| {row['dtype']} | {width} | {ours:.1f} | {cupy:.1f} | {torch_text} | {row['gb_s']:.0f} |"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "rows": args.rows, "figures": rows}, f, indent=2)
    return 0 if all(row["agrees"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
