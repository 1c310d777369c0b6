"""A server's first requests and memory at a model's sampling defaults: starts `python -m prelude
--model DIR` from a tree, waits for /ready, sends five completions without sampling fields (so
the model's generation_config.json applies), and reports each one's time and the server's RSS.

    python bench/serving/results/cpu-amd-zen4-2026-12-07-native-cuts/first_request.py TREE DIR
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx


def main() -> None:
    tree, model, port = sys.argv[1], sys.argv[2], 8931
    env = {**os.environ, "PYTHONPATH": tree}
    proc = subprocess.Popen([sys.executable, "-m", "prelude", "--model", model, "--port", str(port)], env=env, cwd=tree,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        while True:
            try:
                if httpx.get(url + "/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            response = httpx.post(url + "/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 8},
                                  timeout=60)
            assert response.status_code == 200, response.text
            times.append((time.perf_counter() - start) * 1000)
        with open(f"/proc/{proc.pid}/status") as status:
            rss = next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024
        print("requests ms:", " ".join(f"{t:.1f}" for t in times), f"| RSS {rss:.0f} MiB")
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main()
