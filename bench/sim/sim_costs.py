"""`python -m bench.sim.sim_costs`: measures the two costs bench.sim.simulate adds to its
engine step-time curve, on the machine and setup of bench.serving.shared_prefix (two demo-model
replicas with one torch thread each, 692 KV blocks, the real sglang-router, streamed requests).

Every request is the bench's shape: one ~2K-token system prompt already cached on the replica plus
a fresh short question, 4 tokens out. Each replica's access log gives the engine's own view (its
`ttft` and `total`, from the request reaching the server to the first token / the last one).

1. Outside the engine (client + router + HTTP): one client, one request at a time, through the
   router with each policy. `ttft` = client TTFT - replica ttft: what a request's first token
   costs beyond the engine; `cycle` = client's time per request - replica total: how much later
   a closed-loop client's next request reaches a replica than the engine finished the last one.
2. The engine alone (to recalibrate the step curve): replica ttft of a fresh ~2K-token prompt
   (median of 3), and ttft/total of the cached request above with the other replica idle.
3. Sharing the host's cores: the replica's total for the same request with the other replica
   idle (one client, direct) vs busy (one client per replica at once, direct). Their ratio is
   how much longer an engine step takes while the other replica also runs one.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import httpx

from bench.serving.core.server import ServerProcess, prelude_env
from bench.serving.shared_prefix import Router, system_prompts

ACCESS = re.compile(r"POST /v1/completions 200 .* ttft=([\d.]+)ms total=([\d.]+)ms")


def engine_times(log: Path, skip: int) -> list[tuple[float, float]]:
    """(ttft, total) seconds of the completions in a replica's access log after the first `skip`."""
    rows = [m for m in (ACCESS.search(line) for line in log.read_text().splitlines()) if m]
    return [(float(m[1]) / 1000, float(m[2]) / 1000) for m in rows[skip:]]


async def loop(url: str, model: str, prompt: str, n: int, tag: str) -> list[tuple[float, float]]:
    """One closed-loop client: n streamed requests, each the prompt + a new question; (TTFT, total)."""
    out = []
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        for i in range(n):
            body = {"model": model, "prompt": f"{prompt}\nQuestion {tag}{i}: is {i} approved?", "max_tokens": 4,
                    "temperature": 0, "stream": True}
            sent = time.perf_counter()
            first = None
            async with http.stream("POST", "/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if first is None and line.startswith("data:") and line.strip() != "data: [DONE]":
                        first = time.perf_counter() - sent
            out.append((first, time.perf_counter() - sent))
    return out


def median(xs) -> float:
    return statistics.median(xs)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sim.sim_costs", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=30, help="requests per measurement")
    p.add_argument("--kv-blocks", type=int, default=692)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    env = prelude_env()
    env.setdefault("OMP_NUM_THREADS", "1")
    logs = Path(tempfile.mkdtemp(prefix="sim-costs-"))
    replica_args = ["--num-kv-blocks", str(args.kv_blocks), "--max-model-len", "3072"]
    n = args.requests
    result: dict = {}
    with ServerProcess(replica_args, env=env, label="a", log_path=logs / "a.log") as a, \
            ServerProcess(replica_args, env=env, label="b", log_path=logs / "b.log") as b:
        model = httpx.get(a.base_url + "/v1/models").json()["data"][0]["id"]
        prompt = system_prompts(1, 2048, lambda t: httpx.post(a.base_url + "/tokenize", json={"prompt": t},
                                                                 timeout=30).json()["count"], 0)[0]

        def run(jobs: dict) -> dict:
            """jobs: replica name -> client URL; returns per replica (client, engine) time pairs."""
            before = {k: len(engine_times(logs / f"{k}.log", 0)) for k in "ab"}
            clients = asyncio.run(_gather({k: loop(u, model, prompt, n, k) for k, u in jobs.items()}))
            time.sleep(0.3)  # the access log line follows the last chunk
            engine = {k: engine_times(logs / f"{k}.log", before[k]) for k in "ab"}
            return {k: (clients[k], engine[k]) for k in jobs}

        for k, s in (("a", a), ("b", b)):  # cache the prompt on both replicas; warm up
            asyncio.run(loop(s.base_url, model, prompt, 3, "w"))
        fresh = system_prompts(3, 2048, lambda t: httpx.post(a.base_url + "/tokenize", json={"prompt": t},
                                                             timeout=30).json()["count"], 1)
        before = len(engine_times(logs / "a.log", 0))
        for text in fresh:
            asyncio.run(loop(a.base_url, model, text, 1, "f"))
        time.sleep(0.3)
        result["engine_ttft_fresh_ms"] = 1000 * median(t for t, _ in engine_times(logs / "a.log", before))
        alone = run({"a": a.base_url})["a"]
        both = run({"a": a.base_url, "b": b.base_url})
        result["engine_total_alone_ms"] = 1000 * median(t for _, t in alone[1])
        result["engine_total_both_ms"] = 1000 * median(t for r in both.values() for _, t in r[1])
        result["engine_ttft_alone_ms"] = 1000 * median(t for t, _ in alone[1])
        result["engine_ttft_both_ms"] = 1000 * median(t for r in both.values() for t, _ in r[1])
        result["share_factor"] = result["engine_total_both_ms"] / result["engine_total_alone_ms"]
        result["direct"] = {"ttft_ms": 1000 * median(c[0] - e[0] for c, e in zip(*alone)),
                            "cycle_ms": 1000 * median(c[1] - e[1] for c, e in zip(*alone))}
        for policy in ("round_robin", "cache_aware"):
            router = Router([a.base_url, b.base_url], policy, logs / f"router-{policy}.log")
            try:
                asyncio.run(loop(router.url, model, prompt, 4, "w"))
                before = {k: len(engine_times(logs / f"{k}.log", 0)) for k in "ab"}
                client = asyncio.run(loop(router.url, model, prompt, n, "r"))
                time.sleep(0.3)
            finally:
                router.stop()
            engine = _merge(logs, before)
            result[policy] = {"ttft_ms": 1000 * median(c[0] - e[0] for c, e in zip(client, engine)),
                              "cycle_ms": 1000 * median(c[1] - e[1] for c, e in zip(client, engine))}
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


def _merge(logs: Path, before: dict) -> list[tuple[float, float]]:
    """One client's requests, in order, across both replicas' logs (by log timestamp)."""
    rows = []
    for k in "ab":
        lines = [line for line in (logs / f"{k}.log").read_text().splitlines() if ACCESS.search(line)]
        rows += [(line[:23], ACCESS.search(line)) for line in lines[before[k]:]]
    rows.sort(key=lambda r: r[0])
    return [(float(m[1]) / 1000, float(m[2]) / 1000) for _, m in rows]


async def _gather(coros: dict) -> dict:
    values = await asyncio.gather(*coros.values())
    return dict(zip(coros, values))


if __name__ == "__main__":
    sys.exit(main())
