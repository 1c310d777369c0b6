"""`python -m bench.serving.health_flood`: does liveness hold under a flood?

Launches Prelude with its default flags (flags after a lone `--` go to it; the access log stays
on, as users run it), then sends `--requests` (1,000) non-streaming completions of
`--max-tokens` (16) all at once, one raw connection each, while one kept-alive connection polls
`GET /health` every `--poll-ms` (200). A Kubernetes liveness probe with a 1 s timeout restarts a
pod whose /health is slower than that, so every poll should answer within a second.

Reports each flood request's outcome (200, 503 with or without Retry-After, other statuses,
connection errors such as resets) and the polls' latencies (P50, P99, max, over 1 s); writes
JSON. Each flood request is its own asyncio connection (`Connection: close`), not an httpx
pool, whose bookkeeping grows with open connections (see bench.serving.overload)."""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from bench.serving.core import report
from bench.serving.core.loadgen import split_server_args
from bench.serving.core.prompts import WORDS
from bench.serving.core.server import ServerProcess, parse_command, prelude_env
from bench.serving.core.stats import percentile


@dataclass(frozen=True, slots=True)
class Outcome:
    status: int  # 0: no response (the connection failed)
    retry_after: bool
    error: str | None = None


def completion_request(prompt: str, max_tokens: int) -> bytes:
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))


async def one(port: int, request: bytes) -> Outcome:
    """Sends `request` on a fresh connection; the status and whether a Retry-After came back."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        await reader.read()  # the body: the server closes after it
        writer.close()
    except (OSError, asyncio.IncompleteReadError) as exc:
        return Outcome(0, False, f"{type(exc).__name__}: {exc}")
    lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower() for name, _, _ in (line.partition(":") for line in lines[1:])}
    return Outcome(int(lines[0].split()[1]), "retry-after" in headers)


async def flood(port: int, count: int, max_tokens: int, prompt_words: int, seed: int = 0) -> list[Outcome]:
    """`count` requests at once, each with its own prompt of `prompt_words` random words (no two
    share a cached prefix beyond a word or two)."""
    rng = random.Random(seed)
    requests = [completion_request(" ".join(rng.choices(WORDS, k=prompt_words)), max_tokens) for _ in range(count)]
    return list(await asyncio.gather(*(one(port, request) for request in requests)))


def poll_health(port: int, interval: float, polling, stop, out) -> None:
    """GET /health every `interval` seconds on one kept-alive connection (reconnecting if the
    server closes it), setting `polling` once the first poll is answered, until `stop` is set;
    sends [(seconds to the whole response, status; 0 when it failed), ...] on `out`. Run in its
    own process: in the flood's process, the flood's own work on the GIL and the event loop would
    delay the polls' timing, not the server."""
    polls: list[tuple[float, int]] = []
    sock = reader = None
    while not stop.is_set():
        began = time.perf_counter()
        try:
            if sock is None:
                sock = socket.create_connection(("127.0.0.1", port), timeout=30)
                reader = sock.makefile("rb")
            sock.sendall(b"GET /health HTTP/1.1\r\nhost: localhost\r\n\r\n")
            status = int(reader.readline().split()[1])
            length = 0
            while (line := reader.readline().strip()):
                name, _, value = line.partition(b":")
                length = int(value) if name.lower() == b"content-length" else length
            reader.read(length)
        except (OSError, ValueError, IndexError):
            status = 0
            sock = reader = None
        polls.append((time.perf_counter() - began, status))
        polling.set()
        stop.wait(max(0.0, interval - (time.perf_counter() - began)))
    out.send(polls)


def summary(outcomes: list[Outcome], polls: list[tuple[float, int]], seconds: float) -> dict:
    ok = [t for t, status in polls if status == 200]
    return {
        "requests": len(outcomes), "flood_seconds": round(seconds, 2),
        "ok": sum(o.status == 200 for o in outcomes),
        "refused_with_retry_after": sum(o.status == 503 and o.retry_after for o in outcomes),
        "refused_without_retry_after": sum(o.status == 503 and not o.retry_after for o in outcomes),
        "other_status": sum(o.status not in (0, 200, 503) for o in outcomes),
        "connection_errors": sum(o.status == 0 for o in outcomes),
        "error_samples": sorted({o.error for o in outcomes if o.error})[:5],
        "polls": len(polls), "polls_failed": len(polls) - len(ok),
        "poll_p50_ms": 1000 * (percentile(ok, 50) or 0) if ok else None,
        "poll_p99_ms": 1000 * (percentile(ok, 99) or 0) if ok else None,
        "poll_max_ms": 1000 * max(ok) if ok else None,
        "polls_over_1s": sum(t > 1.0 for t in ok),
    }


def run_flood(port: int, requests: int, max_tokens: int, prompt_words: int,
              poll_s: float) -> tuple[list[Outcome], list[tuple[float, int]], float]:
    """The flood, with /health polled every `poll_s` from another process meanwhile: (outcomes,
    polls, the flood's seconds)."""
    context = multiprocessing.get_context("spawn")
    polling, stop = context.Event(), context.Event()
    polls_in, polls_out = context.Pipe(duplex=False)
    poller = context.Process(target=poll_health, args=(port, poll_s, polling, stop, polls_out), daemon=True)
    poller.start()
    if not polling.wait(60):
        raise SystemExit("the /health poller never got an answer")
    began = time.perf_counter()
    try:
        outcomes = asyncio.run(flood(port, requests, max_tokens, prompt_words))
    finally:
        seconds = time.perf_counter() - began
        stop.set()
    polls = polls_in.recv()
    poller.join()
    return outcomes, polls, seconds


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.serving.health_flood", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Flags after a lone -- go to the server.")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--prompt-words", type=int, default=16, help="random words in each request's prompt")
    p.add_argument("--server-cmd", help="command launching the server (default: this python -m prelude)")
    p.add_argument("--poll-ms", type=float, default=200.0)
    p.add_argument("--json", type=Path, help="results file (default bench-results/health_flood-<time>.json)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    own, server_args = split_server_args(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(own)
    with ServerProcess(server_args, parse_command(args.server_cmd), prelude_env(), label="prelude") as server:
        outcomes, polls, seconds = run_flood(server.port, args.requests, args.max_tokens, args.prompt_words,
                                             args.poll_ms / 1000)
    result = summary(outcomes, polls, seconds)
    print(report.table(["measure", "value"], [[k, v] for k, v in result.items() if k != "error_samples"]))
    if result["error_samples"]:
        print("errors, e.g.: " + "; ".join(result["error_samples"]))
    path = report.write_json(args.json or report.default_json_path("health_flood"), {
        "tool": "bench.serving.health_flood", "server_args": server_args, "log": str(server.log_path),
        "max_tokens": args.max_tokens, "prompt_words": args.prompt_words, "poll_ms": args.poll_ms, **result,
        "poll_latencies_ms": [round(1000 * t, 2) if status == 200 else None for t, status in polls]})
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
