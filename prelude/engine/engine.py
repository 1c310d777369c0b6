"""The engine: owns the scheduler and the executors, and runs the step loop on the server's
event loop. A step's forward runs in one worker thread so the loop keeps serving HTTP meanwhile;
scheduling and output processing run on the loop between steps.

Its API is narrow: `submit` (returns the request's output stream), `refuse_unseen` (whether any
request would be refused now) with `enter`/`leave` around the requests it lets in, `abort`,
`snapshot` (counters for /metrics) and `healthy`; nothing above it touches the scheduler, pool or
executors. The requests it serves, from admission to their end, are kept in `InFlight`
(in_flight.py); the step thread in `StepRunner`."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from prelude.cache.kv_events import KVEventBatch, KVEventSink
from prelude.contract.batch import DecodeBatch, MixedBatch, decode_rows, prefill_rows
from prelude.contract.constraint import GrammarFailed
from prelude.engine.clock import SYSTEM_CLOCK, Clock
from prelude.engine.in_flight import InFlight
from prelude.engine.isolation import StepOutcome, execute_isolating
from prelude.engine.output import (
    ConstraintFailed,
    DeadlineExceeded,
    EngineError,
    FinishReason,
    Overloaded,
    RequestStream,
    ShutDown,
)
from prelude.engine.plan import ScheduledStep
from prelude.engine.request import Request
from prelude.engine.scheduler import Scheduler
from prelude.engine.snapshot import EngineSnapshot, take_snapshot
from prelude.engine.stats import EngineStats
from prelude.engine.step_runner import StepRunner
from prelude.executor.executors import Executors
from prelude.tokenizer import Tokenizer

logger = logging.getLogger(__name__)


class Engine:
    def __init__(self, scheduler: Scheduler, executors: Executors, tokenizer: Tokenizer,
                 eos_token_ids: tuple[int, ...], warmup: Callable[[], None] | None = None,
                 kv_events: KVEventSink | None = None, on_ready: Callable[[], None] | None = None,
                 clock: Clock = SYSTEM_CLOCK):
        """`clock`: the one the scheduler was given, with timers (tests pass a simulated one)."""
        self.scheduler = scheduler
        self.clock = clock
        self.steps = StepRunner(executors, scheduler, clock, frozenset(eos_token_ids))
        self.stats = EngineStats()
        self.requests = InFlight(scheduler, tokenizer, eos_token_ids, self.stats, clock)
        self._wakeup = asyncio.Event()
        self._loop_task: asyncio.Task | None = None
        self._in_flight = 0  # steps running (a short one may run while a long one is parked)
        self._draining = False
        self._closed = False  # after end_all: nothing more is admitted
        # The handlers of requests the server let in (enter) that have not returned: end_all ends
        # those not yet submitted (their bodies still arriving) by cancelling them.
        self._entered: set[asyncio.Task] = set()
        # Kernel compilation and the like, run in the step thread before the first step; until it
        # is done the engine is not ready (/ready answers 503), though requests may queue.
        self._warmup = warmup
        self._ready = False
        # Run in the loop once warm, just before readiness shows (/health 200): what it logs comes
        # before any client can be served, however fast that client is.
        self._on_ready = on_ready
        self._kv_events = kv_events

    @property
    def executors(self) -> Executors:
        return self.steps.executors

    @executors.setter
    def executors(self, executors: Executors) -> None:  # tests inject faults through this
        self.steps.executors = executors

    @property
    def idle(self) -> bool:
        """No request admitted and unfinished, none on its way in, and no step in flight."""
        return not self.requests and not self._in_flight and not self._entered

    def snapshot(self) -> EngineSnapshot:
        return take_snapshot(self.scheduler, self.stats, self.steps.preemptible_steps, self.steps.preemptions,
                             len(self.requests))

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._loop_task = asyncio.create_task(self._run(), name="prelude-engine")
        self._loop_task.add_done_callback(self._on_loop_exit)

    @property
    def healthy(self) -> bool:
        """The step loop is running (it only stops on shutdown or an engine bug)."""
        return self._loop_task is not None and not self._loop_task.done()

    @property
    def ready(self) -> bool:
        """Warmed up and running: new requests are served at full speed."""
        return self._ready and self.healthy

    async def wait_ready(self) -> bool:
        """Waits for the warm-up (polled: it happens once, at startup); False if the loop died."""
        while not self._ready:
            if self._loop_task is not None and self._loop_task.done():
                return False
            await asyncio.sleep(0.01)
        return self.healthy

    async def stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
            self._loop_task = None
        self.end_all()
        self.flush_kv_events()
        self.steps.shutdown()
        if self._kv_events is not None:
            self._kv_events.shutdown()

    def end_all(self) -> None:
        """Ends every request in flight with an error (shutdown): their clients get it now, and
        any request submitted after is refused."""
        self._closed = True
        self.requests.end_all(ShutDown("the server shut down before this request finished"))
        for handler in self._entered:
            handler.cancel()

    async def wait_idle(self, timeout: float) -> bool:
        """Waits until no request is in flight, at most `timeout` seconds; whether it got there."""
        deadline = time.monotonic() + timeout
        while not self.idle and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return self.idle

    # -- requests ---------------------------------------------------------------------------
    def submit(self, request: Request) -> RequestStream:
        """Queues a normalized request; outputs arrive on the returned stream."""
        return self.submit_all([request])[0]

    def submit_all(self, requests: list[Request]) -> list[RequestStream]:
        """Queues the rows of one HTTP request together, or none of them: raises Overloaded when
        the waiting queue has no room for them all, or after end_all. While the server drains, what
        refuse_unseen let in before is admitted: a drain refuses only new requests."""
        if not self.healthy:
            raise EngineError("the engine is not running")
        if self._closed or not self.scheduler.has_room(requests):
            raise self._refuse()
        self._entered.discard(asyncio.current_task())  # end_all ends it by its streams
        streams = []
        for request in requests:
            streams.append(self.requests.admit(self.scheduler.add(request)))
        self.steps.note_arrivals(requests)
        self._wakeup.set()
        return streams

    def refuse_unseen(self) -> Overloaded | None:
        """The refusal (counted) that submit_all would give ANY request now, known before the
        request is read: the server answers it without reading, parsing or tokenizing a body.
        None when a request might be admitted: submit_all decides on its rows."""
        return self._refuse() if self.healthy and self.overloaded else None

    def enter(self, handler: asyncio.Task) -> None:
        """A request refuse_unseen let in, by its handler's task: until it leaves or is submitted,
        a drain waits for it (its body may still be arriving or being tokenized when the drain
        begins), and end_all cancels it."""
        self._entered.add(handler)

    def leave(self, handler: asyncio.Task) -> None:
        self._entered.discard(handler)

    def _refuse(self) -> Overloaded:
        if self._draining or self._closed:
            self.stats.on_rejected("draining")
            return Overloaded("the server is shutting down")
        self.stats.on_rejected("queue_full")
        # Both queue limits, since either may be the one passed (a few long prompts pass the tokens').
        scheduler, limits = self.scheduler, self.scheduler.config
        return Overloaded(f"the server is overloaded ({scheduler.num_waiting} requests, "
                          f"{scheduler.waiting.num_tokens} prompt tokens waiting; limits "
                          f"{limits.max_queued_requests} and {limits.max_queued_tokens}); retry shortly")

    @property
    def overloaded(self) -> bool:
        """The waiting queue is at its limit (or the server is draining): no new request is
        admitted, and a router should steer new work elsewhere."""
        return self._draining or self.scheduler.full

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def closed(self) -> bool:
        """end_all ended the requests in flight (the shutdown timeout): nothing more is admitted."""
        return self._closed

    @property
    def sheds_late(self) -> bool:  # --shed-late-requests
        return self.scheduler.config.shed_late

    @property
    def orders_by_priority(self) -> bool:  # --scheduling-policy priority
        return self.scheduler.config.policy == "priority"

    def begin_drain(self) -> None:
        """Stops letting new requests in (refuse_unseen refuses them all); those in flight, and
        those let in before, go on."""
        self._draining = True

    def abort(self, stream: RequestStream) -> None:
        """Cancels the request behind the stream (client went away); frees its blocks. No-op once
        it finished."""
        self.requests.finish(stream.key, FinishReason.ABORT)

    # -- the loop ---------------------------------------------------------------------------
    async def _run(self) -> None:
        if self._warmup is not None and not self._ready:
            started = time.perf_counter()
            await self.steps.in_worker(self._warmup)
            logger.debug("warm-up in %.2fs", time.perf_counter() - started)
        if self._on_ready is not None and not self._ready:
            self._on_ready()
        self._ready = True
        while True:
            for work in self.scheduler.late(self.clock()):
                # Shed by the server, as vLLM's finished_reason "abort" counts aborts by the user
                # or the system: counted an "error", planned shedding fired error alerts.
                self.requests.finish(work.seq_id, FinishReason.ABORT,
                                     DeadlineExceeded("the request can no longer meet its deadline"))
            step = self.scheduler.schedule()
            if step is None:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if isinstance(step.batch, DecodeBatch):
                await self._run_decodes(step)
            else:
                await self._run_step(step, preemptible=True)

    async def _run_step(self, step: ScheduledStep, preemptible: bool) -> None:
        """Executes a step and folds its results back; a preemptible one may let short work run
        while it is parked."""
        started = self.clock()
        self._in_flight += 1
        try:
            if preemptible:
                outcome = await self.steps.run(step, self._run_short_step)
            else:
                outcome = await self.steps.in_worker(execute_isolating, self.executors.execute, step.batch)
        finally:
            self._in_flight -= 1
        self._fold(step, outcome, self.clock() - started, observe=not (preemptible and self.steps.last_parked))

    async def _run_decodes(self, step: ScheduledStep) -> None:
        """A step of decodes, then, while no other work waits, the same sequences' next ones back
        to back (a DecodeChain): each planned while the one before it runs, and folded back while
        the one after it runs."""
        assert isinstance(step.batch, DecodeBatch)
        chain = self.steps.start_chain(step.batch)
        self._in_flight += 1
        try:
            while True:
                ahead = self.scheduler.plan_ahead(step)
                follow = None if ahead is None else ahead.batch
                assert follow is None or isinstance(follow, DecodeBatch)
                chain.follow(follow)
                outcome, seconds, continued = await chain.outcome()
                self._fold(step, outcome, seconds)
                if ahead is None or not continued:
                    return
                step = ahead
        finally:
            chain.follow(None)  # a worker still waiting for a decision (the loop was cancelled) ends
            self._in_flight -= 1

    def _fold(self, step: ScheduledStep, outcome: StepOutcome, seconds: float, observe: bool = True) -> None:
        """Folds a step's results back: its rows' outputs reach their streams. `observe`: its
        seconds calibrate the cost model (not those of a step that was parked)."""
        self.stats.on_step(seconds, step.num_tokens)
        if observe:
            self.scheduler.observe_step(step, seconds)
        if outcome.first_error is not None:
            step = self._fail_rows(step, outcome)
        beside_decodes = isinstance(step.batch, MixedBatch) and bool(step.batch.decodes)
        self.requests.deliver(self.scheduler.update(step, outcome.result), beside_decodes)
        self.flush_kv_events()

    def flush_kv_events(self) -> None:
        """Hands what the pool recorded since the last flush to the publisher as one batch: once
        per step (evictions made while scheduling it, publishes made by its update) and after a
        cache reset."""
        log = self.scheduler.pool.events
        if self._kv_events is not None and log is not None and len(log):
            self._kv_events.publish(KVEventBatch(time.time(), log.drain()))

    def reset_prefix_cache(self) -> bool:
        """Drops every idle cached block (vLLM's POST /reset_prefix_cache); False while some cached
        block is in use."""
        done = self.scheduler.pool.reset_prefix_cache()
        self.flush_kv_events()
        return done

    async def _run_short_step(self, max_tokens: int) -> bool:
        """One step of short waiting work while a long step is parked; whether there was any."""
        step = self.scheduler.schedule_short(max_tokens)
        if step is None:
            return False
        await self._run_step(step, preemptible=False)
        return True

    def _on_loop_exit(self, task: asyncio.Task) -> None:
        """An engine bug must not leave requests hanging: fail them all, loudly."""
        if task.cancelled() or task.exception() is None:
            return
        logger.error("engine loop died", exc_info=task.exception())
        self.requests.fail_all(EngineError(f"engine failed: {task.exception()!r}"))

    def _fail_rows(self, step: ScheduledStep, outcome: StepOutcome) -> ScheduledStep:
        """A step raised: fail only the requests whose rows raise alone; the rest go on."""
        rows = len(prefill_rows(step.batch)) + len(decode_rows(step.batch))
        step, failed = self.scheduler.fail_rows(step, set(outcome.failures))
        self.stats.on_step_failure(len(failed))
        names = ", ".join(w.request.request_id for w in failed) or "none (the retries passed)"
        if failed and all(isinstance(outcome.failures[w.seq_id], GrammarFailed) for w in failed):
            # A request's own grammar gave out (its client's input, answered 400): no engine fault
            # to trace, and a traceback per such request would bury the real ones.
            logger.warning("%d request(s) ended by their own grammar: %s (%s)", len(failed), names,
                           outcome.failures[failed[0].seq_id])
        else:
            logger.error("a step of %d rows raised; %d request(s) failed alone and were ended: %s", rows,
                         len(failed), names, exc_info=outcome.first_error)
        for work in failed:
            error = outcome.failures[work.seq_id]
            if isinstance(error, GrammarFailed):  # the request's own constraint: a 400
                ended: EngineError = ConstraintFailed(str(error))
            else:
                ended = EngineError(f"this request failed in the engine: {type(error).__name__}: {error}")
            self.requests.finish(work.seq_id, FinishReason.ERROR, ended)
        return step
