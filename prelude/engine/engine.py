"""The engine: owns the scheduler and the executor, and runs the step loop on the server's event
loop. A step's forward runs in one worker thread so the loop keeps serving HTTP meanwhile;
scheduling and output processing run on the loop between steps."""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from prelude.engine.detokenize import IncrementalDetokenizer
from prelude.engine.output import EngineError, RequestOutput, RequestStream
from prelude.engine.batch import RowResult, decode_rows, prefill_rows
from prelude.engine.isolation import StepOutcome, execute_isolating
from prelude.engine.request import Request
from prelude.engine.scheduler import OneShotJob, Scheduler, ScheduledStep, StepEvent, Work
from prelude.engine.sequence import Sequence
from prelude.engine.stats import EngineStats
from prelude.executor.base import Executor
from prelude.tokenizer import Tokenizer

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Tracked:
    """Engine-side state of one admitted request."""

    work: Work
    stream: RequestStream
    detokenizer: IncrementalDetokenizer | None = None  # Decode requests only
    logprobs: bool = False
    first_token_time: float | None = None


class Engine:
    def __init__(self, scheduler: Scheduler, executor: Executor, tokenizer: Tokenizer,
                 eos_token_ids: tuple[int, ...], max_model_len: int):
        self.scheduler = scheduler
        self.executor = executor
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_model_len = max_model_len
        self.stats = EngineStats()
        self._tracked: dict[str, _Tracked] = {}
        self._wakeup = asyncio.Event()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prelude-step")
        self._loop_task: asyncio.Task | None = None
        self._in_flight = False

    @property
    def pool(self):
        return self.scheduler.pool

    @property
    def idle(self) -> bool:
        """No request admitted and unfinished, and no step in flight."""
        return not self._tracked and not self._in_flight

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._loop_task = asyncio.create_task(self._run(), name="prelude-engine")
        self._loop_task.add_done_callback(self._on_loop_exit)

    @property
    def healthy(self) -> bool:
        """The step loop is running (it only stops on shutdown or an engine bug)."""
        return self._loop_task is not None and not self._loop_task.done()

    async def stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
            self._loop_task = None
        for tracked in list(self._tracked.values()):
            self._end(tracked, "abort")
        self._worker.shutdown(wait=True)

    # -- requests ---------------------------------------------------------------------------
    def submit(self, request: Request) -> RequestStream:
        """Queues a normalized request; outputs arrive on the returned stream."""
        if request.request_id in self._tracked:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        if not self.healthy:
            raise EngineError("the engine is not running")
        stream = RequestStream(request.request_id)
        work = self.scheduler.add(request)
        tracked = _Tracked(work, stream, logprobs=request.sampling.logprobs is not None)
        if isinstance(work, Sequence) and request.generates:
            tracked.detokenizer = IncrementalDetokenizer(
                self.tokenizer, request.prompt_ids, request.sampling.stop, request.sampling.skip_special_tokens)
        self._tracked[request.request_id] = tracked
        self.stats.on_arrival()
        self._wakeup.set()
        return stream

    def abort(self, request_id: str) -> None:
        """Cancels a request (client went away); frees its blocks. No-op once it finished."""
        tracked = self._tracked.get(request_id)
        if tracked is not None:
            self._end(tracked, "abort")

    # -- the loop ---------------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            step = self.scheduler.schedule()
            if step is None:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            started = time.perf_counter()
            self._in_flight = True
            try:
                outcome = await loop.run_in_executor(self._worker, execute_isolating, self.executor.execute,
                                                     step.batch)
            finally:
                self._in_flight = False
            self.stats.on_step(time.perf_counter() - started)
            if outcome.first_error is not None:
                step = self._fail_rows(step, outcome)
            self._process(self.scheduler.update(step, outcome.result))

    def _on_loop_exit(self, task: asyncio.Task) -> None:
        """An engine bug must not leave requests hanging: fail them all, loudly."""
        if task.cancelled() or task.exception() is None:
            return
        logger.error("engine loop died", exc_info=task.exception())
        for tracked in list(self._tracked.values()):
            self._tracked.pop(tracked.work.request.request_id, None)
            tracked.stream.put(EngineError(f"engine failed: {task.exception()!r}"))

    def _fail_rows(self, step: ScheduledStep, outcome: StepOutcome) -> ScheduledStep:
        """A step raised: fail only the requests whose rows raise alone; the rest go on."""
        step, failed = self.scheduler.fail_rows(step, set(outcome.failures))
        self.stats.on_step_failure(len(failed))
        logger.error("a step of %d rows raised; %d request(s) failed alone and were ended: %s",
                     len(prefill_rows(step.batch)) + len(decode_rows(step.batch)), len(failed),
                     ", ".join(w.request.request_id for w in failed) or "none (the retries passed)",
                     exc_info=outcome.first_error)
        for work in failed:
            tracked = self._tracked.pop(work.request.request_id, None)
            if tracked is not None:
                error = outcome.failures[work.seq_id]
                tracked.stream.put(EngineError(f"this request failed in the engine: {type(error).__name__}: {error}"))
        return step

    def _process(self, events: list[StepEvent]) -> None:
        now = time.monotonic()
        for work, result in events:
            tracked = self._tracked.get(work.request.request_id)
            if tracked is None:  # aborted while its step ran
                continue
            if tracked.first_token_time is None:
                tracked.first_token_time = now
                self.stats.on_first_token(work, now)
            out = self._output(tracked, result)
            if out.finished:
                del self._tracked[work.request.request_id]
                self.scheduler.finish(work)
                self.stats.on_finish(work, out.num_output_tokens, out.finish_reason, now)
                if logger.isEnabledFor(logging.DEBUG):
                    self._log_finished(tracked, out, now)
            if out.finished or out.token_ids or out.text:
                tracked.stream.put(out)

    def _output(self, tracked: _Tracked, result: RowResult) -> RequestOutput:
        """The increment one row's result adds to its request, and whether that ends it."""
        work, request = tracked.work, tracked.work.request
        out = RequestOutput(request.request_id, prompt_logprobs=result.prompt_logprobs, pooled=result.pooled,
                            scores=result.scores, label_logprobs=result.label_logprobs,
                            num_prompt_tokens=request.num_prompt_tokens, num_cached_tokens=work.num_cached_tokens)
        token = result.token
        reason = stop_reason = None
        if token is not None:
            out.token_ids = [token.token_id]
            if tracked.logprobs:
                out.logprobs = [token]
            reason, stop_reason = self._token_stop(request, token.token_id)
        out.num_output_tokens = work.num_output_tokens if isinstance(work, Sequence) else len(out.token_ids)
        detok = tracked.detokenizer
        if detok is not None and token is not None and reason is None:
            hit = detok.add(token.token_id)
            if hit is not None:
                reason, stop_reason = "stop", hit
        if reason is None and (not request.generates or out.num_output_tokens >= request.sampling.max_tokens):
            reason = "length"
        if detok is not None:
            out.text = detok.emit(final=reason is not None)
        elif token is not None and reason != "stop":  # the stop token itself is not output text
            out.text = self.tokenizer.decode(out.token_ids, request.sampling.skip_special_tokens)
        if reason is not None:
            out.finished, out.finish_reason, out.stop_reason = True, reason, stop_reason
        return out

    def _log_finished(self, tracked: _Tracked, out: RequestOutput, now: float) -> None:
        work = tracked.work
        arrival, scheduled = work.request.arrival_time, work.first_scheduled or now
        logger.debug("finished %s (%s): prompt %d, cached %d, output %d, queue %.1f ms, prefill %.1f ms, "
                     "total %.1f ms, %s", out.request_id, "oneshot" if isinstance(work, OneShotJob) else "decode",
                     out.num_prompt_tokens, out.num_cached_tokens, out.num_output_tokens,
                     1e3 * (scheduled - arrival), 1e3 * ((tracked.first_token_time or now) - scheduled),
                     1e3 * (now - arrival), out.finish_reason)

    def _token_stop(self, request: Request, token_id: int) -> tuple[str | None, int | None]:
        sampling = request.sampling
        if token_id in sampling.stop_token_ids:
            return "stop", token_id
        if not sampling.ignore_eos and token_id in self.eos_token_ids:
            return "stop", None
        return None, None

    def _end(self, tracked: _Tracked, reason: str) -> None:
        request_id = tracked.work.request.request_id
        if self._tracked.pop(request_id, None) is None:
            return
        self.scheduler.finish(tracked.work)
        self.stats.on_abort()
        tracked.stream.put(RequestOutput(request_id, finished=True, finish_reason=reason))
