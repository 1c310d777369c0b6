"""`python -m bench.serving.simulated_device [--fixed-ms F] [--us-per-token T] -- PRELUDE FLAGS`:
Prelude on the null executor, each forward taking what a device step would: F ms plus T us per
token computed (a cached prefix is not), slept with the GIL released, as the step thread waits
for a GPU's kernels.

Device time is scarce (issue 46: 15 minutes when a machine is lent at all), and the host side of
a GPU server (the event loop, the step thread, their hand-offs and turns at the GIL around each
step's wait) is the same Python on any machine. This reproduces it on the CPU: the defaults are
the H200's graphed Qwen3-0.6B steps (`bench/serving/results/h200-2026-12-04/gpu_profile.txt`:
kernels 1.39 ms for 128 tokens, 15.6 ms for 8,192). Use it as `--server-cmd` of the load
generator, e.g.

    python -m bench.serving --server-cmd "python -m bench.serving.simulated_device" \\
        --shapes 512/1 --concurrency 64,256 -- --executor null

What it cannot show: the GPU's own launch work (the graph replay, flashinfer's plan), which run
for real only on the device.
"""
from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixed-ms", type=float, default=1.2, help="a step's cost whatever its size")
    parser.add_argument("--us-per-token", type=float, default=1.75, help="a step's cost per token it computes")
    args, prelude_args = parser.parse_known_args(argv)
    if prelude_args[:1] == ["--"]:
        prelude_args = prelude_args[1:]
    if "--executor" not in prelude_args:
        prelude_args = ["--executor", "null", *prelude_args]
    if "--device" not in prelude_args:  # the null executor on the runner a CUDA server runs (the torch one)
        prelude_args = [*prelude_args, "--device", "cuda"]

    from prelude.executor.null_model import NullModel

    fixed, per_token = args.fixed_ms / 1e3, args.us_per_token / 1e6
    forward = NullModel.forward

    def timed_forward(self, input_ids, positions, attention, keep=None, on_launch=None):
        hidden = forward(self, input_ids, positions, attention, keep, on_launch)
        time.sleep(fixed + per_token * input_ids.shape[0])
        return hidden

    NullModel.forward = timed_forward  # type: ignore[method-assign]
    from prelude.__main__ import main as prelude_main

    return prelude_main(prelude_args)


if __name__ == "__main__":
    sys.exit(main())
