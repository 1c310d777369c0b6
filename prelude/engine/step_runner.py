"""Runs scheduled steps in the engine's one worker thread, so the event loop keeps serving HTTP
while a forward runs.

A long OneShot step runs layer by layer and steps aside between two layers while a short request
waits (FlowPrefill's cooperative preemption), and every STREAM_GAP_S while sequences are running:
the engine runs a step of that request or of the sequences' next tokens, then the long one resumes
where it stopped, with the same results as an uninterrupted run. Every other step runs whole,
with failures isolated row by row (engine.isolation)."""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Awaitable, Callable, TypeVar

from prelude.contract.batch import DecodeBatch, OneShotBatch
from prelude.engine.decode_chain import DecodeChain
from prelude.engine.isolation import StepOutcome, execute_isolating
from prelude.engine.plan import STREAM_GAP_S, ScheduledStep, preemptible, short_tokens_beside
from prelude.engine.request import Request
from prelude.engine.scheduler import Scheduler
from prelude.executor.executors import Executors

T = TypeVar("T")
MAX_SHORT_STEPS = 16  # steps of short work per park
# The long step may stop only while it has computed, in all since it began, at least this much
# of the time the short work it stepped aside for took: it keeps at least a third of the machine
# under any stream of short requests. Counted per park instead (after each park, run half as
# long as it), a short request arriving just after a park waited out that whole run even when
# the long step had had far more than its share: traced beside 8K-token embeddings, 40-50 ms.
LONG_RUN_PER_SHORT_S = 0.5


class StepRunner:
    def __init__(self, executors: Executors, scheduler: Scheduler):
        self.executors = executors
        self.scheduler = scheduler
        self.urgent = threading.Event()  # read by the worker thread between layers
        self.preemptions = 0
        self.last_parked = False  # the last step run stepped aside (its wall time is not its cost)
        self._long_tokens = 0  # the longest row of the preemptible step in flight; 0 when none runs
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prelude-step")

    async def in_worker(self, fn: Callable[..., T], *args) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)

    def start_chain(self, batch: DecodeBatch) -> DecodeChain:
        """Starts a step of decodes in the worker, as the first of a DecodeChain."""
        chain = DecodeChain(asyncio.get_running_loop())
        self._worker.submit(chain.run, self.executors.execute, batch)
        return chain

    def shutdown(self) -> None:
        self._worker.shutdown(wait=True)

    def note_arrivals(self, requests: list[Request]) -> None:
        """A request short beside the long step in flight asks it to step aside."""
        if self._long_tokens and any(r.num_prompt_tokens <= self.short_tokens for r in requests):
            self.urgent.set()

    @property
    def short_tokens(self) -> int:
        """The most tokens a step that runs while the long one is parked may take."""
        return short_tokens_beside(self._long_tokens)

    def _stop_when_urgent(self, owed: float) -> Callable[[], bool]:
        """Between two segments: stop when short work waits, but only once the step has run for
        `owed` seconds. Stopping at every segment let a steady stream of short requests hold a
        long one to a segment per park (a 3K-token embedding took 20 s instead of 1.4 s)."""
        resumed = time.perf_counter()
        return lambda: self.urgent.is_set() and time.perf_counter() - resumed >= owed

    async def run(self, step: ScheduledStep, run_urgent: Callable[[], Awaitable[bool]]) -> StepOutcome:
        """The step's results. `run_urgent` runs (schedules, executes, folds back) a step of the
        short waiting work while this one is parked."""
        batch = step.batch
        self.last_parked = False
        tokens = sum(len(row.token_ids) for row in batch.rows) if isinstance(batch, OneShotBatch) else 0
        if not (self.scheduler.config.layer_preemption and tokens and preemptible(self.scheduler.costs, tokens)):
            return await self.in_worker(execute_isolating, self.executors.execute, batch)
        assert isinstance(batch, OneShotBatch)
        self.urgent.clear()
        self._long_tokens = max(len(row.token_ids) for row in batch.rows)
        loop = asyncio.get_running_loop()
        try:
            oneshot = self.executors.oneshot
            progress = await self.in_worker(oneshot.start, batch)
            computed = parked_for = 0.0  # seconds, since the step began
            while True:
                # Short work already waiting counts as much as an arrival: a long request that
                # the queue's order put first (sjf/edf aging) must not hold back the short ones
                # queued behind it until the next short arrival.
                if self.scheduler.waiting_within(self.short_tokens):
                    self.urgent.set()
                # Running sequences' next tokens count as short work once they have waited
                # STREAM_GAP_S (the scheduler kept this step's rows out of a step with them).
                stream_due = loop.call_later(STREAM_GAP_S, self.urgent.set) if self.scheduler.num_running else None
                resumed = time.perf_counter()
                owed = LONG_RUN_PER_SHORT_S * parked_for - computed
                result = await self.in_worker(oneshot.advance, progress, self._stop_when_urgent(owed))
                if stream_due is not None:
                    stream_due.cancel()
                computed += time.perf_counter() - resumed
                if result is not None:
                    return StepOutcome(result)
                self.preemptions += 1
                self.last_parked = True
                self.urgent.clear()
                # One step (the sequences' tokens and short waiting work), then more while short
                # work waits (at most MAX_SHORT_STEPS, which bounds how long the parked step
                # waits), then the long step goes on.
                parked = time.perf_counter()
                for _ in range(MAX_SHORT_STEPS):
                    if not await run_urgent() or not self.scheduler.waiting_within(self.short_tokens):
                        break
                parked_for += time.perf_counter() - parked
        except Exception:  # noqa: BLE001 (run it again whole, where failures are isolated row by row)
            return await self.in_worker(execute_isolating, self.executors.execute, batch)
        finally:
            self._long_tokens = 0
