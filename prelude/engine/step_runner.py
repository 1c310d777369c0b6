"""Runs scheduled steps in the engine's one worker thread, so the event loop keeps serving HTTP
while a forward runs.

A long OneShot step may step aside for short work (engine.preemption): it runs until its flag
goes up, then the engine runs steps of the short work (and of running sequences' next tokens),
then the long one goes on where it stopped, with the same results as an uninterrupted run.
Every other step runs whole, with failures isolated row by row (engine.isolation)."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Awaitable, Callable, TypeVar

from prelude.contract.batch import BatchResult, DecodeBatch, OneShotBatch
from prelude.engine.clock import Clock
from prelude.engine.decode_chain import DecodeChain
from prelude.engine.isolation import StepOutcome, execute_isolating
from prelude.engine.plan import ScheduledStep
from prelude.engine.preemption import MAX_SHORT_STEPS, LongStep
from prelude.engine.request import Request
from prelude.engine.scheduler import Scheduler
from prelude.engine.worker import Worker
from prelude.executor.executors import Executors

if TYPE_CHECKING:
    from prelude.executor.runner import Progress

T = TypeVar("T")


class StepRunner:
    def __init__(self, executors: Executors, scheduler: Scheduler, clock: Clock, eos_token_ids: frozenset[int]):
        self.executors = executors
        self.eos_token_ids = eos_token_ids
        self.scheduler = scheduler
        self.clock = clock
        self.long_step = LongStep(clock)
        self.preemptible_steps = 0  # long OneShot steps run so that they could step aside
        self.preemptions = 0  # times one did
        self.last_parked = False  # the last step run stepped aside (its wall time is not its cost)
        self._worker = Worker("prelude-step", executors.thread_context)

    async def in_worker(self, fn: Callable[..., T], *args) -> T:
        return await self._worker.call(fn, *args)

    def start_chain(self, batch: DecodeBatch) -> DecodeChain:
        """Starts a step of decodes in the worker, as the first of a DecodeChain."""
        chain = DecodeChain(asyncio.get_running_loop(), self.clock, self.eos_token_ids)
        self._worker.submit(chain.run, self.executors.execute, batch)
        return chain

    def shutdown(self) -> None:
        self._worker.shutdown()

    def note_arrivals(self, requests: list[Request]) -> None:
        """A request short beside the long step in flight asks it to step aside."""
        if self.long_step.in_flight and any(r.num_prompt_tokens <= self.short_tokens for r in requests):
            self.long_step.note_short_arrival()

    @property
    def short_tokens(self) -> int:
        """The most tokens a step that runs while the long one is parked may take."""
        return self.long_step.short_tokens

    async def run(self, step: ScheduledStep, run_short: Callable[[int], Awaitable[bool]]) -> StepOutcome:
        """The step's results. `run_short(max_tokens)` runs (schedules, executes, folds back) a
        step of short waiting work while this one is parked; whether there was any."""
        batch = step.batch
        self.last_parked = False
        tokens = step.num_tokens if isinstance(batch, OneShotBatch) else 0
        if not (tokens and self.scheduler.preemption.preemptible(tokens)):
            return await self.in_worker(execute_isolating, self.executors.execute, batch)
        assert isinstance(batch, OneShotBatch)
        self.preemptible_steps += 1
        long_step = self.long_step
        long_step.begin(max(len(row.token_ids) for row in batch.rows))
        try:
            progress: Progress | None = None
            while True:
                long_step.resume(self.scheduler.waiting_within(self.short_tokens), bool(self.scheduler.num_running))
                progress, result = await self.in_worker(self._advance, batch, progress)
                long_step.stopped()
                if result is not None:
                    return StepOutcome(result)
                self.preemptions += 1
                self.last_parked = True
                parked = self.clock()
                for _ in range(MAX_SHORT_STEPS):
                    if not await run_short(self.short_tokens) or not self.scheduler.waiting_within(self.short_tokens):
                        break
                long_step.parked(self.clock() - parked)
        except Exception:  # noqa: BLE001 (run it again whole, where failures are isolated row by row)
            return await self.in_worker(execute_isolating, self.executors.execute, batch)
        finally:
            long_step.end()

    def _advance(self, batch: OneShotBatch, progress: Progress | None) -> tuple[Progress, BatchResult | None]:
        """In the worker: starts the step (when `progress` is None) and runs it on until it
        finished or its flag went up."""
        oneshot, flag = self.executors.oneshot, self.long_step.flag
        if progress is None:
            progress = oneshot.start(batch, flag)
        return progress, oneshot.advance(progress, flag)
