"""Plans OneShot work: one forward per request, budgeted by prompt tokens and a temporary-memory
estimate, holding KV blocks only for its own step. Prefix-aware: a cached prefix is attached,
and the new full blocks are filled only to hand them to the prefix cache."""
from __future__ import annotations

from prelude.cache.block_pool import BlockKey, BlockPool
from prelude.contract.batch import PrefillRow
from prelude.engine.plan import PlannedOneShot, Skip, StepBudget
from prelude.engine.prefix_sharing import PrefixSharing
from prelude.engine.work import OneShotJob


class OneShotPlanner:
    def __init__(self, pool: BlockPool, prefix: PrefixSharing, temp_bytes_per_token: int,
                 temp_bytes_per_logits_row: int):
        self.pool = pool
        self.prefix = prefix
        self.temp_bytes_per_token = temp_bytes_per_token  # activations per computed token
        self.temp_bytes_per_logits_row = temp_bytes_per_logits_row

    def plan(self, job: OneShotJob, budget: StepBudget, pending: set[BlockKey]) -> PlannedOneShot | Skip:
        request = job.request
        prompt = request.prompt_ids
        bs = self.pool.block_size
        match = self.prefix.match(request, prompt)
        if self.prefix.defer(job, match, pending):
            return Skip.DEFERRED
        num_cached = len(match.blocks)
        suffix = len(prompt) - num_cached * bs
        logits_rows = len(prompt) if request.prompt_logprobs is not None else max(1, len(request.item_lengths))
        temp = suffix * self.temp_bytes_per_token + logits_rows * self.temp_bytes_per_logits_row
        if not budget.fits(suffix, temp, job.open_deadline):
            return Skip.NO_ROOM
        budget.take(suffix, temp, job.open_deadline)
        self.pool.acquire(match.blocks)
        self.pool.record_query(len(prompt), num_cached * bs)
        job.num_cached_tokens = num_cached * bs
        # Without room for the new full blocks the row computes without storing them: OneShot
        # work never waits for KV blocks.
        new_full = request.cacheable_len // bs - num_cached if self.pool.enable_prefix_caching else 0
        new_blocks = self.pool.allocate(new_full) if 0 < new_full and self.pool.can_allocate(new_full) else []
        if new_blocks and match.miss_key is not None:
            pending.add(match.miss_key)
        return PlannedOneShot(job, match.blocks + new_blocks, num_cached)

    def row(self, planned: PlannedOneShot) -> PrefillRow:
        request = planned.job.request
        start = planned.num_cached_blocks * self.pool.block_size
        computed = request.prompt_ids[start:] if start else request.prompt_ids  # read-only: no copy needed
        return PrefillRow(planned.job.seq_id, computed, start, planned.blocks, request.output,
                          item_lengths=request.item_lengths,
                          history=request.prompt_ids if request.sampling.penalizes else ())

    def complete(self, planned: PlannedOneShot) -> None:
        """After its step: the full prompt blocks go to the prefix cache, and the row lets go."""
        prompt = planned.job.request.prompt_ids
        self.pool.publish(prompt, planned.blocks, planned.num_cached_blocks, len(planned.blocks))
        self.pool.release(planned.blocks)

    def discard(self, planned: PlannedOneShot) -> None:
        """After a step in which this row raised: its blocks are released unpublished."""
        self.pool.release(planned.blocks)
