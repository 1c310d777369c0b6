"""`python -m bench.serving.http_servers`: what each HTTP server costs per request, with no app
to speak of.

Serves the bare ASGI app of `bench.serving.bare_app` (reads a JSON body with orjson, answers a
completion-shaped JSON) with each server in turn, in its own process, drives it closed-loop with
the benchmark client (one keep-alive connection per request in flight; a OneShot 128/1-shaped
body of 128 token ids), and reads the server process's CPU from /proc before and after each run.
The server CPU per request is the floor under Prelude's own (`bench.serving.cpu_cost`): the
default `--http-server` is chosen by it. `--rounds N` alternates the servers N times and reports
each server's best round."""
from __future__ import annotations

import argparse
import asyncio
import random
import sys
from pathlib import Path
from typing import Sequence

from bench.charts import save_figure, write_chart
from bench.serving.core import proc, report
from bench.serving.bare_app import SERVERS
from bench.serving.core.loadgen import int_list
from bench.serving.core.runner import Level, Limits, RunResult, run_level
from bench.serving.core.server import ServerError, ServerProcess, prelude_env
from bench.serving.core.workloads import COMPLETIONS, Job, Workload, encode


class BareCompletion(Workload):
    """The same non-streamed 128-token, 1-token-answer completion body every time: the bare app
    reads every byte but does nothing with the ids, so they need no tokenizer."""

    def __init__(self, input_len: int):
        self.input_len = input_len
        self.output_len = 1
        self.body = encode({"prompt": list(range(1000, 1000 + input_len)), "max_tokens": 1, "temperature": 0.0,
                            "ignore_eos": True})

    @property
    def label(self) -> str:
        return f"bare {self.input_len}/1"

    def jobs(self, count: int, rng: random.Random) -> list[Job]:
        return [Job(COMPLETIONS, self.body, False, self.input_len, 1)] * count


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.serving.http_servers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", type=lambda s: s.split(","), default=list(SERVERS),
                   help=f"comma-separated, from {','.join(SERVERS)} (default: all)")
    p.add_argument("--concurrency", type=int_list, default=[64, 1])
    p.add_argument("--num-requests", type=int, default=3000, help="per run")
    p.add_argument("--duration", type=float, default=15.0, help="per run, seconds")
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--input-len", type=int, default=128, help="token ids in each request's prompt")
    p.add_argument("--rounds", type=int, default=1, help="alternate the servers this many times; best round kept")
    p.add_argument("--log-dir", type=Path, default=report.RESULTS_DIR / "logs")
    p.add_argument("--json", type=Path, help="results file (default bench-results/http_servers-<time>.json); "
                                             "the chart goes beside it (.png)")
    p.add_argument("--no-progress", action="store_true")
    return p


async def measure(server: ServerProcess, args: argparse.Namespace) -> list[RunResult]:
    workload = BareCompletion(args.input_len)
    results = []
    for c in args.concurrency:
        results.append(await run_level(server.base_url, workload, Level("concurrency", c),
                                       Limits(args.num_requests, args.duration, args.warmup), random.Random(0),
                                       server.label, server.pid, show_progress=not args.no_progress))
    return results


def best_rounds(results: Sequence[RunResult]) -> list[RunResult]:
    """Each (server, load)'s round with the least server CPU per request: other work on a shared
    machine only ever adds to it."""
    best: dict[tuple[str, Level], RunResult] = {}
    for r in results:
        key = (r.server, r.level)
        cost = r.server_cpu_us_per_request
        if key not in best or (cost is not None and cost < (best[key].server_cpu_us_per_request or float("inf"))):
            best[key] = r
    return list(best.values())


def cost_table(results: Sequence[RunResult]) -> str:
    rows = [[r.server, r.level.label, r.summary.completed, r.summary.errors, r.server_cpu_us_per_request,
             r.summary.request_rate, None if r.client_cpu_share is None else r.client_cpu_share * 100,
             None if r.summary.e2e.p50 is None else r.summary.e2e.p50 * 1000] for r in results]
    return report.table(["server", "load", "ok", "err", "srv CPU us/req", "req/s", "client CPU%", "E2E p50 ms"], rows)


def plot(results: Sequence[RunResult], path: Path) -> None:
    """Server CPU per request, one bar group per server, one bar per load level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    servers = list(dict.fromkeys(r.server for r in results))
    levels = list(dict.fromkeys(r.level for r in results))
    width = 0.8 / max(1, len(levels))
    fig, ax = plt.subplots(figsize=(1.6 * len(servers) + 2, 4))
    for i, level in enumerate(levels):
        cost = {r.server: r.server_cpu_us_per_request or 0.0 for r in results if r.level == level}
        xs = [k + i * width for k in range(len(servers))]
        bars = ax.bar(xs, [cost.get(s, 0.0) for s in servers], width, label=level.label)
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks([k + width * (len(levels) - 1) / 2 for k in range(len(servers))], servers, fontsize=8)
    ax.set_ylabel("server CPU per request (us)")
    ax.set_title("bare ASGI app, closed loop")
    ax.legend(fontsize=8)
    save_figure(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    unknown = [s for s in args.servers if s not in SERVERS]
    if unknown:
        raise SystemExit(f"unknown server(s) {', '.join(unknown)}; choose from {', '.join(SERVERS)}")
    if not proc.available():
        raise SystemExit("http_servers reads /proc/<pid>/stat; this system has no /proc")
    results: list[RunResult] = []
    for _ in range(args.rounds):
        for name in args.servers:
            server = ServerProcess(["--server", name], [sys.executable, "-m", "bench.serving.bare_app"],
                                   prelude_env(), args.log_dir / f"http_servers-{name}.log", name)
            try:
                with server:
                    results += asyncio.run(measure(server, args))
            except ServerError as exc:
                print(f"skipping {name}: {exc}", file=sys.stderr)
    best = best_rounds(results)
    print(f"\nServer CPU per request, bare ASGI app ({args.input_len}-id body; best of {args.rounds} "
          "round(s); the server process's CPU clock)")
    print(cost_table(best))
    path = report.write_json(args.json or report.default_json_path("http_servers"), {
        "tool": "bench.serving.http_servers", "argv": list(sys.argv if argv is None else argv),
        "best": [report.result_json(r) for r in best], "rounds": [report.result_json(r) for r in results]})
    print(f"\nresults: {path}")
    write_chart(lambda png: plot(best, png), path.with_suffix(".png"))
    return 0 if best and all(r.summary.completed for r in best) else 1


if __name__ == "__main__":
    sys.exit(main())
