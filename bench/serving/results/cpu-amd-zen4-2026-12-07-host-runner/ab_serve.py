"""Both builds' servers up at once (/work/main before, /work/wt-tf after); closed-loop c=1 rounds of
one-token requests of N prompt ids, alternating. Usage: python ab_serve.py <N> <rounds> <requests>."""
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import time

TREES = {"before": ("/work/main", 8161), "after": ("/work/wt-tf", 8162)}


def wait(port: int) -> None:
    for _ in range(300):
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port)
            connection.request("GET", "/health")
            connection.getresponse().read()
            return
        except OSError:
            time.sleep(0.1)


def rate(port: int, n: int, requests: int, rng: random.Random) -> float:
    connection = http.client.HTTPConnection("127.0.0.1", port)
    start = time.perf_counter()
    for _ in range(requests):
        body = json.dumps({"model": "prelude-demo", "prompt": [rng.randrange(100, 2000) for _ in range(n)],
                           "max_tokens": 1, "temperature": 0})
        connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        assert response.status == 200
    return requests / (time.perf_counter() - start)


def main(n: int, rounds: int, requests: int) -> None:
    servers = {name: subprocess.Popen([sys.executable, "-m", "prelude", "--port", str(port)],
                                      env=dict(os.environ, PYTHONPATH=tree), stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL) for name, (tree, port) in TREES.items()}
    try:
        rng = random.Random(0)
        for _, port in TREES.values():
            wait(port)
            rate(port, n, 20, rng)
        rates: dict[str, list[float]] = {name: [] for name in TREES}
        for i in range(rounds):
            for name in (list(TREES) if i % 2 == 0 else list(TREES)[::-1]):
                rates[name].append(rate(TREES[name][1], n, requests, rng))
        for name, values in rates.items():
            print(n, name, [round(v, 1) for v in values], "median", round(statistics.median(values), 1))
    finally:
        for server in servers.values():
            server.terminate()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
