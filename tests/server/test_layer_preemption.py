"""Cooperative preemption (FlowPrefill): a long OneShot step steps aside while a short request
waits, and only then. The short request is answered before the long one finishes (after it
without preemption), and both results equal those computed alone."""
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


def _run(srv: ServerThread) -> tuple[list[float], list[float], float, float]:
    """Long embedding, then (once it runs) a short one; their vectors and finishing times."""
    async def timed(client: httpx.AsyncClient, ids: list[int]) -> tuple[dict, float]:
        response = await client.post("/v1/embeddings", json={"input": [ids]})
        return response.json(), time.monotonic()

    async def go():
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=120) as client:
            long_task = asyncio.create_task(timed(client, LONG))
            await _until(srv, lambda: srv.engine._in_flight)
            short, short_done = await timed(client, SHORT)
            long, long_done = await long_task
            return long, short, short_done, long_done

    long, short, short_done, long_done = asyncio.run(go())
    return long["data"][0]["embedding"], short["data"][0]["embedding"], short_done, long_done


@pytest.mark.parametrize("preemption", [True, False])
def test_short_request_overtakes_a_long_step_only_with_preemption(demo_model, preemption):
    config = Config(model=str(demo_model), num_kv_blocks=64, max_model_len=8192, allow_long_max_model_len=True,
                    layer_preemption=preemption)
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


def test_a_long_step_with_nothing_waiting_runs_in_one_piece(demo_model):
    """Preemptible, but never asked to step aside: it parks no time (and runs the model's one-call
    path whole, kernels/cpu/step_layers.hpp, as an unpreemptible step does)."""
    config = Config(model=str(demo_model), num_kv_blocks=64, max_model_len=8192, allow_long_max_model_len=True)
    with ServerThread(config) as srv:
        for _ in range(2):
            assert httpx.post(srv.base_url + "/v1/embeddings", json={"input": [LONG]}, timeout=120).status_code == 200
        snapshot = srv.engine.snapshot()
        srv.wait_idle()
    assert snapshot.preemptible_steps == 2
    assert snapshot.layer_preemptions == 0


BUSY = [[(i * 5 + j) % 500 + 3 for j in range(120)] for i in range(48)]  # one step, no row long


def _queued_behind_a_busy_step(config: Config) -> tuple[float, float]:
    """A long embedding, then a short one, queued while a batch runs; when each finished."""
    async def go(srv: ServerThread) -> tuple[float, float]:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=120) as client:
            async def done_at(ids: list[list[int]]) -> float:
                assert (await client.post("/v1/embeddings", json={"input": ids})).status_code == 200
                return time.monotonic()

            busy = asyncio.create_task(done_at(BUSY))
            await _until(srv, lambda: srv.engine._in_flight)
            long_task = asyncio.create_task(done_at([LONG]))
            await _until(srv, lambda: srv.engine.scheduler.num_waiting_tokens == len(LONG))
            short_task = asyncio.create_task(done_at([SHORT]))
            await _until(srv, lambda: srv.engine.scheduler.num_waiting_tokens == len(LONG) + len(SHORT))
            assert not busy.done()  # both arrived while the batch ran: neither parked it
            await busy
            return await long_task, await short_task

    with ServerThread(config) as srv:
        done = asyncio.run(go(srv))
        srv.wait_idle()
    return done


def test_short_request_queued_behind_a_long_one_runs_beside_it(demo_model):
    """A short request that the queue's order put behind a long one (FCFS, with the long one
    filling the step budget) steps in as soon as the long step starts, not only when some other
    short request arrives during it."""
    long_done, short_done = _queued_behind_a_busy_step(Config(
        model=str(demo_model), num_kv_blocks=1024, max_model_len=8192, allow_long_max_model_len=True,
        max_num_batched_tokens=6000,
        scheduling_policy="fcfs"))
    assert short_done < long_done


def test_a_short_request_is_not_batched_into_a_long_ones_step(demo_model):
    """A short request and a long one below the step budget, waiting together: the short one does
    not share (and wait for) the long one's step."""
    for policy in ("fcfs", "edf"):
        long_done, short_done = _queued_behind_a_busy_step(Config(
            model=str(demo_model), num_kv_blocks=1024, max_model_len=8192, allow_long_max_model_len=True,
            scheduling_policy=policy))
        assert long_done - short_done > 0.2, (policy, long_done, short_done)  # the long step takes ~1 s


def test_a_running_stream_keeps_its_tokens_coming_beside_a_long_request(demo_model):
    """A long OneShot row does not share a step with running decodes (the stream would stall for
    all of it): it runs in a step of its own, which steps aside for the stream's next tokens."""
    config = Config(model=str(demo_model), num_kv_blocks=1024, max_model_len=8192, allow_long_max_model_len=True)

    async def go(srv: ServerThread) -> list[float]:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=120) as client:
            long_task: asyncio.Task | None = None
            arrivals = []  # of the stream's tokens while the long request runs

            async def embed_long() -> None:
                assert (await client.post("/v1/embeddings", json={"input": [LONG]})).status_code == 200

            body = {"prompt": [5, 6, 7], "max_tokens": 4000, "ignore_eos": True, "temperature": 0, "stream": True}
            async with client.stream("POST", "/v1/completions", json=body) as response:
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    if long_task is None:
                        long_task = asyncio.create_task(embed_long())
                        await _until(srv, lambda: srv.engine.scheduler.num_waiting == 0)
                    elif long_task.done():
                        break
                    else:
                        arrivals.append(time.monotonic())
            assert long_task is not None
            await long_task
            return arrivals

    with ServerThread(config) as srv:
        alone = time.monotonic()  # another input: this one's prefix would be cached
        httpx.post(srv.base_url + "/v1/embeddings", json={"input": [LONG[1:] + [3]]}, timeout=120)
        alone = time.monotonic() - alone
        arrivals = asyncio.run(go(srv))
        srv.wait_idle()
    # Without the step of its own, the stream gets about one token while the long request runs.
    assert len(arrivals) >= 5, (alone, arrivals)
    assert max(b - a for a, b in zip(arrivals, arrivals[1:])) < alone / 2

