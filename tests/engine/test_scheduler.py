"""Scheduler behaviour with a fake executor: execution classes, budgets, prefix reuse, cold-prefix
deferral, preemption, and block accounting under randomized mixes."""
from __future__ import annotations

import random

import pytest

from prelude.cache.block_pool import BlockPool
from prelude.contract.batch import DecodeBatch, MixedBatch, OneShotBatch, decode_rows, prefill_rows
from prelude.contract.config import Config
from prelude.contract.sampling import SamplingParams
from prelude.engine.request import Request, Task
from prelude.engine.plan import MIN_PROMPT_CHUNK
from prelude.engine.scheduler import Scheduler
from prelude.engine.scheduler_config import SchedulerConfig
from prelude.engine.work import OneShotJob, Sequence, WorkStatus
from tests.engine.fakes import CountingExecutor

BS = 4


def make(num_blocks=64, **config) -> tuple[Scheduler, CountingExecutor]:
    """A scheduler in arrival order (the tests here state outcomes in it) unless told otherwise."""
    scheduler_config = SchedulerConfig.from_config(Config(**{"scheduling_policy": "fcfs", **config}))
    return Scheduler(scheduler_config, BlockPool(num_blocks, BS)), CountingExecutor()


def req(rid, prompt, max_tokens=1, **kw) -> Request:
    return Request(str(rid), list(prompt), SamplingParams(max_tokens=max_tokens, temperature=0), **kw)


def step(scheduler: Scheduler, executor: CountingExecutor):
    """One tick; ends work the way the engine does (OneShot after its row, Decode at max_tokens)."""
    planned = scheduler.schedule()
    if planned is None:
        return None
    end_like_the_engine(scheduler, scheduler.update(planned, executor.execute(planned.batch)))
    return planned


def end_like_the_engine(scheduler: Scheduler, events) -> None:
    """What the engine does with a step's events: append sampled tokens, and release work that
    is done (OneShot after its row, Decode at max_tokens)."""
    for work, result in events:
        if isinstance(work, Sequence) and result.token is not None:
            work.token_ids.append(result.token.token_id)
        if isinstance(work, OneShotJob) or work.num_output_tokens >= work.request.sampling.max_tokens:
            scheduler.release(work)


def drain(scheduler, executor, limit=10_000) -> int:
    steps = 0
    while step(scheduler, executor) is not None:
        steps += 1
        assert steps < limit, "scheduler made no progress"
    return steps


def held_by_sequences(scheduler: Scheduler) -> int:
    return len({b for s in scheduler.decode.running for b in s.blocks})


def test_one_token_request_is_oneshot_and_holds_nothing_after_its_step():
    scheduler, executor = make()
    work = scheduler.add(req(1, range(10)))
    assert isinstance(work, OneShotJob)
    planned = step(scheduler, executor)
    assert isinstance(planned.batch, OneShotBatch)
    # Only the two full blocks were filled, to be published; the partial tail had no block.
    assert len(planned.batch.rows[0].block_table) == 2
    assert scheduler.pool.num_used_blocks == 0
    assert scheduler.pool.num_cached_blocks == 2
    scheduler.pool.check_integrity()


def test_generation_request_runs_the_decode_lifecycle():
    scheduler, executor = make()
    work = scheduler.add(req(1, range(6), max_tokens=4))
    assert isinstance(work, Sequence)
    drain(scheduler, executor)
    kinds = [type(b) for b in executor.batches]
    assert kinds == [MixedBatch, DecodeBatch, DecodeBatch, DecodeBatch]
    assert work.token_ids[6:] == [6, 7, 8, 9]
    assert work.status is WorkStatus.FINISHED and scheduler.pool.num_used_blocks == 0


def test_embedding_and_prompt_logprob_requests_are_oneshot():
    scheduler, _ = make()
    assert isinstance(scheduler.add(req(1, range(5), task=Task.EMBED)), OneShotJob)
    assert isinstance(scheduler.add(req(2, range(5), max_tokens=0, prompt_logprobs=2)), OneShotJob)
    assert isinstance(scheduler.add(req(3, range(5), max_tokens=2)), Sequence)


def test_disable_oneshot_sends_everything_through_decode():
    scheduler, executor = make(disable_oneshot=True)
    work = scheduler.add(req(1, range(10)))
    assert isinstance(work, Sequence)
    drain(scheduler, executor)
    assert isinstance(executor.batches[0], MixedBatch)
    assert work.token_ids[-1] == 10


def test_second_request_sharing_three_blocks_computes_only_its_suffix():
    scheduler, executor = make()
    shared = list(range(100, 100 + 3 * BS))
    scheduler.add(req(1, shared + [1, 2]))
    drain(scheduler, executor)
    scheduler.add(req(2, shared + [7, 8, 9]))
    drain(scheduler, executor)
    assert executor.computed_tokens == [3 * BS + 2, 3]
    assert scheduler.pool.hit_tokens == 3 * BS


def test_cold_shared_prefix_peers_wait_one_tick_behind_the_leader():
    scheduler, executor = make()
    shared = list(range(200, 200 + 3 * BS))
    for i in range(4):
        scheduler.add(req(i, shared + [i, i + 1]))
    drain(scheduler, executor)
    assert scheduler.stats.num_deferrals == 3
    # Leader computes the prefix once; the three peers then compute two tokens each, together.
    assert executor.computed_tokens == [3 * BS + 2, 3 * 2]
    assert scheduler.pool.num_used_blocks == 0


