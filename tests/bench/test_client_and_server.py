"""The load generator's I/O edges: SSE and error parsing, CPU accounting, and the server
launcher (against a stand-in server script, so no model is loaded)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

from bench.serving.core import proc
from bench.serving.core.client import DONE, error_message, parse_sse_line
from bench.serving.core.loadgen import shapes, split_server_args
from bench.serving.core.server import ServerError, ServerProcess

FAKE_SERVER = """
import http.server, signal, sys
# Its own SIGINT handling, as real servers have: started from a background shell, a process
# inherits SIGINT ignored, and Python then installs no KeyboardInterrupt.
signal.signal(signal.SIGINT, signal.default_int_handler)
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
port = int(sys.argv[sys.argv.index("--port") + 1])
print("flags:", " ".join(sys.argv[1:]), flush=True)
server = http.server.HTTPServer(("127.0.0.1", port), Handler)
try:
    server.serve_forever()
except KeyboardInterrupt:
    print("clean shutdown", flush=True)
"""


def test_parse_sse_line():
    assert parse_sse_line('data: {"choices": []}') == {"choices": []}
    assert parse_sse_line("data:[DONE]") is DONE
    assert parse_sse_line("") is None and parse_sse_line(": keep-alive") is None
    assert parse_sse_line("event: message") is None


def test_error_message_shapes():
    assert error_message(400, '{"error": {"message": "bad prompt", "type": "x"}}') == "HTTP 400: bad prompt"
    assert error_message(400, '{"message": "vllm style"}') == "HTTP 400: vllm style"
    assert error_message(404, "Not Found") == "HTTP 404: Not Found"
    assert len(error_message(500, "x" * 1000)) < 220


def test_cli_helpers():
    assert split_server_args(["--qps", "2", "--", "--executor", "null"]) == (["--qps", "2"], ["--executor", "null"])
    assert split_server_args(["--qps", "2"]) == (["--qps", "2"], [])
    assert shapes("128/1,512/1,128/32") == [(128, 1), (512, 1), (128, 32)]


def test_parse_proc_stat_with_awkward_command_names():
    fields = " ".join(str(i) for i in range(3, 53))  # field n holds n, from state (3) on
    ppid, seconds = proc.parse_stat(f"4242 (odd) name (x)) {fields}")
    assert ppid == 4
    assert seconds == pytest.approx((14 + 15) / os.sysconf("SC_CLK_TCK"))


@pytest.mark.skipif(not proc.available(), reason="needs /proc")
def test_cpu_seconds_of_this_process_grows_with_work():
    before = proc.cpu_seconds(os.getpid(), tree=False)
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    assert proc.cpu_seconds(os.getpid()) >= before + 0.03
    assert proc.cpu_seconds(2**22 + 7) is None  # no such pid


@pytest.mark.skipif(not proc.available(), reason="needs /proc")
def test_another_process_cpu_is_read_to_the_nanosecond_not_the_tick():
    """A child that worked ~0.13 s reports its own CPU clock, then waits: the reading from outside
    agrees within 2 ms (/proc's stat would truncate it to 10 ms ticks)."""
    code = ("import sys, time\nend = time.process_time() + 0.13\nwhile time.process_time() < end: pass\n"
            "print(time.process_time(), flush=True)\nsys.stdin.readline()\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        own = float(child.stdout.readline())
        seen = proc.cpu_seconds(child.pid)
        assert proc.process_clock_seconds(child.pid) is not None
        assert seen == pytest.approx(own, abs=0.002)
    finally:
        child.communicate("\n", timeout=10)


def test_server_process_starts_serves_and_stops_cleanly(tmp_path):
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    server = ServerProcess(["--flag", "x"], [sys.executable, str(script)], log_path=tmp_path / "fake.log",
                           label="fake")
    with server:
        assert server.startup_s is not None and server.startup_s > 0
        assert httpx.get(server.base_url + "/health").status_code == 200
    assert server.proc.returncode == 0
    log = server.log_path.read_text()
    assert f"flags: --flag x --host 127.0.0.1 --port {server.port}" in log and "clean shutdown" in log


def test_server_process_that_dies_reports_its_log(tmp_path):
    server = ServerProcess([], [sys.executable, "-c", "import sys; print('no such model'); sys.exit(2)"],
                           log_path=tmp_path / "dead.log", label="dead")
    with pytest.raises(ServerError, match="no such model"):
        server.start(timeout=30)


def test_a_server_whose_port_was_taken_first_is_started_again_on_another(tmp_path):
    """free_port's port may be bound by another process before the server binds it: the server
    exits saying so, and is started again on another port."""
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    taken = tmp_path / "taken"
    first_port_taken = (f"import pathlib, runpy, sys\nmarker = pathlib.Path({str(taken)!r})\n"
                        "if not marker.exists():\n    marker.touch()\n"
                        "    print('OSError: [Errno 98] Address already in use'); sys.exit(1)\n"
                        f"runpy.run_path({str(script)!r}, run_name='__main__')\n")
    server = ServerProcess([], [sys.executable, "-c", first_port_taken], log_path=tmp_path / "s.log", label="fake")
    with server:
        assert taken.exists()  # the first start found its port taken
        assert httpx.get(server.base_url + "/health").status_code == 200


def test_a_running_server_is_not_started_twice(tmp_path):
    """A second start would spawn a process that finds the port taken while the first, no longer
    referenced, outlived the benchmark (this file's SIGTERM test once did that, and left a server
    behind on every run)."""
    from bench.serving.core.server import ServerError, ServerProcess

    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    server = ServerProcess([], [sys.executable, str(script)], log_path=tmp_path / "s.log", label="fake")
    with server:
        first = server.pid
        with pytest.raises(ServerError, match="already running"):
            server.start(timeout=30)
        assert server.pid == first
    assert server.proc is not None and server.proc.poll() is not None


def test_a_benchmark_stopped_by_sigterm_stops_its_server(tmp_path):
    """`timeout` stops a benchmark with SIGTERM: its server (in a session of its own, out of
    reach of that signal) must not be left running."""
    import signal
    import subprocess

    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    bench = tmp_path / "bench.py"
    bench.write_text(f"""
import sys, time
from pathlib import Path
sys.path.insert(0, {str(os.getcwd())!r})
from bench.serving.core.server import ServerProcess
server = ServerProcess([], [sys.executable, {str(script)!r}], log_path=Path({str(tmp_path / "s.log")!r}), label="fake")
with server:  # a benchmark's usual shape: the server is stopped on the way out
    print(server.pid, flush=True)
    time.sleep(60)
""")
    with subprocess.Popen([sys.executable, str(bench)], stdout=subprocess.PIPE, text=True) as benchmark:
        server_pid = int(benchmark.stdout.readline())
        benchmark.send_signal(signal.SIGTERM)
        assert benchmark.wait(30) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(server_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(server_pid, signal.SIGKILL)
        pytest.fail("the server outlived its benchmark")
    assert "clean shutdown" in (tmp_path / "s.log").read_text()


SSE_SERVER = """
import http.server, sys, time
connections = []  # one entry per connection a stream came on
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = str(len(set(connections))).encode() if self.path == "/connections" else b""
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        connections.append(self.client_address)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in (b'data: {"choices": [{"text": "a"}]}\\n\\n', b"data: [DONE]\\n\\n"):
            self.wfile.write(b"%x\\r\\n%s\\r\\n" % (len(event), event))
            self.wfile.flush()
        if self.path == "/open-after-done":  # a server that leaves the body open
            time.sleep(30)
        self.wfile.write(b"0\\r\\n\\r\\n")
    def log_message(self, *args):
        pass
port = int(sys.argv[sys.argv.index("--port") + 1])
http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def test_streamed_requests_keep_their_connection_and_a_body_left_open_does_not_hold_the_client(tmp_path):
    """After [DONE] the client reads the body's end, as OpenAI's client does: a stream left
    unread would close its connection and the next request would connect, a cost no real
    client's server pays. A server that never ends the body holds it at most DRAIN_TIMEOUT_S."""
    import asyncio

    from bench.serving.core.client import DRAIN_TIMEOUT_S, ClientPool
    from bench.serving.core.workloads import Job

    script = tmp_path / "sse_server.py"
    script.write_text(SSE_SERVER)

    async def streams(base_url: str, path: str, count: int) -> list:
        async with ClientPool(base_url, 1, 60.0) as pool:
            return [await pool.send(Job(path, b"{}", True, 1, 1)) for _ in range(count)]

    with ServerProcess([], [sys.executable, str(script)], log_path=tmp_path / "s.log", label="sse") as server:
        records = asyncio.run(streams(server.base_url, "/v1/completions", 3))
        assert all(r.ok and r.output_tokens == 1 for r in records)
        assert httpx.get(server.base_url + "/connections").text == "1"
        started = time.perf_counter()
        [record] = asyncio.run(streams(server.base_url, "/open-after-done", 1))
        assert record.ok and time.perf_counter() - started < DRAIN_TIMEOUT_S + 5
