"""The class-aware scheduler: each tick it turns waiting and running work into one typed
ForwardBatch, and after the step folds the results back in.

Order within a tick: running decodes first (one token each; the newest sequence is preempted by
recompute when blocks run out), then chunks of running prefills, then waiting work in queue-policy
order. OneShot work is budgeted by prompt tokens and a temporary-memory estimate and holds blocks
only for its own step; Decode work is budgeted by sequences and KV blocks.

Never imports torch: it deals in token ids and block numbers only.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NamedTuple, Union

from prelude.cache.block_pool import BlockKey, BlockPool, PrefixMatch
from prelude.engine.batch import (
    BatchResult,
    DecodeBatch,
    DecodeRow,
    ForwardBatch,
    MixedBatch,
    OneShotBatch,
    PrefillRow,
    RowResult,
)
from prelude.engine.policy import POLICIES
from prelude.engine.request import ExecutionClass, Request, classify
from prelude.engine.sequence import Sequence, SeqStatus


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    disable_oneshot: bool = False
    policy: str = "fcfs"
    # OneShot temporaries: activation bytes per computed token, bytes per row of logits, and the
    # budget one step's rows may take together.
    temp_bytes_per_token: int = 0
    temp_bytes_per_logits_row: int = 0
    temp_memory_budget: int = 1 << 62


class OneShotJob:
    """A waiting OneShot request. It holds KV blocks only during its own step: no decode-loop
    record, no future-token reservation."""

    __slots__ = ("seq_id", "request", "deferred", "aborted", "first_scheduled", "num_cached_tokens")

    def __init__(self, seq_id: int, request: Request):
        self.seq_id = seq_id
        self.request = request
        self.deferred = False
        self.aborted = False
        self.first_scheduled: float | None = None
        self.num_cached_tokens = 0


Work = Union[OneShotJob, Sequence]


class OneShotWork(NamedTuple):
    job: OneShotJob
    blocks: list[int]  # attached cached blocks, then the new full blocks this step fills
    num_cached_blocks: int


class ScheduledStep(NamedTuple):
    batch: ForwardBatch
    oneshots: list[OneShotWork]
    prefills: list[tuple[Sequence, int]]  # (sequence, tokens computed this step)
    decodes: list[Sequence]


class StepEvent(NamedTuple):
    """One row's result handed back to the engine."""

    work: Work
    result: RowResult


class StepBudget:
    """Token and temporary-memory budget of one step; admits or refuses one piece at a time.
    The first piece always fits, so an oversize OneShot row runs alone rather than never."""

    def __init__(self, tokens: int, temp_bytes: int):
        self.tokens_left = tokens
        self.temp_left = temp_bytes
        self.empty = True

    def fits(self, tokens: int, temp_bytes: int = 0) -> bool:
        return self.empty or (tokens <= self.tokens_left and temp_bytes <= self.temp_left)

    def take(self, tokens: int, temp_bytes: int = 0) -> None:
        self.tokens_left -= tokens
        self.temp_left -= temp_bytes
        self.empty = False


@dataclass(slots=True)
class SchedulerStats:
    num_preemptions: int = 0
    num_deferrals: int = 0
    num_oneshot_rows: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    steps: dict[str, int] = field(default_factory=lambda: {"oneshot": 0, "decode": 0, "mixed": 0})


_DEFER = object()  # planning result: skip this request for one tick


