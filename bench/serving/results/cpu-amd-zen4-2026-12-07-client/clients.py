"""Three HTTP clients against one running server, one request at a time, in turn, two rounds:
httpx (the benchmarks' client until 2026-12-07), aiohttp (since) and a bare `http.client` loop.

    python clients.py PORT SERVER_PID [REQUESTS]

One-token completions (128 random token ids, unstreamed) and 16-token streams: each client's
latency P50, its own CPU per request, and the server's (its /proc clock)."""
from __future__ import annotations

import asyncio
import http.client
import json
import random
import statistics
import sys
import time

import aiohttp
import httpx

HEADERS = {"content-type": "application/json"}


def server_cpu(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100


def bodies(n: int, stream: bool) -> list[bytes]:
    rng = random.Random(time.time())  # fresh prompts each run: no prefix-cache hits
    extra = {"max_tokens": 16, "ignore_eos": True, "stream": True} if stream else {"max_tokens": 1}
    return [json.dumps({"prompt": [rng.randrange(3, 2000) for _ in range(128)], "temperature": 0, **extra}).encode()
            for _ in range(n)]


async def with_httpx(url: str, sent: list[bytes], stream: bool) -> list[float]:
    times = []
    async with httpx.AsyncClient(base_url=url) as client:
        for body in sent:
            t = time.perf_counter()
            if stream:
                async with client.stream("POST", "/v1/completions", content=body, headers=HEADERS) as r:
                    async for _ in r.aiter_lines():
                        pass
            else:
                (await client.post("/v1/completions", content=body, headers=HEADERS)).json()
            times.append(time.perf_counter() - t)
    return times


async def with_aiohttp(url: str, sent: list[bytes], stream: bool) -> list[float]:
    times = []
    async with aiohttp.ClientSession() as session:
        for body in sent:
            t = time.perf_counter()
            async with session.post(url + "/v1/completions", data=body, headers=HEADERS) as r:
                if stream:
                    async for _ in r.content:
                        pass
                else:
                    json.loads(await r.read())
            times.append(time.perf_counter() - t)
    return times


def with_http_client(port: int, sent: list[bytes], stream: bool) -> list[float]:
    times = []
    connection = http.client.HTTPConnection("127.0.0.1", port)
    for body in sent:
        t = time.perf_counter()
        connection.request("POST", "/v1/completions", body, HEADERS)
        r = connection.getresponse()
        if stream:
            while r.readline():
                pass
        else:
            json.loads(r.read())
        times.append(time.perf_counter() - t)
    return times


def main() -> None:
    port, pid = int(sys.argv[1]), int(sys.argv[2])
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 500
    url = f"http://127.0.0.1:{port}"
    clients = {"httpx": lambda b, s: asyncio.run(with_httpx(url, b, s)),
               "aiohttp": lambda b, s: asyncio.run(with_aiohttp(url, b, s)),
               "http.client": lambda b, s: with_http_client(port, b, s)}
    for stream in (False, True):
        print("16-token streams" if stream else "one-token completions")
        for _ in range(2):
            for name, run in clients.items():
                sent = bodies(n, stream)
                server0, client0 = server_cpu(pid), time.process_time()
                times = run(sent, stream)
                server1, client1 = server_cpu(pid), time.process_time()
                client_us, server_us = (client1 - client0) / n * 1e6, (server1 - server0) / n * 1e6
                print(f"  {name:11s} P50 {statistics.median(times) * 1e6:6.0f} us   client CPU "
                      f"{client_us:5.0f} us/request   server CPU {server_us:5.0f}")


if __name__ == "__main__":
    main()
