"""A point-in-time copy of the engine's counters: what /metrics and operators read, without
reaching into the scheduler, the block pool or the executors."""
from __future__ import annotations

import copy
from dataclasses import dataclass

from prelude.engine.plan import SchedulerStats
from prelude.engine.scheduler import Scheduler
from prelude.engine.stats import EngineStats


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    num_running: int  # Decode sequences holding KV blocks
    num_waiting: int
    num_waiting_tokens: int
    kv_blocks_total: int
    kv_blocks_in_use: int
    kv_blocks_cached: int
    kv_usage: float
    prefix_query_tokens: int
    prefix_hit_tokens: int
    scheduler: SchedulerStats
    stats: EngineStats
    preemptible_steps: int = 0  # long OneShot steps run so that they could step aside
    layer_preemptions: int = 0  # times such a step stepped aside (parked) for other work
    # Admitted rows neither waiting nor finished: Decode sequences and the OneShot rows of the
    # steps in flight. What a router reads as the requests running: OneShot rows hold no KV
    # across steps, so counting sequences alone showed a replica computing long embeddings
    # for seconds as idle (0 running, 0 waiting).
    num_rows_running: int = 0


def take_snapshot(scheduler: Scheduler, stats: EngineStats, preemptible_steps: int = 0, layer_preemptions: int = 0,
                  num_admitted: int = 0) -> EngineSnapshot:
    """`num_admitted`: rows the engine admitted that have not finished."""
    pool = scheduler.pool
    return EngineSnapshot(
        num_running=scheduler.num_running, num_waiting=scheduler.num_waiting,
        num_waiting_tokens=scheduler.num_waiting_tokens,
        kv_blocks_total=pool.num_blocks, kv_blocks_in_use=pool.num_used_blocks,
        kv_blocks_cached=pool.num_cached_blocks, kv_usage=pool.usage,
        prefix_query_tokens=pool.queries_tokens, prefix_hit_tokens=pool.hit_tokens,
        scheduler=copy.deepcopy(scheduler.stats), stats=copy.deepcopy(stats),
        preemptible_steps=preemptible_steps, layer_preemptions=layer_preemptions,
        num_rows_running=max(0, num_admitted - scheduler.num_waiting))
