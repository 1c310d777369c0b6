"""Cooperative preemption end to end on the demo model: a long embedding parked for a short one
gives, like the short one, the vector it gets alone (the runner re-plans its attention after the
short step ran; tests/executor/test_fused_step.py checks the native resumable forward). When a
long step steps aside, and for what, is checked in simulated time in
tests/engine/test_layer_preemption.py."""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from prelude.contract.config import Config
from tests.server.harness import ServerThread

LONG = [(j * 13) % 500 + 3 for j in range(6000)]
SHORT = [(j * 7) % 500 + 3 for j in range(24)]


async def _until(srv: ServerThread, condition) -> None:
    """Polls `condition` on the server's loop until it holds (30 s at most)."""
    deadline = time.monotonic() + 30
    while not srv.on_loop(condition):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.002)


def _embedding(response: httpx.Response) -> list[float]:
    assert response.status_code == 200, response.text
    return response.json()["data"][0]["embedding"]


def test_a_parked_long_embedding_and_the_short_one_equal_their_results_alone(demo_model):
    config = Config(model=str(demo_model), num_kv_blocks=64, max_model_len=8192, allow_long_max_model_len=True)
    with ServerThread(config) as srv:
        alone_long = _embedding(httpx.post(srv.base_url + "/v1/embeddings", json={"input": [LONG]}, timeout=120))
        alone_short = _embedding(httpx.post(srv.base_url + "/v1/embeddings", json={"input": [SHORT]}))

        async def together() -> tuple[httpx.Response, httpx.Response]:
            async with httpx.AsyncClient(base_url=srv.base_url, timeout=120) as client:
                long = asyncio.create_task(client.post("/v1/embeddings", json={"input": [LONG]}))
                await _until(srv, lambda: srv.engine.steps.long_step.in_flight)
                short = await client.post("/v1/embeddings", json={"input": [SHORT]})
                return await long, short

        long, short = asyncio.run(together())
        preemptions = srv.engine.snapshot().layer_preemptions
        srv.wait_idle()
    assert preemptions >= 1, "the long step was never parked: nothing was tested"
    assert _embedding(long) == pytest.approx(alone_long, abs=1e-5)
    assert _embedding(short) == pytest.approx(alone_short, abs=1e-5)
