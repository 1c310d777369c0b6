"""Alternates the probe (probe.py) with the server itself on the same checkpoint and format:
the server's seconds from launch to GET /health 200 and its RSS then, the probe's wall seconds
and RSS. Usage: python compare.py <rounds> <model dir or "demo"> fp32|bf16|int8 > out.jsonl"""
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).parent
FLAGS = {"fp32": [], "bf16": ["--dtype", "bfloat16"], "int8": ["--quantization", "int8"]}


def rss_mib(pid: int) -> int:
    return next(int(line.split()[1]) // 1024 for line in open(f"/proc/{pid}/smaps_rollup") if line.startswith("Rss"))


def server(model: str, fmt: str, port: int = 8139) -> dict:
    args = [] if model == "demo" else ["--model", model]
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "prelude", "--port", str(port), *args, *FLAGS[fmt]],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.005)
        return {"run": "server", "seconds": round(time.perf_counter() - start, 3), "rss_mib": rss_mib(proc.pid)}
    finally:
        proc.terminate()
        proc.wait()


def probe(model: str, fmt: str) -> dict:
    path = str(Path.home() / ".cache/prelude/demo-v2") if model == "demo" else model
    start = time.perf_counter()
    out = subprocess.run([sys.executable, str(HERE / "probe.py"), path, fmt], capture_output=True, text=True,
                         check=True).stdout
    return {"run": "probe", "seconds": round(time.perf_counter() - start, 3), **json.loads(out)}


if __name__ == "__main__":
    rounds, model, fmt = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    server(model, fmt)  # a first start, discarded (as bench.serving.startup does)
    for i in range(rounds):
        for run in (server, probe) if i % 2 == 0 else (probe, server):
            print(json.dumps({"model": model, "format": fmt, **run(model, fmt)}), flush=True)
