"""`python -m bench.serving.startup`: time from process start to GET /health answering 200.

cold: a fresh, empty PRELUDE_CACHE for every start, so the demo model is built each time.
warm: one cache directory, built by an untimed first start, then reused.
Reports the median (and min, max) of --repeats starts per mode. Flags after a lone -- go to
the server (e.g. `-- --executor null`); with --model DIR, cold differs from warm only in
what the OS page cache holds.
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from bench import progress
from bench.serving.core import report
from bench.serving.core.loadgen import split_server_args
from bench.serving.core.server import ServerError, ServerProcess, parse_command, prelude_env

# Prelude logs its own share of the startup: model resolution, weights, tokenizer, KV cache.
ENGINE_READY = re.compile(r"engine ready in ([0-9.]+)s")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.serving.startup", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5, help="timed starts per mode")
    p.add_argument("--modes", default="cold,warm", help="comma list of: cold, warm")
    p.add_argument("--server-cmd", help="command launching the server (default: this python -m prelude)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for /health")
    p.add_argument("--log-dir", type=Path, help="servers' logs (default bench-results/logs/<time>-startup)")
    p.add_argument("--json", type=Path, help="results file (default bench-results/startup-<time>.json)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def engine_seconds(log: Path) -> float | None:
    try:
        match = ENGINE_READY.search(log.read_text(errors="replace"))
    except OSError:
        return None
    return float(match.group(1)) if match else None


def timed_start(args: argparse.Namespace, server_args: list[str], cache: Path, log_dir: Path, name: str) -> dict:
    server = ServerProcess(server_args, parse_command(args.server_cmd), prelude_env(cache),
                           log_dir / f"{name}.log", name)
    try:
        seconds = server.start(args.timeout)
    finally:
        server.stop()
    return {"seconds": seconds, "engine_seconds": engine_seconds(server.log_path), "log": str(server.log_path)}


def run_mode(mode: str, args: argparse.Namespace, server_args: list[str], work: Path, log_dir: Path) -> list[dict]:
    samples = []
    warm_cache = work / "warm-cache"
    if mode == "warm":
        timed_start(args, server_args, warm_cache, log_dir, "warm-prime")  # builds the cache; untimed
    starts = progress.bar(args.repeats, f"{mode} starts", not args.no_progress, unit="start")
    for i in range(args.repeats):
        cache = work / f"cold-cache-{i}" if mode == "cold" else warm_cache
        sample = timed_start(args, server_args, cache, log_dir, f"{mode}-{i}")
        starts.set_postfix_str(f"last {sample['seconds']:.2f}s", refresh=False)
        starts.update(1)
        samples.append(sample)
    starts.close()
    return samples


def summary_row(mode: str, samples: list[dict]) -> list:
    seconds = [s["seconds"] for s in samples]
    engine = [s["engine_seconds"] for s in samples if s["engine_seconds"] is not None]
    return [mode, len(seconds), statistics.median(seconds), min(seconds), max(seconds),
            statistics.median(engine) if engine else None]


def main(argv: Sequence[str] | None = None) -> int:
    own, server_args = split_server_args(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(own)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not set(modes) <= {"cold", "warm"} or args.repeats < 1:
        raise SystemExit("--modes takes cold and/or warm; --repeats must be >= 1")
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="prelude-startup-") as tmp:
        work = Path(tmp)
        log_dir = args.log_dir or report.RESULTS_DIR / "logs" / f"{time.strftime('%Y%m%d-%H%M%S')}-startup"
        for mode in modes:
            try:
                results[mode] = run_mode(mode, args, server_args, work, log_dir)
            except ServerError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
        rows = [summary_row(mode, samples) for mode, samples in results.items()]
    flags = " ".join(server_args) or "(none)"
    print(f"\nStartup to GET /health 200 (seconds), server flags: {flags}")
    print(report.table(["mode", "n", "median", "min", "max", "engine build (log)"], rows))
    path = report.write_json(args.json or report.default_json_path("startup"), {
        "tool": "bench.serving.startup", "argv": list(sys.argv if argv is None else argv),
        "server_args": server_args,
        "summary": {row[0]: dict(zip(["n", "median_s", "min_s", "max_s", "engine_median_s"], row[1:]))
                    for row in rows},
        "samples": results})
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
