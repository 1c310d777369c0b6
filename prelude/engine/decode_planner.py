"""Plans Decode work: the running sequences' next tokens, chunked prefill of admitted prompts,
admission of waiting sequences by sequence slots and KV blocks, and preemption by recompute
when blocks run out (the newest sequence, under priority the least urgent, goes back to the
queue front)."""
from __future__ import annotations

from prelude.cache.block_pool import BlockKey, BlockPool, PrefixMatch
from prelude.contract.batch import SAMPLED_BY_PREVIOUS_STEP, DecodeRow, PrefillRow
from prelude.engine.plan import SchedulerStats, Skip, StepBudget
from prelude.engine.policy import QueuePolicy
from prelude.engine.prefix_sharing import PrefixSharing
from prelude.engine.work import Sequence, WorkStatus


class DecodePlanner:
    def __init__(self, pool: BlockPool, prefix: PrefixSharing, max_num_seqs: int,
                 waiting: QueuePolicy, stats: SchedulerStats):
        self.pool = pool
        self.prefix = prefix
        self.max_num_seqs = max_num_seqs
        self.waiting = waiting
        self.stats = stats
        self.running: list[Sequence] = []

    # -- running sequences ------------------------------------------------------------------
    def decodes(self, budget: StepBudget) -> list[Sequence]:
        """Running sequences in their decode phase that get a block for their next token. One
        already given its block may still be preempted for a later one (it leaves the list):
        under priority a less urgent one, which was older and so came first."""
        scheduled: list[Sequence] = []
        for seq in list(self.running):
            if seq.status is not WorkStatus.RUNNING or seq.prefilling:
                continue
            need = self.pool.blocks_for(seq.num_tokens) - len(seq.blocks)
            if need:  # a new block every block_size tokens; the other steps write into the last one
                if not self._make_room(need, seq, keep=[], decodes=scheduled):
                    continue
                seq.blocks.extend(self.pool.allocate(need))
            scheduled.append(seq)
            budget.take(1)
        return scheduled

    @staticmethod
    def decode_row(seq: Sequence) -> DecodeRow:
        return DecodeRow(seq.seq_id, seq.token_ids[-1], seq.num_tokens - 1, seq.blocks, seq.request.output,
                         seq.num_output_tokens, seq.token_ids if seq.request.sampling.penalizes else ())

    def ahead(self, in_flight: list[Sequence]) -> list[Sequence] | None:
        """The sequences of the step after `in_flight` (a step of decodes only, not yet folded
        back), given blocks for the token each samples there; None when that step must be
        scheduled afresh: another sequence runs (one prefilling), or a block is short (making
        room is a preemption, which only a scheduled step does). A sequence whose in-flight token
        is its last by length is left out; one whose token ends it (EOS, a stop token) is dropped
        by the worker once the token is known (decode_chain.with_sampled_tokens); one a stop
        string ends costs a wasted row, whose result is skipped. One that a grammar's forced
        tokens put back to prefilling (its row was dropped by the worker too) needs a chunk,
        which only a scheduled step gives."""
        seqs = [s for s in in_flight if s.status is WorkStatus.RUNNING]
        if not seqs or len(seqs) != len(self.running) or any(s.prefilling for s in seqs):
            return None
        seqs = [s for s in seqs if s.num_output_tokens + 1 < s.request.sampling.max_tokens]
        need = [self.pool.blocks_for(s.num_tokens + 1) - len(s.blocks) for s in seqs]
        if not seqs or not self.pool.can_allocate(sum(need)):
            return None
        for seq, n in zip(seqs, need):
            if n:
                seq.blocks.extend(self.pool.allocate(n))
        return seqs

    @staticmethod
    def ahead_row(seq: Sequence) -> DecodeRow:
        """The row of a sequence in the step after its in-flight one: its input is the token the
        in-flight step samples (filled in by the worker), one position later."""
        history = tuple(seq.token_ids) if seq.request.sampling.penalizes else ()
        return DecodeRow(seq.seq_id, SAMPLED_BY_PREVIOUS_STEP, seq.num_tokens, seq.blocks, seq.request.output,
                         seq.num_output_tokens + 1, history)

    def prefill_chunks(self, budget: StepBudget, decodes: list[Sequence]) -> list[tuple[Sequence, PrefillRow]]:
        """The next chunk of each running sequence still prefilling, while the budget lasts. A
        chunk short of blocks preempts the newest sequences, as ever, one decoding in this step
        too: it leaves `decodes`, whose rows would name the blocks it gave up. One chunked in
        this step is never preempted: its row already names its blocks."""
        chunks: list[tuple[Sequence, PrefillRow]] = []
        for seq in [s for s in self.running if s.prefilling]:
            if seq.status is not WorkStatus.RUNNING:  # preempted for an earlier chunk
                continue
            row = self._chunk(seq, budget, PrefixMatch([], None), admitting=False,
                              keep=[s for s, _ in chunks], decodes=decodes)
            if row is None:
                break
            chunks.append((seq, row))
        return chunks

    # -- admission ----------------------------------------------------------------------------
    def admit(self, seq: Sequence, budget: StepBudget, pending: set[BlockKey]) -> PrefillRow | Skip:
        """The first chunk of a waiting sequence, which then runs; or why it waits."""
        if len(self.running) >= self.max_num_seqs:
            return Skip.NO_ROOM
        match = self.prefix.match(seq.request, seq.token_ids)
        if self.prefix.defer(seq, match, pending):
            return Skip.DEFERRED
        row = self._chunk(seq, budget, match, admitting=True)
        if row is None:
            return Skip.NO_ROOM
        if match.miss_key is not None and len(seq.blocks) > len(match.blocks):
            pending.add(match.miss_key)
        seq.status = WorkStatus.RUNNING
        self.running.append(seq)
        return row

    def fits_alone(self, seq: Sequence, budget: StepBudget) -> bool:
        """Whether a waiting prompt that cannot be split (its outputs read every position) was
        refused for the step's token budget alone: a step without decodes would admit it."""
        return (seq.request.needs_every_position and not budget.fits(seq.num_tokens)
                and len(self.running) < self.max_num_seqs
                and self.pool.can_allocate(self.pool.blocks_for(seq.num_tokens) + 1))

    def _chunk(self, seq: Sequence, budget: StepBudget, match: PrefixMatch, admitting: bool,
               keep: list[Sequence] | None = None, decodes: list[Sequence] | None = None) -> PrefillRow | None:
        request = seq.request
        computed = seq.num_computed + len(match.blocks) * self.pool.block_size
        remaining = seq.num_tokens - computed
        # Rows whose outputs read every prompt position are never split.
        chunk = remaining if request.needs_every_position else min(remaining, budget.tokens_left, budget.prefill_left)
        if chunk <= 0 or not budget.fits(chunk, deadline=seq.open_deadline):
            return None
        self.pool.acquire(match.blocks)
        need = self.pool.blocks_for(computed + chunk) - len(seq.blocks) - len(match.blocks)
        # Admission keeps one block spare for running decodes (when any run: a request that
        # needs the whole pool must still be admissible); a running prefill may preempt.
        if admitting:
            room = self.pool.can_allocate(need + 1 if self.running else need)
        else:
            room = self._make_room(need, seq, keep=keep or [], decodes=decodes)
        if not room:
            self.pool.release(match.blocks)
            return None
        budget.take(chunk, deadline=seq.open_deadline)
        budget.prefill_left -= chunk
        if admitting:
            seq.blocks = list(match.blocks)
            seq.num_computed = computed
            seq.num_published = len(match.blocks)
            if seq.first_scheduled is None:
                seq.num_cached_tokens = computed
                self.pool.record_query(seq.num_tokens, computed)
        seq.blocks.extend(self.pool.allocate(need))
        last = computed + chunk == seq.num_tokens
        return PrefillRow(seq.seq_id, seq.token_ids[computed:computed + chunk], computed, seq.blocks,
                          seq.last_row_output if last else None, seq.num_output_tokens,
                          history=seq.token_ids if last and request.sampling.penalizes else ())

    # -- preemption ---------------------------------------------------------------------------
    def _make_room(self, need: int, seq: Sequence, keep: list[Sequence],
                   decodes: list[Sequence] | None = None) -> bool:
        """Preempts running sequences in the queue policy's order (the newest first; under
        priority, the least urgent) until `need` blocks are free, never those in `keep`; those
        in `decodes` leave it. False when `seq` itself had to go or nothing else could."""
        kept = set(map(id, keep))
        while not self.pool.can_allocate(need):
            candidates = [s for s in self.running if id(s) not in kept]
            if not candidates:
                return False
            victim = self.waiting.victim(candidates)
            self._preempt(victim)
            if decodes is not None and victim in decodes:
                decodes.remove(victim)
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
        seq.status = WorkStatus.WAITING
        # Its tokens and its open deadline changed since it last waited: the ordering policy's
        # estimate is made again (while the pool's cache is unchanged it would be kept).
        seq.estimate = None
        self.waiting.push_front(seq)
        self.stats.num_preemptions += 1

    # -- after the step -----------------------------------------------------------------------
    def advance(self, seq: Sequence, num_computed: int) -> None:
        """Records tokens computed in a step and publishes the blocks they filled."""
        seq.num_computed += num_computed
        full = seq.num_computed // self.pool.block_size
        if full > seq.num_published:
            self.pool.publish(seq.token_ids, seq.blocks, seq.num_published, full)
            seq.num_published = full

    def release(self, seq: Sequence) -> None:
        """Frees a running or waiting sequence's slot and blocks."""
        if seq.status is WorkStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self.pool.release(seq.blocks)
        seq.blocks = []
