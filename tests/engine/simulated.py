"""An Engine run in-process over a SimulatedExecutor, on a FakeClock: the engine's step loop,
worker thread and output streams are real; the model and the time are simulated. Tests submit
requests, and assert on the order they end in and on the engine's counters."""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, TypeVar

from prelude.cache.block_pool import BlockPool
from prelude.contract.config import Config
from prelude.contract.sampling import SamplingParams
from prelude.engine.engine import Engine
from prelude.engine.output import EngineError, RequestOutput, RequestStream
from prelude.engine.request import Request, Task
from prelude.engine.scheduler import Scheduler
from prelude.engine.scheduler_config import SchedulerConfig
from prelude.executor.executors import Executors
from tests.engine.clock import FakeClock
from tests.engine.fakes import NumberTokenizer, SimulatedExecutor

T = TypeVar("T")


def simulated_engine(**config) -> tuple[Engine, SimulatedExecutor]:
    """An engine and its executor on a fresh FakeClock (`executor.clock`); `config`: Config
    fields (scheduling_policy fcfs and 1024 KV blocks unless given)."""
    settings = Config(**{"scheduling_policy": "fcfs", "num_kv_blocks": 1024, **config})
    clock = FakeClock()
    pool = BlockPool(settings.num_kv_blocks, settings.block_size, settings.enable_prefix_caching)
    scheduler = Scheduler(SchedulerConfig.from_config(settings), pool, clock)
    executor = SimulatedExecutor(clock)
    executors = Executors(executor, executor, executor)  # type: ignore[arg-type]
    return Engine(scheduler, executors, NumberTokenizer(), eos_token_ids=(), clock=clock), executor


def run(engine: Engine, scenario: Callable[[], Awaitable[T]]) -> T:
    """Runs `scenario` against the started engine, waits until the engine is idle, stops it,
    and checks that every KV block was given back; returns what the scenario returned."""
    async def main() -> T:
        await engine.start()
        try:
            result = await scenario()
            assert await engine.wait_idle(30), "the engine did not go idle"
            return result
        finally:
            await engine.stop()

    result = asyncio.run(main())
    pool = engine.scheduler.pool
    pool.check_integrity()
    assert pool.num_used_blocks == 0, f"{pool.num_used_blocks} KV blocks still held"
    return result


class Ends:
    """How each watched request ended (its merged output, or the error that ended it) and the
    order in which they ended."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.outputs: dict[str, RequestOutput] = {}
        self.errors: dict[str, EngineError] = {}

    def watch(self, stream: RequestStream) -> asyncio.Task[None]:
        return asyncio.create_task(self._collect(stream))

    async def _collect(self, stream: RequestStream) -> None:
        try:
            self.outputs[stream.request_id] = await stream.collect()
        except EngineError as exc:
            self.errors[stream.request_id] = exc
        self.order.append(stream.request_id)


def embed(request_id: str, num_tokens: int, start: int = 3, **fields) -> Request:
    """An embedding request (OneShot) of `num_tokens` distinct-enough prompt tokens."""
    ids = [(start + 13 * j) % 997 + 3 for j in range(num_tokens)]
    return Request(request_id, ids, SamplingParams(max_tokens=0), task=Task.EMBED, **fields)


def generate(request_id: str, prompt: list[int], max_tokens: int, **fields) -> Request:
    """A greedy generation (Decode unless max_tokens <= 1)."""
    return Request(request_id, prompt, SamplingParams(max_tokens=max_tokens, temperature=0), **fields)


async def until(condition: Callable[[], bool]) -> None:
    """Yields to the engine's loop until `condition` holds (read between steps); fails after 30 s
    of real time, which only a hung engine takes."""
    for _ in range(30_000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never held")
