"""The class-aware scheduler: each tick it turns waiting and running work into one typed
ForwardBatch, and after the step folds the results back in.

Order within a tick: running decodes first (one token each; the newest sequence, under priority
the least urgent, is preempted by recompute when blocks run out), then chunks of running
prefills, then waiting work in queue-policy order, each piece offered to its class's planner
(OneShotPlanner, DecodePlanner). So that no request waits for all of another's long work
(engine.preemption has the policy):
- beside running decodes, prompts come in chunks of MIN_PROMPT_CHUNK tokens (or STREAM_GAP_S);
- with layer preemption, a OneShot row longer than STREAM_GAP_S is not put beside running
  sequences: the next tick is a step of OneShot rows alone, which steps aside for the
  sequences' tokens;
- with layer preemption, short work does not join a long OneShot row's step: it runs while that
  step is parked;
- a row too big for what running decodes leave of the step budget (a OneShot row, a prompt that
  cannot be split) gets the next tick, without decodes: they take their share while any runs.

Never imports torch: it deals in token ids and block numbers only. It never decides that a
request ends; the engine does, and calls `release`.
"""
from __future__ import annotations

import time
from typing import Callable

from prelude.cache.block_pool import BlockPool
from prelude.contract.batch import BatchResult, DecodeBatch
from prelude.engine.cost_model import StepCostModel
from prelude.engine.decode_planner import DecodePlanner
from prelude.engine.oneshot_planner import OneShotPlanner
from prelude.engine.plan import (
    MIN_PROMPT_CHUNK,
    ScheduledStep,
    SchedulerStats,
    Skip,
    StepBudget,
    StepEvent,
)
from prelude.engine.policy import QueuePolicy, make_policy
from prelude.engine.preemption import STREAM_GAP_S, PreemptionPolicy
from prelude.engine.prefix_sharing import PrefixSharing
from prelude.engine.request import ExecutionClass, Request
from prelude.engine.scheduler_config import SchedulerConfig
from prelude.engine.tick import Offer, Tick
from prelude.engine.work import OneShotJob, Sequence, Work, WorkStatus