class Scheduler:
    def __init__(self, config: SchedulerConfig, pool: BlockPool):
        self.config = config
        self.pool = pool
        self.waiting = POLICIES[config.policy]()
        self.running: list[Sequence] = []
        self.stats = SchedulerStats()
        self._next_id = 0

    # -- admission and removal ------------------------------------------------------------
    def add(self, request: Request) -> Work:
        self._next_id += 1
        if classify(request, self.config.disable_oneshot) is ExecutionClass.ONESHOT:
            work: Work = OneShotJob(self._next_id, request)
        else:
            work = Sequence(self._next_id, request)
        self.waiting.push(work)
        return work

    def finish(self, work: Work) -> None:
        """Ends work (normally or not) and frees what it holds. Safe while a step including it is
        in flight: its blocks are not reused before that step's update, which skips it."""
        if isinstance(work, OneShotJob):
            if not work.aborted and work.first_scheduled is None:
                self.waiting.remove(work)
            work.aborted = True
            return
        if work.status is SeqStatus.FINISHED:
            return
        if work.status is SeqStatus.RUNNING:
            self.running.remove(work)
        else:
            self.waiting.remove(work)
        work.status = SeqStatus.FINISHED
        self.pool.release(work.blocks)
        work.blocks = []

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    # -- one tick -------------------------------------------------------------------------
    def schedule(self) -> ScheduledStep | None:
        budget = StepBudget(self.config.max_num_batched_tokens, self.config.temp_memory_budget)
        decodes = self._schedule_decodes(budget)
        prefills: list[tuple[Sequence, int]] = []
        rows: list[PrefillRow] = []
        for seq in [s for s in self.running if s.prefilling]:
            row = self._plan_chunk(seq, budget, None)
            if row is None:
                break
            prefills.append((seq, len(row.token_ids)))
            rows.append(row)

        oneshots: list[OneShotWork] = []
        pending: set[BlockKey] = set()  # first uncached block of each prefix computed this tick
        admitted: list[Work] = []
        decode_full = False  # no more Decode admissions this tick; OneShot work can still go
        now = time.monotonic()
        for work in self.waiting:
            if isinstance(work, OneShotJob):
                planned = self._plan_oneshot(work, budget, pending)
                if planned is None:
                    break  # the step's token / temporary-memory budget is spent
                if planned is _DEFER:
                    continue
                oneshots.append(planned)
                rows.append(self._oneshot_row(planned))
            else:
                if decode_full:
                    continue
                planned = self._plan_chunk(work, budget, pending) \
                    if len(self.running) < self.config.max_num_seqs else None
                if planned is _DEFER:
                    continue
                if planned is None:
                    # Out of sequence slots or blocks: later Decode requests wait their turn, but
                    # OneShot work behind it needs neither and is still admitted.
                    decode_full = True
                    continue
                work.status = SeqStatus.RUNNING
                self.running.append(work)
                prefills.append((work, len(planned.token_ids)))
                rows.append(planned)
            if work.first_scheduled is None:
                work.first_scheduled = now
            admitted.append(work)
        self.waiting.remove_many(admitted)

        if not rows and not decodes:
            return None
        decode_rows = [
            DecodeRow(s.seq_id, s.token_ids[-1], s.num_tokens - 1, s.blocks,
                      s.request.output_spec(sample_step=s.num_output_tokens))
            for s in decodes
        ]
        if not rows:
            batch: ForwardBatch = DecodeBatch(decode_rows)
            kind = "decode"
        elif not decode_rows and not prefills:
            batch = OneShotBatch(rows)
            kind = "oneshot"
        else:
            batch = MixedBatch(rows, decode_rows)
            kind = "mixed"
        self.stats.steps[kind] += 1
        self.stats.num_oneshot_rows += len(oneshots)
        self.stats.prefill_tokens += sum(len(r.token_ids) for r in rows)
        self.stats.decode_tokens += len(decode_rows)
        return ScheduledStep(batch, oneshots, prefills, decodes)

    def _schedule_decodes(self, budget: StepBudget) -> list[Sequence]:
        scheduled: list[Sequence] = []
        for seq in list(self.running):
            if seq.status is not SeqStatus.RUNNING or seq.prefilling:
                continue
            need = self.pool.blocks_for(seq.num_tokens) - len(seq.blocks)
            if not self._make_room(need, seq, keep=scheduled):
                continue
            seq.blocks.extend(self.pool.allocate(need))
            scheduled.append(seq)
            budget.take(1)
        return scheduled

    def _make_room(self, need: int, seq: Sequence, keep: list[Sequence]) -> bool:
        """Preempts the newest running sequences (never those in `keep`) until `need` blocks are
        free. False when `seq` itself had to go or nothing else could."""
        while not self.pool.can_allocate(need):
            victim = next((s for s in reversed(self.running) if s not in keep), None)
            if victim is None:
                return False
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        """Sends a running sequence back to the queue front; it recomputes from its tokens (much
        of which the prefix cache usually still holds)."""
        self.running.remove(seq)
        self.pool.release(seq.blocks)
        seq.blocks = []
        seq.num_computed = 0
        seq.num_published = 0
        seq.status = SeqStatus.WAITING
        self.waiting.push_front(seq)
        self.stats.num_preemptions += 1

    def _match(self, request: Request, tokens: list[int]) -> PrefixMatch:
        """The cached prefix usable for this request; at least one token is left to compute."""
        if request.needs_every_position:
            return self.pool.match((), 0)
        return self.pool.match(tokens, max_blocks=(len(tokens) - 1) // self.pool.block_size)

    def _defer(self, work: Work, match: PrefixMatch, pending: set[BlockKey]) -> bool:
        """A request planned this tick computes the same uncached prefix: wait one tick for it,
        then plan only the suffix."""
        if match.miss_key is None or match.miss_key not in pending or work.deferred:
            return False
        work.deferred = True
        self.stats.num_deferrals += 1
        return True

    def _plan_oneshot(self, job: OneShotJob, budget: StepBudget, pending: set[BlockKey]):
        request = job.request
        prompt = request.prompt_ids
        bs = self.pool.block_size
        match = self._match(request, prompt)
        if self._defer(job, match, pending):
            return _DEFER
        num_cached = len(match.blocks)
        suffix = len(prompt) - num_cached * bs
        logits_rows = len(prompt) if request.prompt_logprobs is not None else 1
        temp = suffix * self.config.temp_bytes_per_token + logits_rows * self.config.temp_bytes_per_logits_row
        if not budget.fits(suffix, temp):
            return None
        budget.take(suffix, temp)
        self.pool.acquire(match.blocks)
        self.pool.record_query(len(prompt), num_cached * bs)
        job.num_cached_tokens = num_cached * bs
        # New full blocks are filled only to hand them to the prefix cache; without room the row
        # computes without storing: OneShot work never waits for KV blocks.
        new_full = len(prompt) // bs - num_cached if self.pool.enable_prefix_caching else 0
        new_blocks = self.pool.allocate(new_full) if 0 < new_full and self.pool.can_allocate(new_full) else []
        if new_blocks and match.miss_key is not None:
            pending.add(match.miss_key)
        return OneShotWork(job, match.blocks + new_blocks, num_cached)

    def _oneshot_row(self, work: OneShotWork) -> PrefillRow:
        request = work.job.request
        start = work.num_cached_blocks * self.pool.block_size
        return PrefillRow(work.job.seq_id, request.prompt_ids[start:], start, work.blocks, request.output_spec())

    def _plan_chunk(self, seq: Sequence, budget: StepBudget, pending: set[BlockKey] | None):
        """Next prefill chunk of a sequence; `pending` is given when admitting it from the queue."""
        request = seq.request
        admitting = pending is not None
        match = self._match(request, seq.token_ids) if admitting else PrefixMatch([], None)
        if admitting and self._defer(seq, match, pending):
            return _DEFER
        computed = seq.num_computed + len(match.blocks) * self.pool.block_size
        remaining = seq.num_tokens - computed
        # Rows whose outputs read every prompt position are never split.
        chunk = remaining if request.needs_every_position else min(remaining, budget.tokens_left)
        if chunk <= 0 or not budget.fits(chunk):
            return None
        self.pool.acquire(match.blocks)
        need = self.pool.blocks_for(computed + chunk) - len(seq.blocks) - len(match.blocks)
        if admitting:
            room = self.pool.can_allocate(need + 1)  # keep one block spare for running decodes
        else:
            room = self._make_room(need, seq, keep=[])
        if not room:
            self.pool.release(match.blocks)
            return None
        budget.take(chunk)
        if admitting:
            seq.blocks = list(match.blocks)
            seq.num_computed = computed
            seq.num_published = len(match.blocks)
            if seq.first_scheduled is None:
                seq.num_cached_tokens = computed
                self.pool.record_query(seq.num_tokens, computed)
            if match.miss_key is not None and need > 0:
                pending.add(match.miss_key)
        seq.blocks.extend(self.pool.allocate(need))
        last = computed + chunk == seq.num_tokens
        output = request.output_spec(sample_step=seq.num_output_tokens) if last else None
        return PrefillRow(seq.seq_id, seq.token_ids[computed:computed + chunk], computed, seq.blocks, output)

    # -- after the step -------------------------------------------------------------------
    def update(self, step: ScheduledStep, result: BatchResult) -> list[StepEvent]:
        by_id = {r.seq_id: r for r in result.rows}
        events: list[StepEvent] = []
        for work in step.oneshots:
            prompt = work.job.request.prompt_ids
            self.pool.publish(prompt, work.blocks, work.num_cached_blocks, len(work.blocks))
            self.pool.release(work.blocks)
            if not work.job.aborted:
                events.append(StepEvent(work.job, by_id[work.job.seq_id]))
        for seq, n in step.prefills:
            if seq.status is not SeqStatus.RUNNING:
                continue
            seq.num_computed += n
            self._publish(seq)
            if seq.num_computed == seq.num_tokens:
                events.append(self._append(seq, by_id[seq.seq_id]))
        for seq in step.decodes:
            if seq.status is not SeqStatus.RUNNING:
                continue
            seq.num_computed += 1
            self._publish(seq)
            events.append(self._append(seq, by_id[seq.seq_id]))
        return events

    def fail_rows(self, step: ScheduledStep, seq_ids: set[int]) -> tuple[ScheduledStep, list[Work]]:
        """Ends the work whose rows failed in `step`, freeing its blocks unpublished (their KV is
        suspect); returns the step without that work, for `update`, and the work itself."""
        failed: list[Work] = []
        oneshots = []
        for work in step.oneshots:
            if work.job.seq_id in seq_ids:
                self.pool.release(work.blocks)
                work.job.aborted = True
                failed.append(work.job)
            else:
                oneshots.append(work)
        for seq in [s for s, _ in step.prefills] + list(step.decodes):
            if seq.seq_id in seq_ids:
                self.finish(seq)
                failed.append(seq)
        return step._replace(oneshots=oneshots), failed

    def _append(self, seq: Sequence, result: RowResult) -> StepEvent:
        if result.token is not None:
            seq.token_ids.append(result.token.token_id)
        return StepEvent(seq, result)

    def _publish(self, seq: Sequence) -> None:
        full = seq.num_computed // self.pool.block_size
        if full > seq.num_published:
            self.pool.publish(seq.token_ids, seq.blocks, seq.num_published, full)
            seq.num_published = full
