"""Per server thread, CPU and context switches per 16-token stream at c=1, through httpx (h) or
aiohttp (a), from /proc/<pid>/task/*/{stat,status}:

    python stream_threads.py PORT h|a REQUESTS SERVER_PID"""
import asyncio
import json
import sys
import random
import os
import time
import httpx
import aiohttp

port, which, n, pid = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(time.time())
bodies = [json.dumps({"prompt": [rng.randrange(3, 2000) for _ in range(128)], "max_tokens": 16, "temperature": 0,
                      "ignore_eos": True, "stream": True}).encode() for _ in range(n)]
HEADERS = {"content-type": "application/json"}
WARMUP = 20


def snapshot():
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        fields = open(f"/proc/{pid}/task/{t}/stat").read().rsplit(")", 1)[1].split()
        status = open(f"/proc/{pid}/task/{t}/status").read()
        out[t] = (int(fields[11]), int(fields[12]), int(status.split("\nvoluntary_ctxt_switches:")[1].split()[0]),
                  int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0]))
    return out


async def run():
    began = None
    if which == "a":
        async with aiohttp.ClientSession() as session:
            for i, body in enumerate(bodies):
                if i == WARMUP:
                    began = snapshot(), time.perf_counter()
                async with session.post(f"http://127.0.0.1:{port}/v1/completions", data=body, headers=HEADERS) as r:
                    async for _ in r.content:
                        pass
    else:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            for i, body in enumerate(bodies):
                if i == WARMUP:
                    began = snapshot(), time.perf_counter()
                async with client.stream("POST", "/v1/completions", content=body, headers=HEADERS) as r:
                    async for _ in r.aiter_lines():
                        pass
    return began


(before, t0) = asyncio.run(run())
seconds, after, m = time.perf_counter() - t0, snapshot(), n - WARMUP
print(which, f"wall {seconds / m * 1e6:.0f} us a stream")
for tid, now in after.items():
    if tid in before:
        d = [now[i] - before[tid][i] for i in range(4)]
        if sum(d):
            print(f"  thread {tid}: user {d[0] * 1e4 / m:6.0f} us, system {d[1] * 1e4 / m:6.0f} us, "
                  f"voluntary switches {d[2] / m:.2f}, involuntary {d[3] / m:.2f}")
