"""Under shortest-job-first a long request still runs while short ones keep coming, over real
HTTP. (The aging bound itself is checked deterministically in tests/engine/test_policies.py.)"""
from __future__ import annotations

import asyncio
import time

import httpx

from prelude.contract.config import Config
from tests.server.harness import ServerThread

STREAM_S = 20.0  # how long short requests keep coming at most


def test_long_request_runs_under_a_stream_of_short_ones(demo_model):
    config = Config(model=str(demo_model), num_kv_blocks=512, scheduling_policy="sjf", max_num_batched_tokens=512)
    with ServerThread(config) as srv:
        async def run() -> tuple[float, int]:
            done = asyncio.Event()
            shorts = 0

            async def short_client(client: httpx.AsyncClient, k: int) -> None:
                nonlocal shorts
                i = 0
                while not done.is_set():
                    ids = [(k * 1000 + i * 7 + j) % 500 + 3 for j in range(32)]
                    response = await client.post("/v1/embeddings", json={"input": [ids]})
                    assert response.status_code == 200
                    shorts += 1
                    i += 1

            async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as client:
                clients = [asyncio.create_task(short_client(client, k)) for k in range(16)]
                await asyncio.sleep(0.5)  # the short stream is flowing
                began = time.monotonic()
                long_ids = [(j * 13) % 500 + 3 for j in range(3000)]
                long_task = asyncio.create_task(client.post("/v1/embeddings", json={"input": [long_ids]}))
                finished, _ = await asyncio.wait([long_task], timeout=STREAM_S)
                waited = time.monotonic() - began
                done.set()
                await asyncio.gather(*clients)
                assert finished, f"the long request did not run within {STREAM_S}s of short traffic"
                assert long_task.result().status_code == 200
                return waited, shorts

        waited, shorts = asyncio.run(run())
        assert shorts > 50  # the short stream really competed with it
        srv.wait_idle()
