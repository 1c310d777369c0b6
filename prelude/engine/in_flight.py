"""The requests in flight: each admitted request's stream and engine-side state, from admission
until it ends. Every end goes through `finish` (a normal end, an abort, a failed row, a missed
deadline, shutdown), so a request's blocks are freed and its end counted in one place."""
from __future__ import annotations

import time
from typing import Callable

from prelude.engine.output import EngineError, FinishReason, RequestOutput, RequestStream
from prelude.engine.plan import StepEvent
from prelude.engine.scheduler import Scheduler
from prelude.engine.stats import EngineStats
from prelude.engine.tracking import Tracked, advance
from prelude.engine.work import Work
from prelude.tokenizer import Tokenizer


class InFlight:
    def __init__(self, scheduler: Scheduler, tokenizer: Tokenizer, eos_token_ids: tuple[int, ...],
                 stats: EngineStats, clock: Callable[[], float] = time.monotonic):
        self._scheduler = scheduler
        self._clock = clock
        self._tokenizer = tokenizer
        self._eos_token_ids = frozenset(eos_token_ids)
        self._stats = stats
        # By seq_id, not request_id: a client's X-Request-Id names its request, and a retry sent
        # while the first attempt still runs reuses it (vLLM keeps the name, not as the key).
        self._tracked: dict[int, Tracked] = {}

    def __len__(self) -> int:
        return len(self._tracked)

    def admit(self, work: Work) -> RequestStream:
        tracked = Tracked.admit(work, self._tokenizer)
        self._tracked[work.seq_id] = tracked
        self._stats.on_arrival()
        return tracked.stream

    def deliver(self, events: list[StepEvent], beside_decodes: bool = False) -> None:
        """Puts a step's row results on their requests' streams, and ends the requests they end.
        `beside_decodes`: the step ran prompts beside other requests' decodes (a Mixed step)."""
        now = self._clock()
        for work, result in events:
            tracked = self._tracked.get(work.seq_id)
            if tracked is None:  # ended while its step ran
                continue
            if tracked.first_token_time is None:
                tracked.first_token_time = now
                tracked.mixed = beside_decodes
                tracked.stream.metrics = tracked.metrics(now)
                self._stats.on_first_token(work, now)
            elif result.token is not None and tracked.last_token_time is not None:
                self._stats.inter_token.observe(now - tracked.last_token_time)
            if result.token is not None:
                tracked.last_token_time = now
            out, reason = advance(tracked, result, self._eos_token_ids)
            self._stats.generation_tokens += len(out.token_ids)
            if reason is not None:
                out.metrics = tracked.stream.metrics
            if out.token_ids or out.text or reason is not None:
                tracked.stream.put(out)
            if reason is not None:
                self.finish(work.seq_id, reason, now=now, num_output_tokens=out.num_output_tokens)

    def finish(self, seq_id: int, reason: FinishReason, error: EngineError | None = None,
               now: float | None = None, num_output_tokens: int = 0) -> None:
        """Ends a request, whatever ended it: frees what it holds, counts it, and closes its
        stream (the last output of a normal end was already put on it). No-op once it ended."""
        tracked = self._tracked.pop(seq_id, None)
        if tracked is None:
            return
        work = tracked.work
        self._scheduler.release(work)
        now = self._clock() if now is None else now
        self._stats.on_finish(work, num_output_tokens, reason, now, tracked.first_token_time)
        if error is not None:
            tracked.stream.put(error)
        elif reason is FinishReason.ABORT:  # with its counts, which the merged answer and the access log keep
            tracked.stream.put(RequestOutput(work.request.request_id, finished=True, finish_reason=reason,
                                             num_prompt_tokens=work.request.num_prompt_tokens,
                                             num_output_tokens=work.num_output_tokens,
                                             metrics=tracked.stream.metrics or tracked.metrics(now)))

    def end_all(self, error: EngineError) -> None:
        for seq_id in list(self._tracked):
            self.finish(seq_id, FinishReason.ERROR, error)

    def fail_all(self, error: EngineError) -> None:
        """The engine loop died: every client gets the error now. Nothing is released, as the
        scheduler's state is not to be trusted any more."""
        for tracked in self._tracked.values():
            tracked.stream.put(error)
        self._tracked.clear()
