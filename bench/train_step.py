"""Time a GPT training step (forward, backward, Adam) with tinygpt.

    python bench/train_step.py --preset mini --batch 8 --seq 256 [--device cpu|cuda] [--json PATH]

Prints the median step time and tokens per second over --steps timed steps after --warmup
untimed ones.
"""
import argparse
import json
import platform
import statistics
import time
from datetime import date

import numpy as np

import autograd as ag
from autograd import backend
from autograd import functional as F
from autograd.optim import Adam
from tinygpt import GPT, GPTConfig


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="mini")
    parser.add_argument("--vocab-size", type=int, default=None, help="override the preset's vocabulary")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=None, help="tokens per sequence (default: n_ctx)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()

    overrides = {"vocab_size": args.vocab_size} if args.vocab_size else {}
    config = GPTConfig.preset(args.preset, **overrides)
    seq = args.seq or config.n_ctx
    device = backend.parse_device(args.device)
    ag.manual_seed(0)
    model = GPT(config).to(device).train()
    optimizer = Adam(model.parameters(), lr=2.5e-4, l2=0.01)
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (args.batch, seq + 1))

    def step():
        loss = F.cross_entropy(model(ids[:, :-1]), ids[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item()  # brings the loss to the host, so the step has finished

    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    result = {"device": device if device == "cpu" else f"{device} ({platform.node()})", "preset": args.preset,
              "parameters": model.num_parameters(), "batch": args.batch, "seq": seq,
              "step_s": round(median, 4), "tok_s": round(args.batch * seq / median, 1),
              "machine": f"{platform.machine()}, numpy {np.__version__}", "date": date.today().isoformat()}
    print(f"{args.preset} ({result['parameters']:,} parameters), batch {args.batch} x {seq} on {device}: "
          f"{median:.3f} s per step (median of {args.steps}), {result['tok_s']:,.0f} tokens/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
