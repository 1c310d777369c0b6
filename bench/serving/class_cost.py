"""`python -m bench.serving.class_cost`: what a request costs in each execution class, without
HTTP: where the OneShot class saves work on this machine, and where it cannot.

Two engines in one process, built as the server builds them (`prelude.app.assembly.build`), one
default and one `--disable-oneshot` (every request takes the decode lifecycle), on the same model;
the same requests alternate between them one at a time, so a drift of the host's speed falls on
both alike. Per workload and class: the request's time from submission to its result, split into
the step's executor call (the forward and the output heads) and the rest (admission, scheduling,
the hand-off to the step thread, folding the result back), and the ratio of the two classes."""
from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from bench.serving.core import report
from prelude.app.assembly import build
from prelude.contract.batch import BatchResult, ForwardBatch
from prelude.contract.config import Config
from prelude.contract.sampling import SamplingParams
from prelude.engine.engine import Engine
from prelude.engine.request import Request, Task
from prelude.executor.executors import Executors

MakeRequest = Callable[[str, random.Random], Request]


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    make: MakeRequest


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(5, 500) for _ in range(n)]


RUBRIC = _ids(random.Random(7), 2048)
QUERY = _ids(random.Random(8), 256)
ONE_TOKEN = SamplingParams(max_tokens=1, temperature=0.0)
WORKLOADS = [
    Workload("one-token 128/1", lambda rid, rng: Request(rid, _ids(rng, 128), ONE_TOKEN)),
    Workload("one-token 512/1", lambda rid, rng: Request(rid, _ids(rng, 512), ONE_TOKEN)),
    Workload("embedding 512", lambda rid, rng: Request(rid, _ids(rng, 512), task=Task.EMBED)),
    Workload("prompt_logprobs 512", lambda rid, rng: Request(rid, _ids(rng, 512), ONE_TOKEN, prompt_logprobs=1)),
    Workload("judge 2048 + 32", lambda rid, rng: Request(rid, RUBRIC + _ids(rng, 32), ONE_TOKEN)),
    Workload("score 256 + 8 x 32 (one row per item)",
             lambda rid, rng: Request(rid, QUERY + _ids(rng, 32), task=Task.SCORE, label_token_ids=(311, 324))),
]


class TimedExecutors:
    """The engine's executors, with the time spent in each step's executor call added up."""

    def __init__(self, inner: Executors):
        self.inner = inner
        self.oneshot = inner.oneshot
        self.seconds = 0.0

    def execute(self, batch: ForwardBatch, on_launch: Callable[[], None] | None = None) -> BatchResult:
        began = time.perf_counter()
        try:
            return self.inner.execute(batch, on_launch)
        finally:
            self.seconds += time.perf_counter() - began


async def measure(engines: dict[str, Engine], workload: Workload, requests: int, warmup: int,
                  seed: int) -> dict[str, dict]:
    timers = {name: TimedExecutors(engine.executors) for name, engine in engines.items()}
    for name, engine in engines.items():
        engine.executors = timers[name]  # type: ignore[assignment]
    totals = {name: [] for name in engines}
    steps = {name: [] for name in engines}
    rng = random.Random(seed)  # prompts of their own: no workload hits another's cached prefixes
    for i in range(warmup + requests):
        base = workload.make(f"r{i}", rng)
        order = list(engines.items()) if i % 2 else list(reversed(engines.items()))
        for name, engine in order:
            before = timers[name].seconds
            began = time.perf_counter()
            async for _ in engine.submit(replace(base, arrival_time=time.monotonic())):
                pass
            if i >= warmup:
                totals[name].append(time.perf_counter() - began)
                steps[name].append(timers[name].seconds - before)
    for name, engine in engines.items():
        engine.executors = timers[name].inner
    return {name: {"total_ms": 1000 * statistics.mean(totals[name]), "step_ms": 1000 * statistics.mean(steps[name]),
                   "p50_ms": 1000 * statistics.median(totals[name])} for name in engines}


async def run(args: argparse.Namespace) -> list[dict]:
    config = Config(model=args.model)
    engines = {"oneshot": build(config).engine, "ablation": build(replace(config, disable_oneshot=True)).engine}
    for engine in engines.values():
        await engine.start()
        await engine.wait_ready()
    rows = []
    try:
        for seed, workload in enumerate(WORKLOADS):
            figures = await measure(engines, workload, args.requests, args.warmup, seed)
            rows.append({"workload": workload.name,
                         **{f"{k}_{m}": v for k, f in figures.items() for m, v in f.items()}})
    finally:
        for engine in engines.values():
            await engine.stop()
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serving.class_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model directory (default: the demo model)")
    p.add_argument("--requests", type=int, default=200, help="per workload and class")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--json", type=Path, help="results file (default bench-results/class_cost-<time>.json)")
    args = p.parse_args(argv)
    rows = asyncio.run(run(args))
    table = [[r["workload"], r["oneshot_total_ms"], r["oneshot_step_ms"], r["oneshot_total_ms"] - r["oneshot_step_ms"],
              r["ablation_total_ms"], r["ablation_step_ms"], r["ablation_total_ms"] - r["ablation_step_ms"],
              r["ablation_total_ms"] / r["oneshot_total_ms"]] for r in rows]
    print("Per request, one at a time, alternating between the classes (means, ms)")
    print(report.table(["workload", "OneShot", "its step", "the rest", "decode lifecycle", "its step", "the rest",
                        "decode / OneShot"], table))
    path = report.write_json(args.json or report.default_json_path("class_cost"),
                             {"tool": "bench.serving.class_cost", "argv": list(sys.argv if argv is None else argv),
                              "rows": rows})
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
