"""`python -m bench.kernels.decode_context`: decode speed against context length. For each prompt
length (default 128, 2K and 8K tokens), `--concurrency` streamed requests at a time generate
`--output-len` tokens each (ignore_eos); TPOT is the median gap between a request's tokens after
its first. Run it against a build and against another build with `--server-cmd` to compare
decode attention paths (issue #20: the CPU path that reads KV blocks in place).
"""
from __future__ import annotations

import argparse
import asyncio
import random
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

import httpx

from bench.serving.core import report
from bench.serving.core.server import ServerProcess, prelude_env


async def tpot_ms(url: str, prompt_len: int, output_len: int, concurrency: int, requests: int,
                  rng: random.Random) -> float:
    """Median per-token gap of all requests, in ms."""
    gaps: list[float] = []

    async def one(client: httpx.AsyncClient) -> None:
        body = {"prompt": [rng.randrange(3, 30000) for _ in range(prompt_len)], "max_tokens": output_len,
                "ignore_eos": True, "stream": True}
        stamps = []
        async with client.stream("POST", "/v1/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    stamps.append(time.perf_counter())
        gaps.extend(b - a for a, b in zip(stamps[1:], stamps[2:]))

    async def worker(client: httpx.AsyncClient, count: int) -> None:
        for _ in range(count):
            await one(client)

    async with httpx.AsyncClient(base_url=url, timeout=3600) as client:
        await asyncio.gather(*(worker(client, requests // concurrency) for _ in range(concurrency)))
    return 1000 * statistics.median(gaps)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.kernels.decode_context", description=__doc__)
    p.add_argument("--contexts", default="128,2048,8192")
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--requests", type=int, default=8, help="per context length")
    p.add_argument("--server-cmd", default=None, help="launch this instead of this checkout's `python -m prelude`")
    p.add_argument("--json", type=Path, default=report.RESULTS_DIR / "decode_context.json")
    p.add_argument("server_args", nargs=argparse.REMAINDER, help="after --: flags for the server")
    args = p.parse_args(argv)
    contexts = [int(c) for c in args.contexts.split(",")]
    extra = [a for a in args.server_args if a != "--"]
    command = shlex.split(args.server_cmd) if args.server_cmd else None
    longest = max(contexts) + args.output_len + 16
    server_args = ["--max-model-len", str(longest), "--disable-log-requests", *extra]
    rows, results = [], []
    with ServerProcess(server_args, command=command, env=prelude_env()) as server:
        asyncio.run(tpot_ms(server.base_url, 16, 4, 1, 1, random.Random(0)))  # warm up
        for n in contexts:
            tpot = asyncio.run(tpot_ms(server.base_url, n, args.output_len, args.concurrency, args.requests,
                                       random.Random(n)))
            rows.append([n, tpot])
            results.append({"context": n, "tpot_ms": tpot})
            print(f"  context {n}: TPOT {tpot:.1f} ms", flush=True)
    print(report.table(["context tokens", "TPOT median ms"], rows))
    path = report.write_json(args.json, {"tool": "bench.kernels.decode_context", "concurrency": args.concurrency,
                                         "output_len": args.output_len, "server_args": server_args,
                                         "results": results})
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
