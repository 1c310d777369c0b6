"""`python -m bench.kernels.stop_latency`: how long a preemptible OneShot step takes to step
aside once its StopFlag goes up, and what stepping aside costs it, without the server.

One long row (the demo model by default) runs on the runner's resumable path: first with the
flag down (one piece, as an unpreemptible step), then with the flag raised by a timer at a
random moment every time the step resumes, until it finishes. Reports the whole step's time,
the interrupted one's, and the wait from each raise to the step's return (P50, P90, max)."""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

import torch

from bench.serving.core import report
from bench.kernels.decode_step import BLOCK, cpu_runner
from prelude.contract.batch import OutputSpec, PrefillRow
from prelude.contract.stop import StopFlag
from prelude.demo import ensure_demo_model
from prelude.engine.preemption import CHECK_EVERY_MACS
from prelude.host_tuning import set_compute_threads


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.kernels.stop_latency", description=__doc__)
    p.add_argument("--model", help="checkpoint directory (default: the demo model)")
    p.add_argument("--tokens", type=int, default=8000, help="the long row's tokens")
    p.add_argument("--check-every-macs", type=int, default=CHECK_EVERY_MACS)
    p.add_argument("--max-gap-ms", type=float, default=30.0, help="a raise comes 2 ms to this long after a resume")
    p.add_argument("--json", type=Path, help="results file (default bench-results/stop_latency-<time>.json)")
    args = p.parse_args(argv)
    set_compute_threads(None)
    path = args.model or str(ensure_demo_model())
    blocks = -(-args.tokens // BLOCK)
    runner = cpu_runner(path, args.tokens + 1, blocks)
    runner.warmup()
    ids = torch.randint(5, 500, (args.tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    row = [PrefillRow(0, ids, 0, list(range(blocks)), OutputSpec(pooling="last"))]
    stop = StopFlag(args.check_every_macs)

    began = time.perf_counter()
    assert runner.advance(runner.start(row, stop), stop) is not None
    whole = time.perf_counter() - began

    rng, raised, waits = random.Random(0), [0.0], []

    def raise_flag() -> None:
        raised[0] = time.perf_counter()
        stop.set()

    began = time.perf_counter()
    progress = runner.start(row, stop)
    while True:
        stop.clear()
        timer = threading.Timer(rng.uniform(0.002, args.max_gap_ms / 1000), raise_flag)
        timer.start()
        result = runner.advance(progress, stop)
        returned = time.perf_counter()
        timer.cancel()
        timer.join()
        if result is not None:
            break
        waits.append((returned - raised[0]) * 1000)
    interrupted = time.perf_counter() - began
    waits.sort()
    rows = [[args.tokens, args.check_every_macs / 1e6, whole * 1000, interrupted * 1000, len(waits),
             statistics.median(waits) if waits else None, waits[int(0.9 * len(waits))] if waits else None,
             waits[-1] if waits else None]]
    print(f"{path}, {torch.get_num_threads()} threads")
    print(report.table(["tokens", "check every M MACs", "whole ms", "interrupted ms", "stops", "wait P50 ms",
                        "P90 ms", "max ms"], rows))
    written = report.write_json(args.json or report.default_json_path("stop_latency"),
                                {"tool": "bench.kernels.stop_latency", "model": path,
                                 "tokens": args.tokens, "check_every_macs": args.check_every_macs,
                                 "whole_s": whole, "interrupted_s": interrupted, "waits_ms": waits})
    print(f"results: {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
