"""Idle keep-alive connections: the server keeps one open longer than client pools keep theirs
(httpx and the OpenAI client expire an idle connection after 5 s), so a client never sends a
request on a connection the server is closing at that moment, which fails before reaching it.
--keep-alive-timeout sets how long. And pipelined requests on one connection are answered in
order, each with its own response."""
from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

import pytest

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


@pytest.mark.slow  # waits out the 5 s expiry in real time, once per --http-server
def test_a_connection_idle_past_a_client_pools_expiry_still_serves(each_server):
    with _connect(each_server.base_url) as sock:
        assert _exchange(sock).startswith(b"HTTP/1.1 200")
        time.sleep(5.5)  # past httpx's keepalive_expiry and uvicorn's timeout (both 5 s)
        assert _exchange(sock).startswith(b"HTTP/1.1 200")


def test_keep_alive_timeout_closes_an_idle_connection(demo_model, http_server):
    config = Config(model=str(demo_model), keep_alive_timeout=0.5, http_server=http_server)
    with ServerThread(config) as srv, _connect(srv.base_url) as sock:
        assert _exchange(sock).startswith(b"HTTP/1.1 200")
        sock.settimeout(5)  # recv raises if the server has not closed it by then
        assert sock.recv(1) == b""  # the server closed it


def test_keep_alive_timeout_closes_a_silent_or_stalled_connection(demo_model, http_server):
    """A connection that never sends a request, or stops in its head, is closed as an idle one
    is (uvicorn kept both open for good: they piled up to the open-file limit)."""
    config = Config(model=str(demo_model), keep_alive_timeout=0.5, http_server=http_server)
    with ServerThread(config) as srv, _connect(srv.base_url) as silent, _connect(srv.base_url) as stalled:
        stalled.sendall(b"GET /health HTTP/1.1\r\nHost: te")
        for sock in (silent, stalled):
            sock.settimeout(5)  # recv raises if the server has not closed it by then
            data = sock.recv(1024)
            while data and not data.endswith(b"\r\n\r\n") and b"\r\n\r\n" not in data:
                data += sock.recv(1024)  # hypercorn answers the stalled one 408 first
            assert data == b"" or data.startswith(b"HTTP/1.1 408")


def test_a_head_past_the_bound_is_refused_431(demo_model, http_server):
    """A request whose headers never end is refused at 64 KiB (uvicorn buffered it whole, 100 MB a
    connection); hypercorn's own bound is 16 KiB. The server serves on."""
    with ServerThread(Config(model=str(demo_model), http_server=http_server)) as srv:
        with _connect(srv.base_url) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\nX-Big: ")
            answer = b""
            try:
                for _ in range(64):  # 4 MiB at most
                    sock.sendall(b"a" * 65536)
            except OSError:  # the server closed the connection after its answer
                pass
            while chunk := sock.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 431"), answer[:100]
        with _connect(srv.base_url) as sock:
            assert _exchange(sock).startswith(b"HTTP/1.1 200")


def _post(path: str, body: dict) -> bytes:
    payload = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: test\r\ncontent-type: application/json\r\n"
            f"content-length: {len(payload)}\r\n\r\n").encode() + payload


def _read_response(reader) -> tuple[int, bytes]:
    """(status, body) of the next response on a buffered reader of the connection."""
    status = int(reader.readline().split()[1])
    length = 0
    while (line := reader.readline().strip()):
        name, _, value = line.partition(b":")
        length = int(value) if name.lower() == b"content-length" else length
    return status, reader.read(length)


def test_pipelined_requests_are_answered_in_order(each_server):
    """Three requests written at once, before any answer: a generation (slowest), a probe the
    server answers at once, and a tokenization. Each answer comes back in the order asked."""
    requests = (_post("/v1/completions", {"prompt": "hello", "max_tokens": 8, "ignore_eos": True})
                + HEALTH + _post("/tokenize", {"prompt": "hello"}))
    with _connect(each_server.base_url) as sock, sock.makefile("rb") as reader:
        sock.sendall(requests)
        answers = [_read_response(reader) for _ in range(3)]
    assert [status for status, _ in answers] == [200, 200, 200]
    assert json.loads(answers[0][1])["usage"]["completion_tokens"] == 8
    assert answers[1][1] == b""
    assert json.loads(answers[2][1])["tokens"]


def test_a_head_pipelined_behind_a_large_body_is_read_as_a_head(demo_model, http_server):
    """The read that ended a 70 KB body and began the next head was counted as head: the next
    request got 431, and the first one's answer was lost."""
    first = _post("/tokenize", {"prompt": "hello " * 12_000})
    with ServerThread(Config(model=str(demo_model), http_server=http_server)) as srv, \
            _connect(srv.base_url) as sock, sock.makefile("rb") as reader:
        sock.sendall(first + HEALTH[:20])
        time.sleep(0.3)
        sock.sendall(HEALTH[20:])
        answers = [_read_response(reader) for _ in range(2)]
    assert [status for status, _ in answers] == [200, 200]


def test_a_head_too_large_behind_a_running_request_is_refused_after_its_answer(each_server):
    """The 431 went out at once and closed the connection: the running request's answer was
    lost. Answers go in order (RFC 9112): the running one's, then the refusal."""
    generation = _post("/v1/completions", {"prompt": "hello", "max_tokens": 500, "ignore_eos": True})
    with _connect(each_server.base_url) as sock, sock.makefile("rb") as reader:
        sock.sendall(generation + b"GET /health HTTP/1.1\r\nHost: test\r\nX-Big: " + b"a" * 40_000)
        time.sleep(0.05)  # the head goes on arriving while the generation runs
        sock.sendall(b"a" * 70_000)
        status, body = _read_response(reader)
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 500
        assert _read_response(reader)[0] == 431


def test_a_stalled_pipelined_head_does_not_cut_the_running_stream(demo_model, http_server):
    """--keep-alive-timeout was armed by the stalled head behind a running stream, and closed the
    connection under it: the client saw the stream end without an error or [DONE]."""
    config = Config(model=str(demo_model), keep_alive_timeout=0.3, http_server=http_server)
    stream = _post("/v1/completions", {"prompt": "hello", "max_tokens": 3000, "ignore_eos": True, "stream": True})
    with ServerThread(config) as srv, _connect(srv.base_url) as sock:
        sock.sendall(stream + HEALTH[:20])
        sock.settimeout(30)
        data = b""
        while b"data: [DONE]" not in data and (chunk := sock.recv(65536)):
            data += chunk
    assert b"data: [DONE]" in data


@pytest.mark.parametrize(("api_key", "path", "status"), [("key", "/v1/completions", 401), (None, "/v1/nope", 404)])
def test_an_answer_given_before_the_body_is_read_keeps_the_connection(demo_model, http_server, api_key, path,
                                                                      status):
    """A 401 (or a 404) answered before the body's second write arrived: hypercorn closed the
    kept-alive connection, and a pooled client's next request on it failed with a read error."""
    request = _post(path, {"prompt": "hello", "max_tokens": 1})
    head, _, body = request.partition(b"\r\n\r\n")
    config = Config(model=str(demo_model), api_key=api_key, http_server=http_server)
    with ServerThread(config) as srv, _connect(srv.base_url) as sock, sock.makefile("rb") as reader:
        sock.sendall(head + b"\r\n\r\n")
        time.sleep(0.2)  # the answer is written before the body comes
        sock.sendall(body)
        assert _read_response(reader)[0] == status
        sock.sendall(HEALTH)
        assert _read_response(reader)[0] == 200
