"""`python -m bench.serving.host_noise`: how steady this machine is, apart from any server.

Times a fixed piece of compute (a float32 GEMM on every core, about one c=1 step of the demo
model, or repeated to last `--step-ms`) a few hundred times with short idle gaps, the way a c=1
client spaces its requests, and prints its P50, P99 and P99/P50. A server's one-token c=1 P99/P50
cannot be steadier than this: on a shared VM the host's own phases (other tenants, frequency)
move every core's speed by 20-30% for a second or two at a time. The side-by-side bench runs it
in its own process after each server's c=1 run, each step as long as that run's median
request and as many of them, so the table shows the floor the P99/P50 target is read against."""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Sequence

from bench.serving.core.stats import percentile

ROWS, HIDDEN, OUT = 128, 1024, 3072  # ~0.8 GFLOP: 5-10 ms on 2 AVX2 cores


@dataclass(frozen=True, slots=True)
class HostNoise:
    iterations: int
    p50_ms: float
    p99_ms: float

    @property
    def p99_over_p50(self) -> float:
        return self.p99_ms / self.p50_ms


def measure(iterations: int = 300, gap_s: float = 0.002, step_ms: float | None = None) -> HostNoise:
    """step_ms: repeat the GEMM to about this long a step (a longer step spans more of the host's
    phases than one GEMM does); None: one GEMM a step."""
    import torch

    a, w = torch.randn(ROWS, HIDDEN), torch.randn(HIDDEN, OUT)
    warm = []
    for _ in range(10):  # warm: threads spun up, pages touched
        began = time.perf_counter()
        a @ w
        warm.append(time.perf_counter() - began)
    one_ms = 1000 * statistics.median(warm)
    repeats = 1 if step_ms is None else max(1, round(step_ms / one_ms))
    times = []
    for _ in range(iterations):
        began = time.perf_counter()
        for _ in range(repeats):
            a @ w
        times.append(time.perf_counter() - began)
        time.sleep(gap_s)
    p50, p99 = percentile(times, 50), percentile(times, 99)  # the serving runs' own percentiles
    assert p50 is not None and p99 is not None
    return HostNoise(iterations, p50 * 1000, p99 * 1000)


def measure_in_subprocess(iterations: int = 300, step_ms: float | None = None) -> HostNoise | None:
    """measure() in a fresh interpreter, so the caller never imports torch; None if it failed."""
    step = [] if step_ms is None else ["--step-ms", f"{step_ms:.3f}"]
    timeout_s = 60.0 + 3 * iterations * ((step_ms or 10.0) + 2.0) / 1000
    try:
        done = subprocess.run([sys.executable, "-m", "bench.serving.host_noise", "--iterations", str(iterations),
                               *step, "--json"], capture_output=True, text=True, timeout=timeout_s, check=True)
        fields = json.loads(done.stdout.strip().splitlines()[-1])
        return HostNoise(fields["iterations"], fields["p50_ms"], fields["p99_ms"])
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, IndexError) as exc:
        print(f"host noise probe failed: {exc}", file=sys.stderr)
        return None


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serving.host_noise", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iterations", type=int, default=300)
    p.add_argument("--step-ms", type=float, help="repeat the GEMM to about this long a step (default: one GEMM)")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of a sentence")
    args = p.parse_args(argv)
    noise = measure(args.iterations, step_ms=args.step_ms)
    if args.json:
        print(json.dumps({**asdict(noise), "p99_over_p50": noise.p99_over_p50}))
    else:
        print(f"fixed compute loop, {noise.iterations} runs: P50 {noise.p50_ms:.2f} ms, "
              f"P99 {noise.p99_ms:.2f} ms, P99/P50 {noise.p99_over_p50:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
