"""Prefix reuse shared by both planners: the cached prefix a request may start from, and
leader/peer deferral (a request whose uncached prefix another request computes this tick waits
one tick for it, then computes only its suffix)."""
from __future__ import annotations

from typing import Sequence as Tokens

from prelude.cache.block_pool import BlockKey, BlockPool, PrefixMatch
from prelude.engine.plan import SchedulerStats
from prelude.engine.request import Request
from prelude.engine.work import Work


class PrefixSharing:
    def __init__(self, pool: BlockPool, stats: SchedulerStats):
        self.pool = pool
        self.stats = stats

    def match(self, request: Request, tokens: Tokens[int]) -> PrefixMatch:
        """The cached prefix usable for this request; at least one token is left to compute."""
        if request.needs_every_position:
            return self.pool.match((), 0)
        if request.item_lengths:  # only the shared part; its items are always left to compute
            return self.pool.match(tokens, max_blocks=request.cacheable_len // self.pool.block_size)
        return self.pool.match(tokens, max_blocks=(len(tokens) - 1) // self.pool.block_size)

    def defer(self, work: Work, match: PrefixMatch, pending: set[BlockKey]) -> bool:
        """Whether `work` waits one tick: a request planned this tick (its key is in `pending`)
        computes the same first uncached block. Each request defers at most once."""
        if match.miss_key is None or match.miss_key not in pending or work.deferred:
            return False
        work.deferred = True
        self.stats.num_deferrals += 1
        return True
