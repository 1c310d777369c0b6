"""A client that goes away at any point costs no ERROR and no traceback (with the access log on,
its line says so; these servers run without one, as --disable-log-requests does, and log
nothing), and its work is dropped."""
from __future__ import annotations

import json
import logging
import socket
import time


def _send_and_drop(server, head_and_body: bytes, wait: float, generating: bool = False) -> None:
    """Sends, lets the server start on it (`wait` seconds; `generating`: until then, its
    generation runs), then vanishes."""
    with socket.create_connection(("127.0.0.1", server.config.port)) as sock:
        sock.sendall(head_and_body)
        time.sleep(wait)
        deadline = time.monotonic() + 10
        while generating and not server.on_loop(lambda: server.engine.scheduler.num_running):
            assert time.monotonic() < deadline, "the generation never started"
            time.sleep(0.005)


def _request(path: str, body: bytes, declared_length: int | None = None) -> bytes:
    length = len(body) if declared_length is None else declared_length
    return (f"POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
            f"content-length: {length}\r\n\r\n").encode() + body


def test_disconnects_are_logged_quietly(each_server, caplog):
    # The fixture's longest: 500 tokens take the demo model at least 0.25 s.
    long_generation = json.dumps({"prompt": "tell me a story", "max_tokens": 500, "ignore_eos": True}).encode()
    aborted = each_server.on_loop(lambda: each_server.engine.stats.finished.get("abort", 0))
    with caplog.at_level(logging.INFO):
        # Mid-body: the declared length never arrives.
        _send_and_drop(each_server, _request("/v1/completions", b'{"prompt": "hel', declared_length=500), 0.2)
        # Mid-generation, plain and streamed.
        _send_and_drop(each_server, _request("/v1/completions", long_generation), 0, generating=True)
        streamed = json.dumps({"prompt": "tell me a story", "max_tokens": 500, "ignore_eos": True,
                               "stream": True}).encode()
        _send_and_drop(each_server, _request("/v1/completions", streamed), 0, generating=True)
        each_server.wait_idle()
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not noisy, [r.getMessage() for r in noisy]
    # no line per request without the access log (a disconnect wrote one at INFO)
    assert not [r for r in caplog.records if r.levelno >= logging.INFO and "client went away" in r.getMessage()]
    # both generations were dropped (the body that never arrived reached no engine)
    assert each_server.on_loop(lambda: each_server.engine.stats.finished.get("abort", 0)) >= aborted + 2


def test_a_pipelined_clients_requests_all_end_with_it(each_server, caplog):
    """Two generations written back to back, then the client leaves: both are dropped (uvicorn), quietly.
    uvicorn told only the newest one, so the running one went on to its end and then failed
    writing to the closed connection (an ERROR with a traceback)."""
    long_generation = json.dumps({"prompt": "tell me a story", "max_tokens": 500, "ignore_eos": True}).encode()
    request = _request("/v1/completions", long_generation)

    def finished() -> dict:
        return each_server.on_loop(lambda: dict(each_server.engine.stats.finished))

    before = finished()
    with caplog.at_level(logging.INFO):
        _send_and_drop(each_server, request + request, 0, generating=True)
        each_server.wait_idle()
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not noisy, [r.getMessage() for r in noisy]
    after = finished()
    if each_server.config.http_server == "hypercorn":
        return  # it reads no more from a connection while a pipelined request waits: the close goes unseen
    assert after.get("length", 0) == before.get("length", 0), "the running generation went on to its end"