class Scheduler:
    def __init__(self, config: SchedulerConfig, pool: BlockPool, clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.pool = pool
        self.clock = clock
        self.costs = StepCostModel()
        self.preemption = PreemptionPolicy(config.layer_preemption, self.costs)
        self.waiting: QueuePolicy = make_policy(config.policy, pool, self.costs, clock)
        self.stats = SchedulerStats()
        prefix = PrefixSharing(pool, self.stats)
        self.oneshot = OneShotPlanner(pool, prefix, config.temp_bytes_per_token, config.temp_bytes_per_logits_row)
        self.decode = DecodePlanner(pool, prefix, config.max_num_seqs, self.waiting, self.stats)
        self._next_id = 0
        self._held_apart = False  # a row was kept out of a step with decodes: the next has none

    # -- admission and removal ------------------------------------------------------------
    def add(self, request: Request) -> Work:
        self._next_id += 1
        work: Work
        if request.execution_class(self.config.disable_oneshot) is ExecutionClass.ONESHOT:
            work = OneShotJob(self._next_id, request)
        else:
            work = Sequence(self._next_id, request)
        self.waiting.push(work)
        return work

    def release(self, work: Work) -> None:
        """Frees what ended work holds (the engine decided that it ended). Safe while a step
        including it is in flight: its blocks are not reused before that step's update, which
        skips it."""
        if work.status is WorkStatus.FINISHED:
            return
        if isinstance(work, Sequence):
            self.decode.release(work)
        elif work.status is WorkStatus.WAITING:
            self.waiting.remove(work)
        work.status = WorkStatus.FINISHED

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.decode.running)

    @property
    def num_waiting_tokens(self) -> int:
        return self.waiting.num_tokens

    def waiting_within(self, tokens: int) -> bool:
        """Whether some waiting work has at most `tokens` tokens left to compute."""
        return any(len(work.tokens_to_compute) <= tokens for work in self.waiting)

    def observe_step(self, step: ScheduledStep, seconds: float) -> None:
        """Calibrates the step cost model with a step the engine ran."""
        self.costs.observe(step.num_tokens, seconds)

    def _estimate(self, work: Work) -> float:
        """Seconds to compute the work: the ordering policy's estimate (from its uncached
        tokens) where it makes one, else all its tokens."""
        seconds = self.waiting.cost(work)
        return self.costs.estimate(len(work.tokens_to_compute)) if seconds is None else seconds

    def has_room(self, requests: list[Request]) -> bool:
        """Whether the waiting queue takes these requests without passing its limits."""
        return self.config.admits(len(self.waiting), self.waiting.num_tokens,
                                  len(requests), sum(r.num_prompt_tokens for r in requests))

    @property
    def full(self) -> bool:
        """The waiting queue is at a limit: has_room refuses any request, however small."""
        return self.config.at_limit(len(self.waiting), self.waiting.num_tokens)

    def late(self, now: float) -> list[Work]:
        """Waiting work that can no longer meet its deadline, even if it started now (only when
        shedding late requests is on; a preempted sequence met its deadline with its first token)."""
        if not self.config.shed_late:
            return []
        late = [w for w in self.waiting if (deadline := w.open_deadline) is not None
                and now + self._estimate(w) > deadline]
        self.stats.num_late += len(late)
        return late

    # -- one tick -------------------------------------------------------------------------
    def schedule(self) -> ScheduledStep | None:
        """The next step, within the configured budget (the engine loop's tick)."""
        return self._schedule(None)

    def schedule_short(self, max_tokens: int) -> ScheduledStep | None:
        """The step that runs while a long one is parked: running sequences' next tokens and short
        waiting work, at most `max_tokens` tokens. Even its first piece must fit; a piece that
        does not is passed over (later ones are still offered), and nothing is held apart for
        the next tick."""
        return self._schedule(min(max_tokens, self.config.max_num_batched_tokens))

    def _schedule(self, short_tokens: int | None) -> ScheduledStep | None:
        """`short_tokens`: None for a usual step, else the cap of a short step (schedule_short)."""
        if not self.waiting and not self.decode.running:
            self._held_apart = False
            return None
        tick = self._start_tick(short_tokens)
        for work in self.waiting:
            tokens = len(work.tokens_to_compute)
            if tick.apart is not None and tick.apart(isinstance(work, OneShotJob), tokens, tick.long_tokens,
                                                     tick.shortest):
                continue
            if isinstance(work, OneShotJob):
                offer = self._offer_oneshot(tick, work, tokens)
            else:
                offer = self._offer_sequence(tick, work)
            if offer is Offer.STOP:
                break
            if offer is Offer.TAKEN:
                tick.take(work, tokens)
        self.waiting.remove_many(tick.admitted)
        if tick.alone and not tick.rows:  # the held row went away meanwhile (aborted): a usual step
            return self._schedule(None)
        return tick.step(self.decode)

    def _start_tick(self, short_tokens: int | None) -> Tick:
        """The tick's budget and its running work: the running sequences' decodes and prompt
        chunks, none when the previous tick held a row apart (this one is that row's)."""
        short = short_tokens is not None
        now = self.clock()
        budget = StepBudget(self.config.max_num_batched_tokens if short_tokens is None else short_tokens,
                            self.config.temp_memory_budget, self.costs if self.config.policy == "edf" else None,
                            now, strict=short)
        alone = self._held_apart and not short  # OneShot rows and unsplittable prompts only
        self._held_apart = False
        decodes = [] if alone else self.decode.decodes(budget)
        if decodes and not short:  # the streams wait for this step's prompt chunks
            budget.prefill_left = max(MIN_PROMPT_CHUNK, self.costs.tokens_within(STREAM_GAP_S))
        chunks = [] if alone else self.decode.prefill_chunks(budget, decodes)
        # With layer preemption, short and long work go in separate steps (not beside streams).
        apart = self.preemption.apart if not short and not (decodes or chunks) else None
        return Tick(now, budget, short, alone, decodes, chunks, apart)

    def _offer_oneshot(self, tick: Tick, work: OneShotJob, tokens: int) -> Offer:
        """Plans a waiting OneShot row of `tokens` to compute into the tick, or says why not."""
        if tick.beside_streams and self.preemption.stalls_streams(tokens):
            self._held_apart = True
            return Offer.PASS
        planned = self.oneshot.plan(work, tick.budget, tick.pending)
        if planned is Skip.NO_ROOM:
            if tick.short:
                return Offer.PASS  # a step of short work looks past what does not fit
            if tick.only_streams_in_way:
                self._held_apart = True
            return Offer.STOP  # the step's token / temporary-memory budget is spent
        if planned is Skip.DEFERRED:
            return Offer.PASS
        tick.oneshots.append(planned)
        tick.rows.append(self.oneshot.row(planned))
        work.status = WorkStatus.RUNNING
        computed = len(tick.rows[-1].token_ids)  # the uncached ones
        if self.preemption.preemptible(computed):
            tick.long_tokens = max(tick.long_tokens, computed)
        return Offer.TAKEN

    def _offer_sequence(self, tick: Tick, work: Sequence) -> Offer:
        """Admits a waiting Decode sequence's first prompt chunk into the tick, or says why not."""
        if tick.decode_full or (tick.alone and not work.request.needs_every_position):
            return Offer.PASS
        row = self.decode.admit(work, tick.budget, tick.pending)
        if row is Skip.DEFERRED:
            return Offer.PASS
        if row is Skip.NO_ROOM:
            # Out of sequence slots or blocks: later Decode requests wait their turn, but OneShot
            # work behind it needs neither and is still admitted.
            if tick.only_streams_in_way and not tick.short and self.decode.fits_alone(work, tick.budget):
                self._held_apart = True
            tick.decode_full = True
            return Offer.PASS
        tick.prefills.append((work, len(row.token_ids)))
        tick.rows.append(row)
        return Offer.TAKEN

    def plan_ahead(self, in_flight: ScheduledStep) -> ScheduledStep | None:
        """The step to run right after `in_flight`, planned while it runs, when that is a step of
        the same sequences' next tokens: `in_flight` is a step of decodes only and no work waits
        (else None: the next step is scheduled once `in_flight` is folded back). Its rows' input
        tokens are the ones `in_flight` samples, which the worker fills in."""
        if not isinstance(in_flight.batch, DecodeBatch) or len(self.waiting) or self._held_apart:
            return None
        seqs = self.decode.ahead(in_flight.decodes)
        if seqs is None:
            return None
        return ScheduledStep(DecodeBatch([self.decode.ahead_row(s) for s in seqs]), [], [], seqs, len(seqs))

    # -- after the step -------------------------------------------------------------------
    def update(self, step: ScheduledStep, result: BatchResult) -> list[StepEvent]:
        """Folds a step's results into the work's state; returns the rows' results for the
        engine (work that ended while the step ran is skipped)."""
        self.stats.count(step)
        by_id = {r.seq_id: r for r in result.rows}
        events: list[StepEvent] = []
        for planned in step.oneshots:
            self.oneshot.complete(planned)
            if planned.job.status is WorkStatus.RUNNING:
                events.append(StepEvent(planned.job, by_id[planned.job.seq_id]))
        for seq, n in step.prefills:
            if seq.status is WorkStatus.RUNNING:
                self.decode.advance(seq, n)
                if seq.num_computed == seq.num_tokens:
                    events.append(StepEvent(seq, by_id[seq.seq_id]))
        for seq in step.decodes:
            # A row the worker dropped (decode_chain.with_sampled_tokens) computed nothing.
            if seq.status is WorkStatus.RUNNING and seq.seq_id in by_id:
                self.decode.advance(seq, 1)
                events.append(StepEvent(seq, by_id[seq.seq_id]))
        return events

    def fail_rows(self, step: ScheduledStep, seq_ids: set[int]) -> tuple[ScheduledStep, list[Work]]:
        """Ends the work whose rows failed in `step`, freeing its blocks unpublished (their KV is
        suspect); returns the step without that work, for `update`, and the work itself."""
        failed: list[Work] = []
        oneshots = []
        for planned in step.oneshots:
            if planned.job.seq_id not in seq_ids:
                oneshots.append(planned)
                continue
            self.oneshot.discard(planned)
            self.release(planned.job)
            failed.append(planned.job)
        for seq in [s for s, _ in step.prefills] + list(step.decodes):
            if seq.seq_id in seq_ids:
                self.release(seq)
                failed.append(seq)
        return step._replace(oneshots=oneshots), failed
