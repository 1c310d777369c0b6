"""If the engine loop itself dies (a bug), requests fail fast with a 5xx and /health says so,
instead of hanging; if it dies warming up, the server exits."""
from __future__ import annotations

import asyncio

import httpx
import pytest

from prelude.app.assembly import serve
from prelude.contract.config import Config
from prelude.executor.host_runner import HostRunner
from prelude.executor.runner import ModelRunner
from prelude.app.preflight import StartupError
from tests.server.harness import ServerThread


def test_dead_engine_fails_requests_and_health(demo_model):
    def broken_schedule():
        raise RuntimeError("injected scheduler bug")

    with ServerThread(Config(model=str(demo_model), num_kv_blocks=256)) as srv:
        srv.on_loop(lambda: setattr(srv.engine.scheduler, "schedule", broken_schedule))
        response = httpx.post(srv.base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=10)
        assert response.status_code == 500 and "injected scheduler bug" in response.json()["error"]["message"]
        assert httpx.get(srv.base_url + "/health").status_code == 503
        again = httpx.post(srv.base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=10)
        assert again.status_code == 503


def test_a_warm_up_failure_ends_the_server_with_a_startup_error(demo_model, monkeypatch, tmp_path):
    """A server whose engine cannot warm up exits (status 2 from the CLI, a StartupError here)
    instead of answering 503 forever."""
    def broken_warmup(self):
        raise RuntimeError("injected warm-up failure")

    for runner in (ModelRunner, HostRunner):  # the torch runner's, and the native one's (the demo model's)
        monkeypatch.setattr(runner, "warmup", broken_warmup)
    config = Config(model=str(demo_model), num_kv_blocks=256, uds=str(tmp_path / "prelude.sock"), device="cpu")
    with pytest.raises(StartupError, match="warming up"):
        asyncio.run(asyncio.wait_for(serve(config), timeout=60))
