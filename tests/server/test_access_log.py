"""The access log: one line per finished request with what the engine did for it, as text and as
JSON (--log-format json); errors carry their message; --disable-log-requests turns it off."""
from __future__ import annotations

import json
import logging
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from bench.serving.core.server import prelude_env
from prelude.contract.config import Config
from prelude.app.logs import JsonFormatter
from tests.server.harness import ServerThread

TEXT = re.compile(r"(?P<request_id>\S+) (?P<method>[A-Z]+) (?P<route>\S+) (?P<status>\d{3}) (?P<cls>\S+) "
                  r"prompt=(?P<prompt>\d+) completion=(?P<completion>\d+) cached=(?P<cached>\d+) "
                  r"queue=(?P<queue>\S+) ttft=(?P<ttft>\S+) total=(?P<total>[0-9.]+ms)(?: error=(?P<error>.*))?$")


@pytest.fixture
def logged_server(demo_model, caplog):
    caplog.set_level(logging.INFO, logger="prelude.access")  # before the app is built: it checks the level
    with ServerThread(Config(model=str(demo_model), block_size=4, num_kv_blocks=512, max_model_len=256,
                             api_key="k")) as srv:
        yield srv


def access_records(caplog, count: int, timeout: float = 10) -> list[logging.LogRecord]:
    """The access records, once `count` of them arrived (a line is logged after the response)."""
    deadline = time.monotonic() + timeout
    while True:
        records = [r for r in caplog.records if r.name == "prelude.access"]
        if len(records) >= count or time.monotonic() > deadline:
            return records
        time.sleep(0.02)


def test_one_line_per_request_with_engine_fields(logged_server, caplog):
    url, auth = logged_server.base_url, {"Authorization": "Bearer k"}
    prompt = "the model token request server prompt judge score"
    httpx.post(url + "/v1/completions", headers=auth, json={"prompt": prompt, "max_tokens": 1}).raise_for_status()
    httpx.post(url + "/v1/completions", headers=auth,
               json={"prompt": prompt, "max_tokens": 4, "ignore_eos": True, "stream": True}).raise_for_status()
    httpx.post(url + "/v1/embeddings", headers=auth, json={"input": ["a b", "c d"]}).raise_for_status()
    bad = httpx.post(url + "/v1/completions", headers=auth, json={"prompt": prompt, "max_tokens": -1})
    unauthorized = httpx.post(url + "/v1/completions", json={"prompt": prompt})
    httpx.get(url + "/health"), httpx.get(url + "/ready"), httpx.get(url + "/metrics")  # probes: not logged
    assert bad.status_code == 400 and unauthorized.status_code == 401
    records = access_records(caplog, 5)
    lines = [TEXT.match(str(r.msg)) for r in records]
    assert all(lines), [str(r.msg) for r in records]
    oneshot, decode, embed, error, refused = (m.groupdict() for m in lines)

    assert oneshot["request_id"].startswith("cmpl-") and oneshot["route"] == "/v1/completions"
    assert (oneshot["status"], oneshot["cls"], oneshot["completion"]) == ("200", "OneShot", "1")
    assert int(oneshot["prompt"]) > 5 and oneshot["queue"].endswith("ms") and oneshot["ttft"].endswith("ms")
    # The second request shares the first one's prompt: its full blocks come from the prefix cache.
    assert decode["cls"] in ("Decode", "Mixed") and decode["completion"] == "4" and int(decode["cached"]) > 0
    assert embed["request_id"].startswith("embd-") and embed["cls"] == "OneShot" and embed["prompt"] == "4"
    assert error["status"] == "400" and "max_tokens" in json.loads(error["error"])
    assert error["request_id"] == "-" and error["queue"] == "-"
    assert refused["status"] == "401" and "API key" in json.loads(refused["error"])

    # The same record as JSON: every field a key, numbers as numbers.
    as_json = json.loads(JsonFormatter().format(records[1]))
    assert as_json["event"] == "request" and as_json["level"] == "INFO" and as_json["logger"] == "prelude.access"
    assert as_json["request_id"] == decode["request_id"] and as_json["route"] == "/v1/completions"
    assert as_json["status"] == 200 and as_json["class"] == decode["cls"]
    assert as_json["prompt_tokens"] == int(decode["prompt"]) and as_json["completion_tokens"] == 4
    assert as_json["cached_tokens"] == int(decode["cached"])
    assert as_json["queue_ms"] >= 0 and as_json["ttft_ms"] > 0 and as_json["total_ms"] >= as_json["ttft_ms"]
    assert as_json["error"] is None


