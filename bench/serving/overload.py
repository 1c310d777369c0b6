"""The overload run of `bench.serving.long_short`: a herd of concurrent short score requests
against a bounded queue, with /health probed meanwhile.

Reports accepted and refused latencies (P50/P99/max), the time each refusal spent in the
server's app (from its access log: until its last byte was handed to the connection, not the
connection's teardown), and /health's worst answer."""
from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from pathlib import Path
from typing import Callable

from bench.serving.core.stats import percentile


async def overload(url: str, count: int, body: Callable[[], dict], log_path: Path | None = None) -> dict:
    """`count` concurrent requests (`body()` each, to /v1/score) at once, while /health is
    probed every 50 ms on fresh connections.

    Each request is its own raw connection (asyncio streams, `Connection: close`), timed from
    its connect to the end of its response. Not httpx: its pool's per-request bookkeeping grows
    with open connections, and at 1,000 the client's own work, not the server's, set the
    latencies (a refusal the server sent within a second arrived in the client's hands ~8 s
    later). Even so the herd's latencies include the client's and the kernel's share of 1,000
    connections on the same cores; the server's access log (`log_path`) gives the time each
    refusal spent in the server's app."""
    port = int(url.rsplit(":", 1)[1])
    stop = threading.Event()
    health: list[tuple[float, int]] = []
    prober = threading.Thread(target=_probe, args=(
        port, b"GET /health HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n", stop, health))
    prober.start()
    requests = [_raw_post("/v1/score", body()) for _ in range(count)]
    out = await asyncio.gather(*(_timed(port, request) for request in requests))
    stop.set()
    prober.join()
    accepted = [t for t, status in out if status == 200]
    refused = [t for t, status in out if status == 503]
    server_refused = _app_ms(log_path, 503) if log_path is not None else []
    return {"requests": count, "accepted": len(accepted), "refused": len(refused),
            "other": count - len(accepted) - len(refused),
            **_ms("accepted", accepted), **_ms("refused", refused),
            **_ms("server_refused", [t / 1000 for t in server_refused]),
            "health_worst_ms": 1000 * max((t if status == 200 else float("inf") for t, status in health),
                                          default=float("nan"))}


def _raw_post(path: str, body: dict) -> bytes:
    payload = json.dumps(body).encode()
    return (b"POST %s HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: %d\r\n\r\n%s" % (path.encode(), len(payload), payload))


async def _timed(port: int, request: bytes) -> tuple[float, int]:
    sent = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        await writer.drain()
        status = int((await reader.readline()).split()[1])
        await reader.read()  # the whole response: the server closes after it
        writer.close()
    except (OSError, ValueError, IndexError):
        status = 0
    return time.perf_counter() - sent, status


def _probe(port: int, request: bytes, stop: threading.Event, out: list[tuple[float, int]]) -> None:
    """`request` on a fresh connection every 50 ms: (seconds to the whole response, status; 0
    when it failed)."""
    while not stop.is_set():
        began = time.perf_counter()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
                sock.sendall(request)
                response = b""
                while chunk := sock.recv(65536):
                    response += chunk
            status = int(response.split(b" ", 2)[1])
        except (OSError, ValueError, IndexError):
            status = 0
        out.append((time.perf_counter() - began, status))
        stop.wait(0.05)


def _app_ms(log_path: Path, status: int) -> list[float]:
    """The `total` (ms, in the server's app: from its first look at the request to its last
    byte sent) of each access-log line with `status`."""
    found = re.compile(rf" {status} .* total=([0-9.]+)ms")
    return [float(m.group(1)) for line in log_path.read_text(errors="replace").splitlines()
            if "prelude.access" in line and (m := found.search(line))]


def _ms(name: str, latencies: list[float]) -> dict[str, float | None]:
    """P50, P99 and max of `latencies` in ms, keyed `<name>_p50_ms` and so on (None when empty):
    a refusal's whole point is to be quick, so its tail is reported, not only its P99."""
    return {f"{name}_p50_ms": None if not latencies else 1000 * (percentile(latencies, 50) or 0),
            f"{name}_p99_ms": None if not latencies else 1000 * (percentile(latencies, 99) or 0),
            f"{name}_max_ms": None if not latencies else 1000 * max(latencies)}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


