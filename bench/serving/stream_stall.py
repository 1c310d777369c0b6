"""`python -m bench.serving.stream_stall`: how long a running stream waits for its tokens while a
long request is served beside it (issue #16). A streamed completion (greedy, `ignore_eos`) gets,
after its 20th token, a long request beside it: an embedding (`embed`, OneShot) or a chat prompt
with 8 output tokens (`chat`, Decode), of `--long-tokens` random token ids. Per run: the stream's
longest gap between two tokens while the long request ran, the tokens it got meanwhile, and the
long request's time (and first token, for `chat`). Table, JSON, and a PNG of the gaps.

To compare builds, run it once per build: `--server-cmd "env -C ../other python -m prelude"`, or
`--base-url` for a server already running (started with `--max-model-len` above --long-tokens)."""
from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path
from typing import Sequence

import httpx

from bench.serving.core import report
from bench.serving.core.server import ServerProcess, parse_command, prelude_env

STREAM_PROMPT = [5, 6, 7]
LONG_AFTER = 20  # stream tokens before the long request goes out


async def one_run(url: str, kind: str, long_tokens: int, stream_tokens: int, seed: int) -> dict:
    """One stream with one long request beside it; times in seconds."""
    rng = random.Random(seed)
    long_ids = [rng.randrange(3, 500) for _ in range(long_tokens)]
    first_token: list[float] = []

    async def long_request(client: httpx.AsyncClient) -> None:
        began = time.perf_counter()
        if kind == "embed":
            (await client.post("/v1/embeddings", json={"input": [long_ids]})).raise_for_status()
            return
        body = {"prompt": long_ids, "max_tokens": 8, "ignore_eos": True, "temperature": 0, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if line.startswith("data:") and not first_token:
                    first_token.append(time.perf_counter() - began)

    arrivals: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        body = {"prompt": STREAM_PROMPT, "max_tokens": stream_tokens, "ignore_eos": True, "temperature": 0,
                "stream": True}
        task: asyncio.Task | None = None
        ended = None
        async with client.stream("POST", "/v1/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                arrivals.append(time.perf_counter())
                if task is None and len(arrivals) == LONG_AFTER:
                    began, task = time.perf_counter(), asyncio.create_task(long_request(client))
                elif task is not None and task.done():
                    ended = time.perf_counter()
                    break
        assert task is not None
        await task  # its error, if any
    if ended is None:
        raise SystemExit(f"the stream ended before the long request: raise --stream-tokens ({stream_tokens})")
    beside = [t for t in arrivals if t >= began]
    gaps = [b - a for a, b in zip(arrivals[LONG_AFTER - 1:], arrivals[LONG_AFTER:])]
    return {"kind": kind, "long_s": ended - began, "long_first_token_s": first_token[0] if first_token else None,
            "tokens_during": sum(t <= ended for t in beside), "max_gap_s": max(gaps),
            "gaps_s": gaps, "gap_ends_s": [t - began for t in arrivals[LONG_AFTER:]]}


def plot(runs: list[dict], path: Path) -> Path:
    """Each run's gaps between stream tokens against time since the long request went out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, run in enumerate(runs):
        ax.plot(run["gap_ends_s"], [1000 * g for g in run["gaps_s"]], marker=".", label=f"{run['kind']} #{i + 1}")
    ax.set_xlabel("seconds since the long request went out")
    ax.set_ylabel("gap between two stream tokens, ms")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serving.stream_stall", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kinds", default="embed,chat", help="embed, chat, or both")
    p.add_argument("--long-tokens", type=int, default=8000)
    p.add_argument("--runs", type=int, default=3, help="runs per kind (each with fresh token ids)")
    p.add_argument("--stream-tokens", type=int, default=4000,
                   help="the stream's max_tokens: it must outlast the long request")
    p.add_argument("--server-cmd", help="command launching the server (default: this checkout)")
    p.add_argument("--base-url", help="measure this running server instead")
    p.add_argument("--json", type=Path, default=report.RESULTS_DIR / "stream_stall.json")
    args = p.parse_args(argv)

    def measure(url: str) -> list[dict]:
        return [asyncio.run(one_run(url, kind, args.long_tokens, args.stream_tokens, seed=1000 * k + i))
                for k, kind in enumerate(args.kinds.split(",")) for i in range(args.runs)]

    if args.base_url:
        runs = measure(args.base_url)
    else:
        max_len = max(args.long_tokens + 256, args.stream_tokens + len(STREAM_PROMPT))
        with ServerProcess(["--max-model-len", str(max_len)], command=parse_command(args.server_cmd),
                           env=prelude_env(), label="stream-stall") as server:
            runs = measure(server.base_url)
    rows = [[r["kind"], i % args.runs + 1, 1000 * r["max_gap_s"], r["tokens_during"], r["long_s"],
             r["long_first_token_s"]] for i, r in enumerate(runs)]
    print(f"a stream beside a {args.long_tokens}-token request")
    print(report.table(["long", "run", "longest gap ms", "stream tokens meanwhile", "long s", "long TTFT s"], rows))
    path = report.write_json(args.json, {"tool": "bench.serving.stream_stall", "long_tokens": args.long_tokens,
                                         "runs": runs})
    print(f"results: {path}\nplot: {plot(runs, path.with_suffix('.png'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