def _accepting(path: Path) -> bool:
    """Whether a server accepts connections on the Unix socket at `path`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def test_json_log_format_and_disable_log_requests_end_to_end(demo_model, tmp_path):
    """`python -m prelude --log-format json`: every stderr line is a JSON object, the banner and
    the access lines among them; with --disable-log-requests no access line at all. (On a Unix
    socket of its own: a TCP port found free could be taken before the server binds it.)"""
    for disabled in (False, True):
        uds = tmp_path / f"prelude-{disabled}.sock"
        args = [sys.executable, "-m", "prelude", "--model", str(demo_model), "--uds", str(uds),
                "--log-format", "json", *(["--disable-log-requests"] if disabled else [])]
        proc = subprocess.Popen(args, env=prelude_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while not _accepting(uds):  # (httpx leaks the socket of a refused Unix connect)
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
            with httpx.Client(transport=httpx.HTTPTransport(uds=str(uds)), base_url="http://prelude") as http:
                while http.get("/ready").status_code != 200:
                    assert proc.poll() is None and time.monotonic() < deadline
                    time.sleep(0.1)
                out = http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2})
                assert out.status_code == 200
                http.post("/v1/completions", json={"prompt": ""})
        finally:
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
        lines = [json.loads(line) for line in err.splitlines()]  # each line parses, or this raises
        (banner,) = [line for line in lines if line.get("event") == "ready"]
        assert banner["version"] and banner["architecture"] == "Qwen3ForCausalLM"
        # its bf16 weights, served in fp32, kept in bf16 (its head too on AMX) unless the kernels are not built
        assert banner["dtype"] in ("float32", "float32, weights bf16x2", "float32, weights bf16x2/bfloat16")
        assert banner["device"] == "cpu" and banner["tokenizer"] == "fasttoken" and banner["prefix_caching"] is True
        assert banner["kv_capacity_tokens"] > 0 and banner["listen_url"] == f"unix:{uds}"
        assert banner["seconds_to_ready"] > 0
        requests = [line for line in lines if line.get("event") == "request"]
        if disabled:
            assert requests == []
        else:
            ok, bad = requests
            assert ok["status"] == 200 and ok["completion_tokens"] == 2 and ok["class"] in ("Decode", "Mixed")
            assert bad["status"] == 400 and "prompt" in bad["error"]


def test_total_ends_when_the_response_is_complete(caplog):
    """hypercorn may suspend a response's last send until its connection has closed (a refusal
    that left its body unread, under 1,000 connections: 160 ms at P50). The bytes were written
    before that wait; the logged total must not count it."""
    import asyncio

    from prelude.server.access_log import AccessLog

    async def refusal(scope, receive, send):
        await send({"type": "http.response.start", "status": 503, "headers": []})
        await send({"type": "http.response.body", "body": b'{"error": {"message": "full"}}'})

    async def send_then_wait_for_close(message):
        if message["type"] == "http.response.body":
            await asyncio.sleep(0.5)

    fields = _logged_fields(caplog, AccessLog(refusal), send_then_wait_for_close)
    assert fields["status"] == "503" and float(fields["total"][:-2]) < 250


def _logged_fields(caplog, app, send) -> dict:
    """The access-log fields of one request to `app` (an AccessLog) that sends through `send`."""
    import asyncio

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    caplog.set_level(logging.INFO, logger="prelude.access")
    scope = {"type": "http", "method": "POST", "path": "/v1/score", "headers": []}
    asyncio.run(app(scope, receive, send))
    return TEXT.search(access_records(caplog, 1)[0].getMessage()).groupdict()


def test_a_request_the_client_left_keeps_its_reason(caplog):
    """A whole answer's client gone: the router marks the entry and answers an empty 499, whose
    empty body then replaced the reason with error=""."""
    from prelude.server import access_log
    from prelude.server.access_log import AccessLog

    async def left(scope, receive, send):
        scope[access_log.SCOPE_KEY].error = "client went away"
        await send({"type": "http.response.start", "status": 499, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def send(message):
        pass

    fields = _logged_fields(caplog, AccessLog(left), send)
    assert fields["status"] == "499" and json.loads(fields["error"]) == "client went away"


def test_the_logged_id_is_the_response_id(logged_server, caplog):
    """/v2/embed and /v2/rerank answered with an id other than the one their log line carried
    (each made a second id for the response), so a client's id could not be found in the log."""
    url, auth = logged_server.base_url, {"Authorization": "Bearer k"}
    answers = [httpx.post(url + "/v2/embed", headers=auth, json={"texts": ["a b"], "input_type": "search_query"}),
               httpx.post(url + "/v2/rerank", headers=auth, json={"query": "q", "documents": ["a", "b"]}),
               httpx.post(url + "/v1/rerank", headers=auth, json={"query": "q", "documents": ["a", "b"]})]
    logged = [TEXT.match(str(r.msg))["request_id"] for r in access_records(caplog, len(answers))]
    assert logged == [a.json()["id"] for a in answers]


