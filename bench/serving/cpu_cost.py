"""`python -m bench.serving.cpu_cost`: the server's CPU cost per request (the paper's goal G4).

Launches Prelude with `--executor null` (the real HTTP, admission, scheduling, output and
sampling code around a model that does no work), drives it closed-loop, and reads the server
process's own CPU time from /proc before and after each measured run. Two request classes:
OneShot (max_tokens=1, unstreamed) and Decode (max_tokens=16, streamed), each at c=1 and c=64.
With --ablation the same runs repeat against a `--disable-oneshot` server.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import sys
from pathlib import Path
from typing import Sequence

from bench.serving.core import proc, report
from bench.serving.core.client import make_client
from bench.serving.core.loadgen import int_list, launch_plan, prompt_source, split_server_args, started
from bench.serving.core.prompts import TokenizerError
from bench.serving.core.runner import Level, Limits, RunResult, run_level
from bench.serving.core.server import ServerError, ServerProcess
from bench.serving.core.workloads import Fixed, Options


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.serving.cpu_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Flags after a lone -- go to the server.")
    p.add_argument("--model", help="model directory for the server (default: the demo model)")
    p.add_argument("--server-cmd", help="command launching the server (default: this python -m prelude)")
    p.add_argument("--tokenizer", help="local tokenizer.json instead of the server's /tokenize")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens of every request")
    p.add_argument("--decode-tokens", type=int, default=16, help="output tokens of Decode requests")
    p.add_argument("--concurrency", type=int_list, default=[1, 64])
    p.add_argument("--num-requests", type=int, default=600, help="per run")
    p.add_argument("--duration", type=float, default=20.0, help="per run, seconds")
    p.add_argument("--warmup", type=int, default=32)
    p.add_argument("--ablation", action="store_true", help="also measure a --disable-oneshot server")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-dir", type=Path, default=report.RESULTS_DIR / "logs")
    p.add_argument("--json", type=Path, help="results file (default bench-results/cpu_cost-<time>.json)")
    p.add_argument("--no-progress", action="store_true")
    return p


async def measure(server: ServerProcess, args: argparse.Namespace) -> list[RunResult]:
    async with make_client(server.base_url, 4, 60.0) as client:
        model, _, factory = await prompt_source(client, args.tokenizer)
    options = Options(model)
    classes = [("OneShot", Fixed(factory, options, args.input_len, 1)),
               ("Decode", Fixed(factory, options, args.input_len, args.decode_tokens))]
    rng = random.Random(args.seed)
    results = []
    for name, workload in classes:
        for c in args.concurrency:
            limits = Limits(args.num_requests, args.duration, args.warmup)
            result = await run_level(server.base_url, workload, Level("concurrency", c), limits, rng,
                                     server.label, server.pid, show_progress=not args.no_progress)
            result.workload = f"{name} ({workload.label})"
            results.append(result)
    return results


def cost_table(results: Sequence[RunResult]) -> str:
    rows = []
    for r in results:
        s = r.summary
        cores = r.server_cpu_s / s.duration_s if r.server_cpu_s is not None and s.duration_s else None
        rows.append([r.server, r.workload, r.level.label, s.completed, s.errors, s.request_rate,
                     r.server_cpu_us_per_request, cores,
                     None if r.client_cpu_share is None else r.client_cpu_share * 100,
                     None if s.e2e.p50 is None else s.e2e.p50 * 1000])
    return report.table(["server", "class", "load", "ok", "err", "max req/s", "srv CPU us/req", "srv cores",
                         "client CPU%", "E2E p50 ms"], rows)


def main(argv: Sequence[str] | None = None) -> int:
    own, server_args = split_server_args(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(own)
    if not proc.available():
        raise SystemExit("cpu_cost reads /proc/<pid>/stat; this system has no /proc")
    base = ["--executor", "null", *(["--model", args.model] if args.model else []), *server_args]
    runs = [("prelude", base)] + ([("ablation", [*base, "--disable-oneshot"])] if args.ablation else [])
    results: list[RunResult] = []
    servers = []
    for server in launch_plan(runs, args.server_cmd, args.log_dir, log_tag="cpu-"):
        try:
            with started(server):
                results += asyncio.run(measure(server, args))
        except (ServerError, TokenizerError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        servers.append({"label": server.label, "argv": server.argv, "log": str(server.log_path)})
    print("\nServer CPU per request (null executor; the server process's CPU clock)")
    print(cost_table(results))
    if args.ablation:
        print("\nprelude / ablation")
        print(report.ratio_table(results, "prelude", "ablation"))
    path = report.write_json(args.json or report.default_json_path("cpu_cost"), {
        "tool": "bench.serving.cpu_cost", "argv": list(sys.argv if argv is None else argv),
        "servers": servers, "results": [report.result_json(r) for r in results]})
    print(f"\nresults: {path}")
    return 0 if all(r.summary.completed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
