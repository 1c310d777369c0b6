"""Cooperative preemption at layer boundaries (FlowPrefill): a long OneShot step steps aside
between layers while a short request waits. The short request is answered before the long one
finishes (after it without preemption), and both results equal those computed alone."""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from prelude.contract.config import Config
from tests.server.harness import ServerThread

LONG = [(j * 13) % 500 + 3 for j in range(6000)]
SHORT = [(j * 7) % 500 + 3 for j in range(24)]


def _run(srv: ServerThread) -> tuple[list[float], list[float], float, float]:
    """Long embedding, then (once it runs) a short one; their vectors and finishing times."""
    async def timed(client: httpx.AsyncClient, ids: list[int]) -> tuple[dict, float]:
        response = await client.post("/v1/embeddings", json={"input": [ids]})
        return response.json(), time.monotonic()

    async def go():
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=120) as client:
            long_task = asyncio.create_task(timed(client, LONG))
            deadline = time.monotonic() + 30
            while not srv.on_loop(lambda: srv.engine._in_flight):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.005)
            short, short_done = await timed(client, SHORT)
            long, long_done = await long_task
            return long, short, short_done, long_done

    long, short, short_done, long_done = asyncio.run(go())
    return long["data"][0]["embedding"], short["data"][0]["embedding"], short_done, long_done


@pytest.mark.parametrize("preemption", [True, False])
def test_short_request_overtakes_a_long_step_only_with_preemption(demo_model, preemption):
    config = Config(model=str(demo_model), num_kv_blocks=64, max_model_len=8192, layer_preemption=preemption)
    with ServerThread(config) as srv:
        alone_long = httpx.post(srv.base_url + "/v1/embeddings", json={"input": [LONG]}, timeout=120).json()
        alone_short = httpx.post(srv.base_url + "/v1/embeddings", json={"input": [SHORT]}).json()
        long, short, short_done, long_done = _run(srv)
        preemptions = srv.engine.snapshot().layer_preemptions
        srv.wait_idle()
    assert long == pytest.approx(alone_long["data"][0]["embedding"], abs=1e-5)
    assert short == pytest.approx(alone_short["data"][0]["embedding"], abs=1e-5)
    if preemption:
        assert preemptions >= 1 and short_done < long_done
    else:
        assert preemptions == 0 and short_done >= long_done
