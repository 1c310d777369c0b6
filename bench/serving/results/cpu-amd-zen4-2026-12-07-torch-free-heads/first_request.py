"""A server's first requests and memory: starts `python -m prelude --model DIR` from a tree,
waits for /ready, sends five requests of one kind, and reports each one's time and the server's
RSS. Kinds: `completion` (8 tokens, no sampling fields, so the model's generation_config.json
applies), `score` (/v1/score, two items, two labels), `prompt-logprobs` (a completion of one
token with prompt_logprobs 1), `json` (a pairwise judge's JSON schema, 24 tokens), `choice` (one of
three labels), `allowed-logprobs` (one token of five allowed ids, logprobs 3), `mean-pool` (an
embedding, the server started with --pooling mean).

    python bench/serving/results/cpu-amd-zen4-2026-12-07-torch-free-heads/first_request.py TREE DIR [KIND]
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx

from bench.serving.core.schemas import JUDGE, LABELS


def main() -> None:
    tree, model, port = sys.argv[1], sys.argv[2], 8931
    kind = sys.argv[3] if len(sys.argv) > 3 else "completion"
    path, body = {"completion": ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8}),
                  "score": ("/v1/score", {"query": "Is this answer right?", "items": ["yes it is", "no"],
                                          "label_token_ids": [5, 6], "apply_softmax": True}),
                  "prompt-logprobs": ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 1,
                                                          "prompt_logprobs": 1}),
                  "json": ("/v1/completions", {"prompt": "Verdict:", "max_tokens": 24,
                                               "structured_outputs": {"json": JUDGE["pairwise"]}}),
                  "choice": ("/v1/completions", {"prompt": "Verdict:", "max_tokens": 8,
                                                 "structured_outputs": {"choice": LABELS}}),
                  "allowed-logprobs": ("/v1/completions", {"prompt": "Verdict:", "max_tokens": 1, "logprobs": 3,
                                                           "allowed_token_ids": [5, 6, 7, 8, 9]}),
                  "mean-pool": ("/v1/embeddings", {"input": "Once upon a time"})}[kind]
    env = {**os.environ, "PYTHONPATH": tree}
    flags = ["--pooling", "mean"] if kind == "mean-pool" else []
    proc = subprocess.Popen([sys.executable, "-m", "prelude", "--model", model, "--port", str(port), *flags], env=env,
                            cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
            response = httpx.post(url + path, json=body, timeout=60)
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
