"""While the waiting queue is at its bound, a request is refused from its headers alone: the
503 `overloaded` (with Retry-After) arrives though the client has sent only the start of a body
that would take long to read and tokenize, so the server cannot have read it. Meanwhile nothing
accepted is lost, no KV block leaks, the refusal is counted, the endpoints that queue no engine
work still answer, and once the queue has room requests are admitted again. A small body is read
before its refusal, so the connection stays open however the client splits its writes."""
from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx

from prelude.contract.config import Config
from tests.server.harness import ServerThread
from tests.server.test_admission import Gate, _wait_for

QUEUE = 4
BODY = {"prompt": "Is this relevant?", "max_tokens": 1, "temperature": 0}
# A megabyte of prose to embed: reading and tokenizing it would take the loop a while; only its
# first kilobyte is ever sent.
HUGE_BYTES = 1 << 20


def _refused_with_body_unsent(port: int) -> tuple[int, dict[str, str], dict, float]:
    """POSTs /v1/embeddings announcing HUGE_BYTES but sending 1 KB of them, then reads the
    response while the rest of the body is still owed: (status, headers, JSON body, seconds)."""
    head = (b"POST /v1/embeddings HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % HUGE_BYTES)
    start = b'{"input": "' + b"lorem ipsum dolor sit amet " * 40
    began = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + start)
        response = b""
        while b"\r\n\r\n" not in response:
            response += sock.recv(65536)
        header_text, _, body = response.partition(b"\r\n\r\n")
        lines = header_text.decode().split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        while len(body) < int(headers["content-length"]):
            body += sock.recv(65536)
    return int(lines[0].split()[1]), headers, json.loads(body), time.perf_counter() - began


def _statuses_with_bodies_sent_late(port: int, requests: int = 2, pause_s: float = 0.05) -> list[int]:
    """Small POSTs on one kept-alive connection, each body sent `pause_s` after its headers: the
    statuses read, ending early if the server closed the connection."""
    body = json.dumps({"input": "lorem ipsum"}).encode()
    head = (b"POST /v1/embeddings HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % len(body))
    statuses: list[int] = []
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock, sock.makefile("rb") as reader:
        for _ in range(requests):
            try:
                sock.sendall(head)
                time.sleep(pause_s)
                sock.sendall(body)
                status_line = reader.readline()
                if not status_line:
                    break
                length = 0
                while (line := reader.readline().strip()):
                    name, _, value = line.decode().partition(":")
                    length = int(value) if name.lower() == "content-length" else length
                reader.read(length)
            except OSError:
                break
            statuses.append(int(status_line.split()[1]))
    return statuses


def test_full_queue_refuses_before_reading_the_body(demo_model, http_server):
    config = Config(model=str(demo_model), num_kv_blocks=256, max_queued_requests=QUEUE,
                    max_request_bytes=2 * HUGE_BYTES, http_server=http_server)
    with ServerThread(config) as srv:
        want = httpx.post(srv.base_url + "/v1/completions", json=BODY).json()["choices"][0]["text"]
        gate = Gate(srv.engine.executors)
        srv.on_loop(lambda: setattr(srv.engine, "executors", gate))

        async def overload():
            limits = httpx.Limits(max_connections=1)
            async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as client, \
                    httpx.AsyncClient(base_url=srv.base_url, timeout=60, limits=limits) as keep_alive:
                first = asyncio.create_task(client.post("/v1/completions", json=BODY))
                await asyncio.to_thread(_wait_for, srv, lambda: srv.engine._in_flight)
                queued = [asyncio.create_task(client.post("/v1/completions", json=BODY)) for _ in range(QUEUE)]
                await asyncio.to_thread(_wait_for, srv, lambda: srv.engine.scheduler.num_waiting == QUEUE)
                refused = await asyncio.to_thread(_refused_with_body_unsent, srv.config.port)
                split = await asyncio.to_thread(_statuses_with_bodies_sent_late, srv.config.port)
                # Refused on a kept-alive connection: the connection stays usable (a small body
                # is read before the 503; the raw-socket check above covers large bodies, which
                # are never read).
                kept = [await keep_alive.post("/v1/embeddings", json={"input": "lorem ipsum " * 20})
                        for _ in range(2)]
                # Routes that queue no engine work are not gated.
                side = [await client.post("/tokenize", json={"prompt": "hello"}), await client.get("/v1/models")]
                gate.open.set()
                served = [await first, *[await r for r in queued]]
                after = await keep_alive.post("/v1/embeddings", json={"input": "lorem ipsum"})
                return served, refused, split, side, kept, after

        served, (status, headers, error, seconds), split, side, kept, after = asyncio.run(overload())
        assert split == [503, 503]  # a body sent after its headers: read, and the connection kept
        # Once the queue has room, requests are admitted again (on the same client).
        assert [r.status_code for r in kept] == [503, 503] and after.status_code == 200
        assert status == 503 and headers["retry-after"] == "1"
        assert error["error"]["code"] == "overloaded" and error["error"]["type"] == "server_error"
        assert seconds < 5  # generous for a shared CI box; it is answered from the headers alone
        assert [r.status_code for r in side] == [200, 200]
        assert [r.status_code for r in served] == [200] * (1 + QUEUE)
        assert all(r.json()["choices"][0]["text"] == want for r in served)  # nothing accepted is lost
        srv.wait_idle()  # and every KV block is back
        metrics = httpx.get(srv.base_url + "/metrics").text
        assert f'prelude:rejected_requests_total{{model_name="{srv.served.name}",reason="queue_full"}} 5' in metrics
