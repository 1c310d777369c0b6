"""Bounded admission: past --max-queued-requests a request gets 503 with Retry-After and an
OpenAI-style error, nothing accepted is dropped, /metrics counts the rejections, /health stays
200 and /ready says overloaded. And every endpoint drops a gone client's queued rows at once."""
from __future__ import annotations

import asyncio
import threading
import time

import httpx

from prelude.contract.config import Config
from tests.server.harness import ServerThread

QUEUE = 4
BODY = {"prompt": "Is this relevant?", "max_tokens": 1, "temperature": 0}


class Gate:
    """Holds every step until opened: the waiting queue then fills deterministically."""

    def __init__(self, executors):
        self.executors = executors
        self.open = threading.Event()

    def execute(self, batch, on_launch=None):
        self.open.wait(30)
        return self.executors.execute(batch, on_launch)


def _wait_for(srv: ServerThread, condition, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not srv.on_loop(condition):
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_full_queue_answers_503_with_retry_after_and_drops_nothing(demo_model):
    with ServerThread(Config(model=str(demo_model), num_kv_blocks=256, max_queued_requests=QUEUE)) as srv:
        want = httpx.post(srv.base_url + "/v1/completions", json=BODY).json()["choices"][0]["text"]
        gate = Gate(srv.engine.executors)
        srv.on_loop(lambda: setattr(srv.engine, "executors", gate))

        async def flood():
            async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as client:
                first = asyncio.create_task(client.post("/v1/completions", json=BODY))
                await asyncio.to_thread(_wait_for, srv, lambda: srv.engine.idle is False and srv.engine._in_flight)
                rest = [asyncio.create_task(client.post("/v1/completions", json=BODY)) for _ in range(11)]
                await asyncio.to_thread(_wait_for, srv, lambda: srv.engine.scheduler.num_waiting == QUEUE)
                await asyncio.sleep(0.2)  # the last of the eleven are answered (503) by now
                ready, health = await client.get("/ready"), await client.get("/health")
                late = await client.post("/v1/completions", json=BODY)
                gate.open.set()
                return [await first, *[await r for r in rest]], ready, health, late

        responses, ready, health, late = asyncio.run(flood())
        refused = [r for r in responses + [late] if r.status_code == 503]
        served = [r for r in responses if r.status_code == 200]
        assert len(served) == 1 + QUEUE and len(refused) == 12 - len(served) + 1
        for response in refused:
            assert response.headers["retry-after"] == "1"
            assert response.json()["error"]["code"] == "overloaded"
        assert all(r.json()["choices"][0]["text"] == want for r in served)  # nothing accepted is lost
        assert ready.status_code == 503 and ready.json()["status"] == "overloaded"
        assert health.status_code == 200
        metrics = httpx.get(srv.base_url + "/metrics").text
        assert f'prelude:rejected_requests_total{{model_name="{srv.served.name}",reason="queue_full"}} {len(refused)}' \
            in metrics
        assert httpx.get(srv.base_url + "/ready").json()["status"] == "ready"
        srv.wait_idle()


def test_every_endpoint_drops_a_gone_clients_rows(demo_model):
    """A client that disconnects while its rows wait: the rows leave the queue at once and hold
    no KV (here the queue is held by a gate, so they never ran)."""
    with ServerThread(Config(model=str(demo_model), num_kv_blocks=256)) as srv:
        gate = Gate(srv.engine.executors)
        srv.on_loop(lambda: setattr(srv.engine, "executors", gate))
        calls = [("/v1/completions", BODY), ("/v1/embeddings", {"input": ["a", "b", "c"]}),
                 ("/v1/score", {"query": "q", "items": ["x", "y"], "label_token_ids": [5, 6]}),
                 ("/pooling", {"input": "hello"}), ("/v1/rerank", {"query": "q", "documents": ["a", "b"]})]

        async def go_away():
            async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as client:
                blocker = asyncio.create_task(client.post("/v1/completions", json=BODY))
                await asyncio.to_thread(_wait_for, srv, lambda: srv.engine._in_flight)
                for path, body in calls:
                    async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as impatient:
                        task = asyncio.create_task(impatient.post(path, json=body))
                        await asyncio.to_thread(_wait_for, srv, lambda: srv.engine.scheduler.num_waiting > 0)
                        task.cancel()
                    await asyncio.to_thread(_wait_for, srv, lambda: srv.engine.scheduler.num_waiting == 0)
                gate.open.set()
                await blocker

        asyncio.run(go_away())
        srv.wait_idle()
        metrics = httpx.get(srv.base_url + "/metrics").text
        aborted = next(line for line in metrics.splitlines()
                       if line.startswith("prelude:request_success_total{") and 'reason="abort"' in line)
        # every row of every call (the two short score items share one multi-item row)
        assert float(aborted.rsplit(" ", 1)[1]) == 1 + 3 + 1 + 1 + 2


def test_a_request_past_the_queue_bound_by_itself_waits_only_for_room(demo_model):
    """A request with more rows than --max-queued-requests never fits beside others: it is taken
    while the queue is within its bound, not only when the queue is empty, which under steady
    traffic never came (its client retried 503s forever)."""
    with ServerThread(Config(model=str(demo_model), num_kv_blocks=256, max_queued_requests=QUEUE)) as srv:
        gate = Gate(srv.engine.executors)
        srv.on_loop(lambda: setattr(srv.engine, "executors", gate))
        batch = {"input": [f"text number {i}" for i in range(2 * QUEUE)]}

        async def go():
            async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as client:
                running = asyncio.create_task(client.post("/v1/completions", json=BODY))
                await asyncio.to_thread(_wait_for, srv, lambda: srv.engine._in_flight)
                queued = asyncio.create_task(client.post("/v1/completions", json=BODY))
                await asyncio.to_thread(_wait_for, srv, lambda: srv.engine.scheduler.num_waiting == 1)
                big = asyncio.create_task(client.post("/v1/embeddings", json=batch))
                await asyncio.to_thread(_wait_for, srv, lambda: srv.engine.scheduler.num_waiting > 1 or big.done())
                over = await client.post("/v1/completions", json=BODY)  # the queue is past its bound now
                gate.open.set()
                return await running, await queued, await big, over

        running, queued, big, over = asyncio.run(go())
        assert big.status_code == 200, big.text
        assert [running.status_code, queued.status_code, over.status_code] == [200, 200, 503]
        assert len(big.json()["data"]) == 2 * QUEUE
        srv.wait_idle()
