"""Idle keep-alive connections: the server keeps one open longer than client pools keep theirs
(httpx and the OpenAI client expire an idle connection after 5 s), so a client never sends a
request on a connection the server is closing at that moment, which fails before reaching it.
--keep-alive-timeout sets how long."""
from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

from prelude.contract.config import Config
from tests.server.harness import ServerThread

HEALTH = b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n"


def _connect(base_url: str) -> socket.socket:
    url = urlsplit(base_url)
    return socket.create_connection((url.hostname, url.port), timeout=10)


def _exchange(sock: socket.socket) -> bytes:
    """One GET /health on the open connection; its whole response (b"" if the server closed it)."""
    try:
        sock.sendall(HEALTH)
    except OSError:
        return b""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def test_a_connection_idle_past_a_client_pools_expiry_still_serves(server):
    with _connect(server.base_url) as sock:
        assert _exchange(sock).startswith(b"HTTP/1.1 200")
        time.sleep(5.5)  # past httpx's keepalive_expiry and uvicorn's timeout (both 5 s)
        assert _exchange(sock).startswith(b"HTTP/1.1 200")


def test_keep_alive_timeout_closes_an_idle_connection(demo_model):
    with ServerThread(Config(model=str(demo_model), keep_alive_timeout=0.5)) as srv, _connect(srv.base_url) as sock:
        assert _exchange(sock).startswith(b"HTTP/1.1 200")
        sock.settimeout(5)
        began = time.monotonic()
        assert sock.recv(1) == b""  # the server closed it
        assert time.monotonic() - began < 3
