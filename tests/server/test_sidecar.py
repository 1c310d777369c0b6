"""Sidecar deployment: serving on a Unix domain socket (`--uds`), and readiness that waits for
the engine's warm-up so a Kubernetes readiness probe never routes to a cold server."""
from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai

from bench.serving.core.server import prelude_env
from prelude.contract.config import Config
from tests.server.harness import ServerThread


def wait_ready(http: httpx.Client, path: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    """Polls until the socket accepts (probed with plain sockets: httpcore leaks the socket of a
    refused UDS connect), then until /ready answers 200."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, "the server exited"
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(path)
            except OSError:
                pass
            else:
                if http.get("/ready").status_code == 200:
                    return
        assert time.monotonic() < deadline, f"not ready over the socket within {timeout} s"
        time.sleep(0.1)


def test_openai_sdk_over_a_unix_domain_socket(tmp_path, demo_model, http_server):
    path = str(tmp_path / "prelude.sock")
    proc = subprocess.Popen([sys.executable, "-m", "prelude", "--model", str(demo_model), "--uds", path,
                             "--served-model-name", "prelude-demo", "--http-server", http_server],
                            env=prelude_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=path), base_url="http://prelude", timeout=30) as http:
            wait_ready(http, path, proc)
            client = openai.OpenAI(base_url="http://prelude/v1", api_key="unused", http_client=http,
                                   max_retries=0)
            out = client.completions.create(model="prelude-demo", prompt="Hello", max_tokens=3, temperature=0)
            assert out.usage.completion_tokens == 3
            assert client.models.list().data[0].id == "prelude-demo"
            # any user may connect, as to uvicorn's: the application's container runs as another
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o666
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert f"listening  unix:{path}" in err  # the banner names the socket
    assert not os.path.exists(path), "the socket file is removed on exit"


def test_a_second_server_on_a_live_socket_refuses_to_start(tmp_path, demo_model, http_server):
    """The socket of a running server is not a stale file: a second server given the same --uds
    exits 2 naming it, and the first stays reachable (it used to be unlinked and replaced, the
    first server left running where no client could reach it)."""
    path = str(tmp_path / "prelude.sock")
    args = [sys.executable, "-m", "prelude", "--model", str(demo_model), "--uds", path, "--http-server", http_server]
    first = subprocess.Popen(args, env=prelude_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=path), base_url="http://prelude", timeout=30) as http:
            wait_ready(http, path, first)
            second = subprocess.run(args, env=prelude_env(), capture_output=True, text=True, timeout=60)
            assert second.returncode == 2, second.stderr
            assert f"Unix socket {path} is in use" in second.stderr and "Traceback" not in second.stderr
            assert http.get("/ready").status_code == 200
    finally:
        first.send_signal(signal.SIGINT)
        first.wait(30)


def test_a_file_that_is_not_a_socket_is_left_and_named(tmp_path, demo_model):
    """A regular file at --uds is not ours to remove, nor a running server, as the error said."""
    path = tmp_path / "notes.txt"
    path.write_text("keep me")
    args = [sys.executable, "-m", "prelude", "--model", str(demo_model), "--uds", str(path)]
    run = subprocess.run(args, env=prelude_env(), capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "is not a socket" in run.stderr and "Traceback" not in run.stderr
    assert path.read_text() == "keep me"


def test_an_exit_leaves_a_socket_another_server_bound_since(tmp_path):
    """A start script's `rm -f` of the path, another server bound there, and this one's exit
    removed that server's socket: it ran on, unreachable."""
    from prelude.server.listen import bind

    path = str(tmp_path / "prelude.sock")
    first = bind(Config(uds=path))
    os.unlink(path)
    second = bind(Config(uds=path))
    first.close()
    assert stat.S_ISSOCK(os.stat(path).st_mode), "the second server's socket is gone"
    second.close()
    assert not os.path.exists(path)


def test_ready_answers_503_until_the_warm_up_is_done(demo_model):
    gate = threading.Event()
    srv = ServerThread(Config(model=str(demo_model), num_kv_blocks=256, max_model_len=512), started_at="/health")
    # A warm-up that lasts until the test says (CUDA kernel compilation is the real slow one).
    srv.engine._warmup = lambda: gate.wait(60)
    with srv, ThreadPoolExecutor(1) as pool:
        assert httpx.get(srv.base_url + "/health").status_code == 200  # alive while warming up
        cold = httpx.get(srv.base_url + "/ready")
        assert cold.status_code == 503 and cold.json() == {"status": "warming_up"}
        # A request that arrives anyway waits for the warm-up, then is served.
        early = pool.submit(httpx.post, srv.base_url + "/v1/completions",
                            json={"prompt": "Hello", "max_tokens": 2}, timeout=60)
        time.sleep(0.2)
        assert not early.done()
        gate.set()
        assert early.result().status_code == 200
        assert httpx.get(srv.base_url + "/ready").json() == {"status": "ready"}
