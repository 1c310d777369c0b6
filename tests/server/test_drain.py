"""Graceful drain: on SIGTERM the server stops admitting (503, Connection: close), lets in-flight
streams finish with [DONE] (or an error event when --shutdown-timeout cuts them), and exits 0
without a traceback; a second signal exits at once."""
from __future__ import annotations

import json
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from bench.serving.core.server import ServerProcess, prelude_env

STORY = {"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True, "stream": True}


def _stream(url: str, lines: list[str], started: threading.Event, max_tokens: int = 400) -> None:
    with httpx.stream("POST", url + "/v1/completions", json={**STORY, "max_tokens": max_tokens},
                      timeout=60) as response:
        for line in response.iter_lines():
            if line:
                lines.append(line)
                started.set()


def _run_drain(demo_model, extra: list[str], max_tokens: int = 400) -> tuple[list[str], httpx.Response, int, str]:
    server = ServerProcess(["--model", str(demo_model), "--num-kv-blocks", "256", *extra], env=prelude_env())
    with server:
        lines: list[str] = []
        started = threading.Event()
        reader = threading.Thread(target=_stream, args=(server.base_url, lines, started, max_tokens))
        reader.start()
        assert started.wait(30)
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        refused = httpx.post(server.base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        reader.join(60)
        code = server.proc.wait(60)
    return lines, refused, code, server.log_path.read_text()


def test_sigterm_finishes_live_streams_refuses_new_work_and_exits_0(demo_model, http_server):
    # Long enough that the stream still runs when the new request comes (the demo model makes
    # 400 tokens in about 0.1 s: the server had drained and closed, and the request was refused
    # a connection instead of answered 503).
    lines, refused, code, log = _run_drain(demo_model, ["--http-server", http_server], max_tokens=3000)
    assert lines[-1] == "data: [DONE]"
    assert not any('"error"' in line for line in lines)
    assert refused.status_code == 503 and refused.headers["connection"] == "close"
    assert refused.headers["retry-after"] == "1"
    assert code == 0
    assert "Traceback" not in log and "draining" in log


def test_shutdown_timeout_ends_streams_with_an_error_event(demo_model, http_server):
    lines, _, code, log = _run_drain(demo_model, ["--shutdown-timeout", "0.3", "--http-server", http_server],
                                     max_tokens=4000)
    assert '"error"' in lines[-2] and "shut down" in lines[-2] and lines[-1] == "data: [DONE]"
    assert code == 0 and "Traceback" not in log


def test_second_signal_exits_at_once(demo_model, http_server):
    server = ServerProcess(["--model", str(demo_model), "--num-kv-blocks", "256", "--http-server", http_server],
                           env=prelude_env())

    def cut_stream(started: threading.Event) -> None:
        try:
            _stream(server.base_url, [], started, max_tokens=4000)
        except httpx.HTTPError:
            pass  # the point: the server went away mid-stream

    with server:
        started = threading.Event()
        reader = threading.Thread(target=cut_stream, args=(started,), daemon=True)
        reader.start()
        assert started.wait(30)
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        began = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(10)
        assert time.monotonic() - began < 2


def test_shutdown_timeout_answers_a_cut_request_503_with_retry_after(demo_model, http_server):
    """A whole-answer request the shutdown timeout ends was not at fault: 503 with Retry-After
    (another replica may serve it), as a draining server refuses new work; it was a 500."""
    server = ServerProcess(["--model", str(demo_model), "--num-kv-blocks", "256", "--shutdown-timeout", "0.3",
                            "--http-server", http_server], env=prelude_env())
    with server, ThreadPoolExecutor(1) as pool:
        cut = pool.submit(httpx.post, server.base_url + "/v1/completions",
                          json={"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True}, timeout=60)
        deadline = time.monotonic() + 30
        while not _running(server.base_url):
            assert time.monotonic() < deadline and not cut.done()
            time.sleep(0.02)
        server.proc.send_signal(signal.SIGTERM)
        response = cut.result()
        code = server.proc.wait(60)
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert response.json()["error"]["code"] == "shutting_down"
    assert code == 0 and "Traceback" not in server.log_path.read_text()


def _running(url: str) -> bool:
    return any(line.startswith("prelude:num_requests_running{") and not line.endswith(" 0")
               for line in httpx.get(url + "/metrics").text.splitlines())


def _sigterm_mid_body(demo_model, http_server, flags: list[str], rest: bool) -> tuple[bytes, int, str]:
    """A request whose head and first bytes are in when SIGTERM comes; the rest of its body
    follows (`rest`) or never does. Its answer, the exit code and the log."""
    body = b'{"prompt": "Once upon a time", "max_tokens": 8}'
    server = ServerProcess(["--model", str(demo_model), "--num-kv-blocks", "256", "--http-server", http_server,
                            *flags], env=prelude_env())
    with server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body[:10])
            time.sleep(0.5)  # its head is read: the request is in
            server.proc.send_signal(signal.SIGTERM)
            if rest:
                time.sleep(0.3)
                sock.sendall(body[10:])
            answer = _read_response(sock)
        code = server.proc.wait(60)
    return answer, code, server.log_path.read_text()


def test_a_request_whose_body_arrives_after_sigterm_is_still_answered(demo_model, http_server):
    """A request the server had begun to read when the signal came is served, not refused: the
    drain refuses only requests that arrive after it began (it was a 503 once its body came)."""
    answer, code, log = _sigterm_mid_body(demo_model, http_server, [], rest=True)
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert json.loads(payload)["usage"]["completion_tokens"] == 8
    assert code == 0 and "Traceback" not in log


def test_a_body_that_never_arrives_is_answered_503_when_the_drain_times_out(demo_model, http_server):
    """The drain waits for a request whose body is still arriving; past --shutdown-timeout it
    gets the 503 the engine's requests get (a 500 and a logged traceback, when the HTTP server
    ended it)."""
    answer, code, log = _sigterm_mid_body(demo_model, http_server, ["--shutdown-timeout", "0.3"], rest=False)
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503"), head
    assert json.loads(payload)["error"]["code"] == "shutting_down"
    assert code == 0 and "Traceback" not in log


def _read_response(sock: socket.socket) -> bytes:
    """One whole response with a Content-Length body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head = data.partition(b"\r\n\r\n")[0].decode().lower()
    length = int(head.split("content-length:")[1].split("\r\n")[0])
    while len(data.partition(b"\r\n\r\n")[2]) < length:
        data += sock.recv(65536)
    return data