def test_token_budget_chunks_long_prefills_beside_running_decodes():
    scheduler, executor = make(max_num_batched_tokens=8)
    scheduler.add(req(1, range(3), max_tokens=20))
    step(scheduler, executor)
    scheduler.add(req(2, range(50, 70), max_tokens=3))
    for _ in range(3):
        step(scheduler, executor)
    mixed = executor.batches[1:]
    assert all(isinstance(b, MixedBatch) and len(b.decodes) == 1 for b in mixed)
    assert [len(b.prefills[0].token_ids) for b in mixed] == [7, 7, 6]
    assert all(n <= 8 for n in executor.computed_tokens)
    drain(scheduler, executor)
    assert scheduler.pool.num_used_blocks == 0


def test_prompts_beside_running_decodes_come_in_chunks_the_streams_can_wait_for():
    """Beside running decodes a prompt is cut into chunks of MIN_PROMPT_CHUNK tokens or what the
    cost model says fits STREAM_GAP_S, if more; with no stream running it goes whole."""
    scheduler, executor = make(num_blocks=4096)
    for tokens in (100, 1000):  # 1 ms a token: 100 tokens fit the gap, so the floor applies
        scheduler.costs.observe(tokens, tokens * 1e-3)
    scheduler.add(req(1, range(3), max_tokens=20))
    step(scheduler, executor)
    length = 2 * MIN_PROMPT_CHUNK + 100
    scheduler.add(req(2, range(50, 50 + length), max_tokens=2))
    for _ in range(3):
        step(scheduler, executor)
    assert [len(b.prefills[0].token_ids) for b in executor.batches[1:]] == [MIN_PROMPT_CHUNK] * 2 + [100]
    assert all(isinstance(b, MixedBatch) and len(b.decodes) == 1 for b in executor.batches[1:])
    drain(scheduler, executor)
    scheduler.add(req(3, range(10_000, 10_000 + length), max_tokens=2))
    step(scheduler, executor)
    assert len(executor.batches[-1].prefills[0].token_ids) == length
    drain(scheduler, executor)
    assert scheduler.pool.num_used_blocks == 0


def test_oversize_oneshot_runs_alone_rather_than_never():
    scheduler, executor = make(max_num_batched_tokens=8)
    scheduler.add(req(1, range(30)))
    scheduler.add(req(2, range(3)))
    drain(scheduler, executor)
    assert executor.computed_tokens == [30, 3]


def test_preemption_by_recompute_when_blocks_run_out_and_outputs_unchanged():
    def run(num_blocks):
        scheduler, executor = make(num_blocks=num_blocks)
        works = [scheduler.add(req(i, range(i, i + 6), max_tokens=12)) for i in range(6)]
        drain(scheduler, executor)
        scheduler.pool.check_integrity()
        assert scheduler.pool.num_used_blocks == 0
        return [w.token_ids for w in works], scheduler.stats.num_preemptions

    roomy, none = run(64)
    tight, preemptions = run(12)
    assert none == 0 and preemptions > 0
    assert tight == roomy


@pytest.mark.parametrize("slow", [False, True])
def test_randomized_mix_with_aborts_and_failed_rows_keeps_block_accounting(slow):
    """`slow`: a cost model at 10 ms a token, so that most OneShot rows are long (they run in
    segments, short work goes apart from them, and they are held out of steps with decodes);
    some steps are the short steps run while a long one is parked."""
    rng = random.Random(7)
    scheduler, executor = make(num_blocks=40, max_num_batched_tokens=32, max_num_seqs=6)
    if slow:
        for tokens in (1, 10):
            scheduler.costs.observe(tokens, tokens * 1e-2)
    prefixes = [list(range(s * 50, s * 50 + rng.randrange(4, 20))) for s in range(4)]
    live = []
    for tick in range(600):
        if rng.random() < 0.4:
            if rng.random() < 0.8:
                prompt = rng.choice(prefixes) + [rng.randrange(1000) for _ in range(rng.randrange(1, 9))]
            else:  # short beside most
                prompt = [rng.randrange(1000) for _ in range(rng.randrange(1, 3))]
            live.append(scheduler.add(req(tick, prompt, max_tokens=rng.choice([0, 1, 1, 3, 8]))))
        if live and rng.random() < 0.1:
            scheduler.release(live.pop(rng.randrange(len(live))))
        planned = scheduler.schedule_short(4) if rng.random() < 0.2 else scheduler.schedule()
        if planned is not None and rng.random() < 0.05:  # some rows of the step raise alone
            rows = [*prefill_rows(planned.batch), *decode_rows(planned.batch)]
            culprits = {r.seq_id for r in rng.sample(rows, rng.randrange(1, len(rows) + 1))}
            planned, failed = scheduler.fail_rows(planned, culprits)
            for work in failed:
                if work in live:
                    live.remove(work)
        if planned is not None:
            if rng.random() < 0.05:  # abort while the step is in flight
                victim = rng.choice([s for s, _ in planned.prefills] + list(planned.decodes) or [None])
                if victim is not None:
                    scheduler.release(victim)
            end_like_the_engine(scheduler, scheduler.update(planned, executor.execute(planned.batch)))
        # Between steps the only blocks in use are Decode sequences': OneShot rows keep none.
        assert scheduler.pool.num_used_blocks == held_by_sequences(scheduler)
        scheduler.pool.check_integrity()
    drain(scheduler, executor)
    pool = scheduler.pool
    assert pool.num_used_blocks == 0
    assert pool.num_free_blocks == pool.num_blocks  # free + cached idle == total
