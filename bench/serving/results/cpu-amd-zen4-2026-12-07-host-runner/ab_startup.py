"""Alternates two builds' servers on one checkpoint and format: seconds from launch to GET
/health 200, and RSS then and after one request of each kind the benchmarks send (a one-token
completion, a streamed generation, an embedding). Usage:
python ab_startup.py <rounds> <model dir or "demo"> fp32|bf16|int8 <tree A> <tree B> > out.jsonl"""
import json
import os
import subprocess
import sys
import time
import urllib.request

FLAGS = {"fp32": [], "bf16": ["--dtype", "bfloat16"], "int8": ["--quantization", "int8"]}
REQUESTS = [("/v1/completions", {"prompt": "Hello there", "max_tokens": 1, "temperature": 0}),
            ("/v1/completions", {"prompt": "Hello there", "max_tokens": 8, "stream": True}),
            ("/v1/embeddings", {"input": "Hello there"})]


def rss_mib(pid: int) -> int:
    return next(int(line.split()[1]) // 1024 for line in open(f"/proc/{pid}/smaps_rollup") if line.startswith("Rss"))


def post(port: int, path: str, body: dict) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()


def server(tree: str, model: str, fmt: str, port: int = 8139) -> dict:
    args = [] if model == "demo" else ["--model", model]
    env = dict(os.environ, PYTHONPATH=tree)
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "prelude", "--port", str(port), *args, *FLAGS[fmt]], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.005)
        seconds = time.perf_counter() - start
        loaded = rss_mib(proc.pid)
        for path, body in REQUESTS:
            post(port, path, body)
        return {"tree": tree, "seconds": round(seconds, 3), "rss_mib": loaded,
                "rss_after_requests_mib": rss_mib(proc.pid)}
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    rounds, model, fmt, trees = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:6]
    for tree in trees:  # a first start of each, discarded (as bench.serving.startup does)
        server(tree, model, fmt)
    for i in range(rounds):
        for tree in trees if i % 2 == 0 else trees[::-1]:
            print(json.dumps({"model": model, "format": fmt, **server(tree, model, fmt)}), flush=True)
