"""Under 1,000 simultaneous connections the server stays reachable: no connection is refused or
reset (the listen backlog holds them all), and /health answers within a second throughout."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

from bench.serving.server import ServerProcess, prelude_env

CONNECTIONS = 1000
HEALTH_LIMIT_S = 1.0


def _health_latencies(port: int, stop: threading.Event, out: list[float]) -> None:
    """GET /health on a fresh connection every 50 ms; a failure counts as infinite latency."""
    request = b"GET /health HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n"
    while not stop.is_set():
        began = time.perf_counter()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(request)
                ok = sock.recv(64).startswith(b"HTTP/1.1 200")
        except OSError:
            ok = False
        out.append(time.perf_counter() - began if ok else float("inf"))
        stop.wait(0.05)


async def _flood(port: int) -> list[str]:
    """Opens every connection at once, each sending one small request; returns the status line
    of each response (or the error that replaced it)."""
    body = json.dumps({"prompt": "hello there", "max_tokens": 1, "temperature": 0}).encode()
    request = (b"POST /v1/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
               b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))

    async def one() -> str:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            await writer.drain()
            status = (await reader.readline()).decode().strip()
            await reader.read()
            writer.close()
            return status
        except OSError as exc:
            return f"{type(exc).__name__}: {exc}"

    return await asyncio.gather(*(one() for _ in range(CONNECTIONS)))


def test_thousand_connections_no_reset_and_health_stays_fast(demo_model):
    # Access logging off: 1,000 log lines are not what this test measures.
    with ServerProcess(["--model", str(demo_model), "--num-kv-blocks", "512", "--disable-log-requests"],
                       env=prelude_env()) as server:
        latencies: list[float] = []
        stop = threading.Event()
        prober = threading.Thread(target=_health_latencies, args=(server.port, stop, latencies))
        prober.start()
        try:
            statuses = asyncio.run(_flood(server.port))
        finally:
            stop.set()
            prober.join()
    failed = [s for s in statuses if not s.startswith("HTTP/1.1 200")]
    assert not failed, f"{len(failed)} of {CONNECTIONS} failed, e.g. {failed[:3]}"
    assert latencies and max(latencies) < HEALTH_LIMIT_S, f"worst /health {max(latencies):.2f}s"
