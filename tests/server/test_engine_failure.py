"""If the engine loop itself dies (a bug), requests fail fast with a 5xx and /health says so,
instead of hanging."""
from __future__ import annotations

import httpx

from prelude.contract.config import Config
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
