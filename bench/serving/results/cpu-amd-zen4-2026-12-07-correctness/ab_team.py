"""Two servers side by side, alternating blocks of sequential requests: per workload the median
latency of each block on each server, and B / A per block.

    python ab_team.py PORT_A,PORT_B BLOCKS PER_BLOCK score,embed512,gen16,batch8
"""
from __future__ import annotations

import asyncio
import random
import statistics
import sys
import time

import aiohttp


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 500) for _ in range(n)]


def _request(kind: str, rng: random.Random) -> tuple[str, dict]:
    if kind == "score":
        return "/v1/score", {"query": _ids(rng, 120), "items": [_ids(rng, 8)], "label_token_ids": [5, 9]}
    if kind == "embed512":
        return "/v1/embeddings", {"input": [_ids(rng, 512)]}
    if kind == "gen16":
        return "/v1/completions", {"model": "prelude-demo", "prompt": _ids(rng, 128), "max_tokens": 16,
                                   "ignore_eos": True}
    if kind == "batch8":
        return "/v1/embeddings", {"input": [_ids(rng, 128) for _ in range(8)]}
    raise ValueError(kind)


async def _send(session: aiohttp.ClientSession, port: int, path: str, body: dict) -> float:
    start = time.perf_counter()
    async with session.post(f"http://127.0.0.1:{port}{path}", json=body) as response:
        assert response.status == 200, await response.text()
        await response.read()
    return (time.perf_counter() - start) * 1000


async def main(ports: list[int], blocks: int, per: int, kinds: list[str]) -> None:
    rng = random.Random(1)
    async with aiohttp.ClientSession() as session:
        for port in ports:  # warm-up
            for kind in kinds:
                for _ in range(5):
                    await _send(session, port, *_request(kind, rng))
        medians: dict[tuple[int, str], list[float]] = {(p, k): [] for p in ports for k in kinds}
        for block in range(blocks):
            for kind in kinds:
                requests = [_request(kind, rng) for _ in range(per)]
                for port in ports if block % 2 == 0 else ports[::-1]:
                    latencies = [await _send(session, port, path, body) for path, body in requests]
                    medians[(port, kind)].append(statistics.median(latencies))
    for kind in kinds:
        a, b = medians[(ports[0], kind)], medians[(ports[1], kind)]
        ratios = [y / x for x, y in zip(a, b)]
        print(f"{kind:9s} A med {statistics.median(a):7.2f} ms  B med {statistics.median(b):7.2f} ms  "
              "B/A per block: " + " ".join(f"{r:.2f}" for r in ratios) + f"  median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    asyncio.run(main([int(p) for p in sys.argv[1].split(",")], int(sys.argv[2]), int(sys.argv[3]),
                     sys.argv[4].split(",")))
