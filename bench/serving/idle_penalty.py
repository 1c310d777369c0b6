"""`python -m bench.serving.idle_penalty`: how much more CPU the server's own code takes when its
thread slept just before, as the server's threads do between a c=1 client's requests.

`bench.serving.cpu_cost` counts about 1.3x the instructions per request at c=1 that it counts at
c=64 (`bench.serving.instructions`), yet reads about 3x the CPU seconds. This separates the code
from the machine: it runs, in this process, the step thread's share of one c=1 request (the null
executor's one-token OneShot step over a 128-token prompt: flattening, the runner, the heads,
greedy sampling over the vocabulary) and times each call in the calling thread's own CPU time,
in three ways, alternating:

- back to back;
- after the thread slept `--gap-ms` (a c=1 round trip's idle time);
- after a busy wait as long, which keeps the core awake and runs almost nothing else on it.

On a machine whose caches keep their contents while a core idles, the three agree within a few
percent. On a VM whose idle virtual CPU the host gives to other work, the step runs from cold
caches after a sleep: `after sleep / back to back` is the factor by which the machine inflates a
c=1 CPU figure over what the same instructions cost warm. No server and no HTTP: the factor
belongs to the host, and the same code is timed in every row."""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from bench.charts import save_figure, write_chart
from bench.serving.core import report

CASES = ("back to back", "after sleep", "after busy wait")


def null_step() -> tuple[Callable[[], object], Callable[[], None]]:
    """One call of the null executor's 1 x 128 greedy OneShot step, on a warm engine, and what
    ends that engine's worker thread."""
    from prelude.app.assembly import build
    from prelude.app.cli import parse_args
    from prelude.contract.batch import OneShotBatch, OutputSpec, PrefillRow
    from prelude.contract.sampling import SamplingParams

    engine = build(parse_args(["--executor", "null"])).engine
    executors = engine.executors
    spec = OutputSpec(sample=SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    batch = OneShotBatch([PrefillRow(seq_id=0, token_ids=list(range(1000, 1128)), start=0, block_table=(),
                                     output=spec)])
    for _ in range(300):
        executors.execute(batch)
    return lambda: executors.execute(batch), engine.steps.shutdown


def busy_wait(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def timed(step: Callable[[], object], case: str, iterations: int, gap_s: float) -> list[float]:
    """Thread CPU microseconds of each call of `step` after the case's gap."""
    out = []
    for _ in range(iterations):
        if case == "after sleep":
            time.sleep(gap_s)
        elif case == "after busy wait":
            busy_wait(gap_s)
        began = time.thread_time_ns()
        step()
        out.append((time.thread_time_ns() - began) / 1000)
    return out


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar([r["case"] for r in rows], [r["median_us"] for r in rows], color=["#4c72b0", "#dd8452", "#55a868"])
    for i, r in enumerate(rows):
        ax.text(i, r["median_us"], f"{r['median_us']:.0f} us ({r['ratio']:.2f}x)", ha="center", va="bottom")
    ax.set_ylabel("thread CPU per step, median (us)")
    ax.set_title("the same step's CPU after idle, busy and no gap")
    save_figure(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serving.idle_penalty", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iterations", type=int, default=1500, help="timed steps per case and round")
    p.add_argument("--rounds", type=int, default=2, help="the three cases alternate this many times")
    p.add_argument("--gap-ms", type=float, default=0.7, help="sleep or busy wait before each step")
    p.add_argument("--json", type=Path, help="results file (default bench-results/idle_penalty-<time>.json); "
                                             "the chart goes beside it (.png)")
    args = p.parse_args(argv)
    step, close = null_step()
    samples: dict[str, list[float]] = {case: [] for case in CASES}
    try:
        for _ in range(args.rounds):
            for case in CASES:
                samples[case] += timed(step, case, args.iterations, args.gap_ms / 1000)
    finally:
        close()
    warm = statistics.median(samples[CASES[0]])
    rows = [{"case": case, "steps": len(v), "median_us": statistics.median(v), "mean_us": statistics.fmean(v),
             "ratio": statistics.median(v) / warm} for case, v in samples.items()]
    print(f"\nThe null executor's 1 x 128 OneShot step, thread CPU per call ({args.gap_ms:g} ms gaps)")
    print(report.table(["case", "steps", "median us", "mean us", "median / back to back"],
                       [[r["case"], r["steps"], r["median_us"], r["mean_us"], f"{r['ratio']:.2f}x"] for r in rows]))
    path = report.write_json(args.json or report.default_json_path("idle_penalty"), {
        "tool": "bench.serving.idle_penalty", "argv": list(sys.argv if argv is None else argv), "rows": rows})
    print(f"\nresults: {path}")
    write_chart(lambda png: plot(rows, png), path.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
