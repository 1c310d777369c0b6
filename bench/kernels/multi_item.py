"""`python -m bench.kernels.multi_item`: /v1/score with one query and N short items, the items
in one masked forward (multi-item) against one row per item (sharing the query through the
prefix cache), N = 1, 10, 50, 200. Items per second of each, and the ratio, on the demo model or
a random-weight Qwen3-0.6B-shaped checkpoint (--size 0.6B). Every request has a fresh query, so
neither mode reuses a cached query across requests."""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import httpx

from bench.serving.core import report
from bench.serving.checkpoint import write_checkpoint
from bench.serving.core.server import ServerProcess, prelude_env


def measure(url: str, n_items: int, multi: bool, query_len: int, item_len: int, repeats: int,
            rng: random.Random) -> float:
    """Median seconds of one scoring request."""
    times = []
    with httpx.Client(base_url=url, timeout=3600) as client:
        for _ in range(repeats):
            body = {"query": [rng.randrange(3, 500) for _ in range(query_len)],
                    "items": [[rng.randrange(3, 500) for _ in range(item_len)] for _ in range(n_items)],
                    "label_token_ids": [5, 9], "apply_softmax": True, "multi_item": multi}
            began = time.perf_counter()
            response = client.post("/v1/score", json=body)
            times.append(time.perf_counter() - began)
            response.raise_for_status()
    return statistics.median(times)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.kernels.multi_item", description=__doc__)
    p.add_argument("--size", default="demo", help="demo | 0.6B (random weights, Qwen3-0.6B's config)")
    p.add_argument("--items", default="1,10,50,200")
    p.add_argument("--query-len", type=int, default=300)
    p.add_argument("--item-len", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, default=report.RESULTS_DIR / "multi_item.json")
    args = p.parse_args(argv)
    model: list[str] = []
    if args.size != "demo":
        model = ["--model", str(write_checkpoint(Path(tempfile.mkdtemp()) / args.size, args.size, None))]
    rows, results = [], []
    with ServerProcess([*model, "--max-model-len", "8192"], env=prelude_env()) as server:
        measure(server.base_url, 4, True, args.query_len, args.item_len, 1, random.Random(99))  # warm up
        for n in map(int, args.items.split(",")):
            rng = random.Random(n)
            multi = measure(server.base_url, n, True, args.query_len, args.item_len, args.repeats, rng)
            single = measure(server.base_url, n, False, args.query_len, args.item_len, args.repeats, rng)
            rows.append([n, 1000 * multi, n / multi, 1000 * single, n / single, single / multi])
            results.append({"items": n, "multi_s": multi, "per_item_s": single})
            print(f"  {n} items done", flush=True)
    print(f"\n{args.size}: query {args.query_len} tokens, items {args.item_len} tokens, median of {args.repeats}")
    print(report.table(["items", "multi ms", "multi items/s", "per-item ms", "per-item items/s", "speedup"], rows))
    path = report.write_json(args.json, {"tool": "bench.kernels.multi_item", "size": args.size,
                                         "query_len": args.query_len, "item_len": args.item_len, "results": results})
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