def test_a_stream_the_client_left_is_logged_with_its_id(logged_server, caplog):
    """A stream closed by its client mid-answer was logged as 200 with no request id and no
    tokens: it could not be told from a success, nor found by the id the client had seen."""
    url, auth = logged_server.base_url, {"Authorization": "Bearer k"}
    body = {"prompt": "a long answer", "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", headers=auth, json=body) as response:
        first = next(line for line in response.iter_lines() if line.startswith("data: "))
    seen_id = json.loads(first[6:])["id"]
    fields = TEXT.match(str(access_records(caplog, 1)[0].msg)).groupdict()
    assert fields["request_id"] == seen_id and json.loads(fields["error"]) == "client went away"
    # and what it had computed until then (it said prompt=0 completion=0), and how it went (queue
    # and TTFT said "-": a client that timed out waiting is when they matter most)
    assert int(fields["prompt"]) > 0 and int(fields["completion"]) >= 1
    assert fields["cls"] == "Decode" and fields["queue"].endswith("ms") and fields["ttft"].endswith("ms")
    logged_server.wait_idle()


def test_prompt_tokens_count_once_per_prompt_whatever_n(logged_server, caplog):
    """usage counts a prompt's tokens once however many choices it has; the log line must agree
    (it counted them once per choice: n=3 logged three times the usage's prompt tokens)."""
    url, auth = logged_server.base_url, {"Authorization": "Bearer k"}
    usages = []
    for body in ({"prompt": ["one two three", "four five"], "n": 3, "max_tokens": 2, "temperature": 1},
                 {"prompt": "one two three", "n": 3, "max_tokens": 2, "stream": True,
                  "stream_options": {"include_usage": True}},
                 {"messages": [{"role": "user", "content": "hi there"}], "n": 2, "max_tokens": 2}):
        route = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        response = httpx.post(url + route, headers=auth, json={"ignore_eos": True, **body}, timeout=60)
        response.raise_for_status()
        if body.get("stream"):
            chunks = [json.loads(line[6:]) for line in response.text.splitlines()
                      if line.startswith("data: {")]
            usages.append(chunks[-1]["usage"])
        else:
            usages.append(response.json()["usage"])
    lines = [TEXT.match(str(r.msg)).groupdict() for r in access_records(caplog, 3)]
    assert [int(line["prompt"]) for line in lines] == [u["prompt_tokens"] for u in usages]
    assert [int(line["completion"]) for line in lines] == [u["completion_tokens"] for u in usages]


def test_a_whole_answer_the_client_left_is_logged_with_its_tokens(logged_server, caplog):
    """A non-streamed request whose client left mid-answer: 499 with the tokens computed until
    the abort (they were logged as prompt=0 completion=0: the rows' outputs never reached the
    endpoint)."""
    url = logged_server.base_url
    body = json.dumps({"prompt": "a long answer", "max_tokens": 200, "ignore_eos": True}).encode()
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as conn:
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.monotonic() + 30
        while _generated(url) < 1 and time.monotonic() < deadline:
            time.sleep(0.005)
    fields = TEXT.match(str(access_records(caplog, 1)[0].msg)).groupdict()
    assert fields["status"] == "499" and json.loads(fields["error"]) == "client went away"
    assert int(fields["prompt"]) > 0 and 1 <= int(fields["completion"]) < 200
    assert fields["cls"] == "Decode" and fields["queue"].endswith("ms") and fields["ttft"].endswith("ms")
    logged_server.wait_idle()


