"""Work that fits no step beside a running stream still runs while the stream goes on, over real
HTTP on the demo model. (A long request under a stream of short ones, and the aging bound, are
checked in simulated time in tests/engine/test_layer_preemption.py and test_policies.py.)"""
from __future__ import annotations

import asyncio
import threading
import time

import httpx

from prelude.contract.config import Config
from tests.server.harness import ServerThread

def test_a_oneshot_row_over_the_step_budget_runs_while_a_stream_goes_on(demo_model):
    """A OneShot row longer than --max-num-batched-tokens fits no step that carries a stream's
    decode. Cheap enough to share one (a GPU computes 8K tokens in well under STREAM_GAP_S), it
    must still get a step of its own, not wait for every stream to end. The cost model is pinned
    to such figures: on this CPU, fitted to one-token decode steps alone, it calls any prompt
    slow, which takes the path for slow rows instead."""
    config = Config(model=str(demo_model), num_kv_blocks=512, max_num_batched_tokens=64)
    with ServerThread(config) as srv:
        costs = srv.engine.scheduler.costs

        def pin() -> None:
            costs.fixed_s, costs.per_token_s = 1e-3, 20e-6
            costs.observe = lambda tokens, seconds: None  # type: ignore[method-assign]

        srv.on_loop(pin)

        async def send(client: httpx.AsyncClient) -> list[httpx.Response]:
            return [await client.post("/v1/embeddings", json={"input": [IDS]}),
                    await client.post("/v1/completions", json={"prompt": IDS[1:], "max_tokens": 1})]

        answers, still_streaming = asyncio.run(_beside_a_stream(srv, send))
        assert [a.status_code for a in answers] == [200, 200]
        assert still_streaming, "the OneShot requests waited for the stream to end"
        srv.wait_idle()


def test_an_unsplittable_prompt_over_the_step_budget_holds_up_no_one(demo_model):
    """A generation with prompt logprobs reads every position of its prompt, so the prompt runs
    in one piece. Longer than what a stream's decode leaves of --max-num-batched-tokens, it
    waited for the stream to end, and every generation queued behind it with it."""
    config = Config(model=str(demo_model), num_kv_blocks=512, max_num_batched_tokens=64)
    with ServerThread(config) as srv:
        async def send(client: httpx.AsyncClient) -> list[httpx.Response]:
            whole = client.post("/v1/completions", json={"prompt": IDS, "max_tokens": 3, "prompt_logprobs": 0})
            behind = client.post("/v1/completions", json={"prompt": "hi there", "max_tokens": 3})
            return list(await asyncio.gather(whole, behind))

        answers, still_streaming = asyncio.run(_beside_a_stream(srv, send))
        assert [a.status_code for a in answers] == [200, 200]
        assert len(answers[0].json()["choices"][0]["prompt_logprobs"]) == len(IDS)
        assert still_streaming, "the generations waited for the stream to end"
        srv.wait_idle()


class Stepper:
    """Runs the engine's steps one at a time, as the test releases them."""

    def __init__(self, executors):
        self.executors = executors
        self.steps = threading.Semaphore(0)

    def execute(self, batch, on_launch=None):
        assert self.steps.acquire(timeout=30), "the test released no step"
        return self.executors.execute(batch, on_launch)


def _until(srv: ServerThread, condition) -> None:
    deadline = time.monotonic() + 10
    while not srv.on_loop(condition):
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_a_chunk_short_of_blocks_preempts_a_sequence_decoding_in_its_step_cleanly(demo_model):
    """A prompt's chunk that needs blocks preempts the newest sequence, which may be one already
    decoding in the same step: that sequence then leaves the step. It stayed, its row naming the
    blocks it had just given up, and the step raised (its request: a 500). Here the newest is a
    prompt-logprobs request, which gets a step of its own beside the chunked prompt; the pool
    (22 blocks of 16) holds both prompts' KV only in turn."""
    config = Config(model=str(demo_model), block_size=16, num_kv_blocks=22, max_num_batched_tokens=64,
                    scheduling_policy="fcfs")
    with ServerThread(config) as srv:
        stepper = Stepper(srv.engine.executors)
        srv.on_loop(lambda: setattr(srv.engine, "executors", stepper))
        long_ids = [(j * 13) % 500 + 3 for j in range(300)]
        short_ids = [(j * 7) % 500 + 3 for j in range(100)]

        async def run():
            async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as client:
                chunked = asyncio.create_task(client.post("/v1/completions",
                                                          json={"prompt": long_ids, "max_tokens": 2}))
                await asyncio.to_thread(_until, srv, lambda: srv.engine.scheduler.num_running == 1)
                stepper.steps.release()  # the long prompt's first chunk; the second is planned
                await asyncio.to_thread(_until, srv, lambda: srv.engine.scheduler.num_waiting == 0)
                whole = asyncio.create_task(client.post("/v1/completions", json={
                    "prompt": short_ids, "max_tokens": 5, "prompt_logprobs": 0}))
                await asyncio.to_thread(_until, srv, lambda: srv.engine.scheduler.num_waiting == 1)
                stepper.steps.release(1000)
                return await chunked, await whole

        chunked, whole = asyncio.run(run())
        assert chunked.status_code == 200, chunked.text
        assert whole.status_code == 200, whole.text
        assert len(whole.json()["choices"][0]["prompt_logprobs"]) == len(short_ids)
        assert srv.on_loop(lambda: srv.engine.scheduler.stats.num_preemptions) > 0
        srv.wait_idle()


IDS = [(j * 13) % 500 + 3 for j in range(100)]  # a 100-token prompt, over the tests' 64-token budget


async def _beside_a_stream(srv, send) -> tuple[list[httpx.Response], bool]:
    """`send`'s answers, sent while a long stream decodes, and whether it still did when they came."""
    async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as client:
        body = {"prompt": [5, 6, 7], "max_tokens": 3000, "ignore_eos": True, "stream": True}
        async with client.stream("POST", "/v1/completions", json=body) as stream:
            lines = stream.aiter_lines()  # kept: a dropped iterator closes the stream
            await anext(lines)  # the stream's first token: it is decoding
            answers = await send(client)
            return answers, srv.on_loop(lambda: srv.engine.scheduler.num_running) == 1
