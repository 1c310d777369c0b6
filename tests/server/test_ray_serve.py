"""The Ray Serve recipe (deploy/ray_serve_app.py) on a one-node Ray cluster with two CPU
replicas: Ray's proxy reaches Prelude's own ASGI app in each replica, whose lifespan starts the
engine; completions, streamed chat and embeddings answer, and both replicas run. Ray is not in
the dev extra (about 330 MB with its gRPC stack): `pip install 'prelude[ray]'` to run this."""
from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'prelude[ray]'); the recipe is "
                                        "checked by hand, see docs/deploy.md 'Scale out'")
serve = pytest.importorskip("ray.serve", reason="ray[serve] is not installed (pip install 'prelude[ray]')")

from bench.serving.core.server import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_two_cpu_replicas_behind_ray_serve(monkeypatch):
    monkeypatch.setenv("PRELUDE_ARGS", "--num-kv-blocks 256")
    monkeypatch.setenv("PRELUDE_GPUS", "0")
    monkeypatch.setenv("PRELUDE_REPLICAS", "2")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # a throwaway local cluster
    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False,
             # the replicas import deploy/ (not an installed package) from the checkout
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(
                 p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}})
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        from deploy.ray_serve_app import app

        serve.run(app, blocking=False)
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=60) as http:
            name = http.get("/v1/models").json()["data"][0]["id"]
            r = http.post("/v1/completions", json={"model": name, "prompt": "Hello world", "max_tokens": 4})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
            with http.stream("POST", "/v1/chat/completions", json={
                    "model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                    "stream": True}) as s:
                lines = [line for line in s.iter_lines() if line.startswith("data:")]
            assert lines[-1] == "data: [DONE]" and len(lines) >= 2
            assert http.post("/v1/embeddings", json={"model": name, "input": "hello"}).status_code == 200
        states = serve.status().applications["default"].deployments["PreludeReplica"].replica_states
        assert states.get("RUNNING") == 2
    finally:
        serve.shutdown()
        ray.shutdown()