def _generated(url: str) -> float:
    metrics = httpx.get(url + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("vllm:generation_tokens_total"))


def test_a_stream_an_engine_error_ended_is_logged_with_its_tokens(logged_server, caplog):
    """A stream the engine ended mid-answer (here its grammar failed after a token; a drain's
    timeout ends streams the same way) was logged with prompt=0 completion=0."""
    url, auth = logged_server.base_url, {"Authorization": "Bearer k"}
    body = {"prompt": "x", "max_tokens": 20, "temperature": 0, "stream": True, "guided_regex": "(y{1000}){1000}"}
    response = httpx.post(url + "/v1/completions", headers=auth, json=body, timeout=60)
    assert '"error"' in response.text
    fields = TEXT.match(str(access_records(caplog, 1)[0].msg)).groupdict()
    assert "grammar failed" in json.loads(fields["error"])
    assert int(fields["prompt"]) > 0 and int(fields["completion"]) >= 1
    # and how it went (class, queue and TTFT said "-", as a drain's timeout logged them)
    assert fields["cls"] == "Decode" and fields["queue"].endswith("ms") and fields["ttft"].endswith("ms")
    logged_server.wait_idle()


def test_a_stream_the_client_left_while_queued_is_logged_with_its_wait(logged_server, caplog):
    """A stream whose client gave up while it waited (here behind a held step): logged 200 with
    no class, no prompt and no queue time, where the same request unstreamed was a 499 with all
    three."""
    from tests.server.test_admission import Gate, _wait_for

    srv, auth = logged_server, {"Authorization": "Bearer k"}
    gate = Gate(srv.engine.executors)
    srv.on_loop(lambda: setattr(srv.engine, "executors", gate))
    try:
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(httpx.post, srv.base_url + "/v1/completions", headers=auth, timeout=60,
                               json={"prompt": "held", "max_tokens": 1})
            _wait_for(srv, lambda: bool(srv.engine._in_flight))
            body = {"prompt": "a queued answer", "max_tokens": 20, "stream": True}
            with httpx.stream("POST", srv.base_url + "/v1/completions", headers=auth, json=body) as queued:
                assert queued.status_code == 200
                _wait_for(srv, lambda: srv.engine.scheduler.num_waiting == 1)
                time.sleep(0.1)
            records = [TEXT.match(str(r.msg)).groupdict() for r in access_records(caplog, 1)]
            gate.open.set()
            held.result()
    finally:
        gate.open.set()
        srv.on_loop(lambda: setattr(srv.engine, "executors", gate.executors))
    (waited,) = records
    assert json.loads(waited["error"]) == "client went away" and waited["completion"] == "0"
    assert waited["cls"] == "Decode" and int(waited["prompt"]) > 0 and float(waited["queue"][:-2]) >= 100
    srv.wait_idle()


def test_a_refused_request_is_logged_by_the_clients_id(logged_server, caplog):
    """A 400, a 404 for another model and a 401 carry the client's X-Request-Id in their line:
    they were logged as "-", and failed requests are the ones looked up by the client's id."""
    url, auth = logged_server.base_url, {"Authorization": "Bearer k"}
    sent = [("trace-400", "/v1/completions", auth, {"model": logged_server.served.name}),
            ("trace-404", "/v1/completions", auth, {"model": "other", "prompt": "hi"}),
            ("trace-401", "/v1/completions", {}, {"prompt": "hi"})]
    for rid, path, headers, body in sent:
        response = httpx.post(url + path, headers={**headers, "x-request-id": rid}, json=body)
        assert response.status_code == int(rid[-3:]) and response.headers["x-request-id"] == rid
    lines = [TEXT.match(str(r.msg)).groupdict() for r in access_records(caplog, len(sent))]
    assert [(line["request_id"], line["status"]) for line in lines] == [(rid, rid[-3:]) for rid, *_ in sent]
