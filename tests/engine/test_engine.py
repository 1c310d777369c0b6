"""The engine in-process over a SimulatedExecutor on a FakeClock: which request a KV shortage
preempts under priority, that preemption leaves every answer as it is alone, deadlines
(X-Deadline-Ms: for the first token or the OneShot result, and --shed-late-requests sheds only
work that has given none), failures isolated to the request whose row raised, and a request
arriving beside a long generation. Asserted on outputs, the order requests end in and the
engine's counters."""
from __future__ import annotations

import asyncio
import random

import pytest

from prelude.contract.batch import decode_rows
from prelude.engine.output import DeadlineExceeded, EngineError
from prelude.engine.request import Request, Task
from prelude.contract.sampling import SamplingParams
from prelude.executor.executors import Executors
from tests.engine.fakes import PoisonedExecutor
from tests.engine.simulated import Ends, embed, generate, run, simulated_engine, until


def test_under_priority_a_kv_shortage_preempts_the_least_urgent_not_the_newest():
    """Three low-priority streams and an urgent one admitted just after them outgrow 60 blocks of
    4. Preempting the newest running (the urgent one) made the most urgent request end last."""
    engine, _ = simulated_engine(scheduling_policy="priority", block_size=4, num_kv_blocks=60)
    ends = Ends()

    async def scenario() -> None:
        low = [engine.submit(generate(f"low{i}", [100 * (i + 1), 7], 100, priority=10)) for i in range(3)]
        for stream in low:
            await stream.first()  # all three run
        urgent = engine.submit(generate("urgent", [400, 2, 3], 100, priority=-10))
        await asyncio.gather(*(ends.watch(s) for s in (*low, urgent)))

    run(engine, scenario)
    assert engine.snapshot().scheduler.num_preemptions > 0, "the pool never ran out: nothing was tested"
    assert not ends.errors and ends.order[-1] != "urgent", ends.order


def _mixed_jobs(seed: int = 5) -> list[Request]:
    """Generations of various lengths (some sharing a prefix), embeddings and scores."""
    rng = random.Random(seed)
    shared = [rng.randrange(3, 500) for _ in range(24)]
    jobs = []
    for i in range(30):
        prompt = (shared if i % 3 == 0 else []) + [rng.randrange(3, 500) for _ in range(rng.randrange(2, 30))]
        if i % 5 == 4:
            jobs.append(Request(f"score{i}", prompt, SamplingParams(max_tokens=0), task=Task.SCORE,
                                label_token_ids=(5, 9)))
        elif i % 7 == 6:
            jobs.append(embed(f"embed{i}", len(prompt), start=prompt[0]))
        else:
            jobs.append(generate(f"gen{i}", prompt, rng.randrange(8, 48)))
    return jobs


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_answers_under_repeated_preemption_equal_answers_alone(prefix_caching):
    """40 blocks of 4 hold about two of the generations at their longest; steps of 64 tokens cut
    prompts into chunks beside the decodes."""
    settings = dict(block_size=4, num_kv_blocks=40, max_num_batched_tokens=64, max_num_seqs=8,
                    enable_prefix_caching=prefix_caching)
    jobs = _mixed_jobs()

    def answers(together: bool) -> tuple[dict[str, list[int]], int]:
        engine, _ = simulated_engine(**settings)

        async def scenario() -> dict[str, list[int]]:
            if together:
                outs = await asyncio.gather(*(engine.submit(job).collect() for job in jobs))
            else:
                outs = [await engine.submit(job).collect() for job in jobs]
            return {job.request_id: out.token_ids for job, out in zip(jobs, outs)}

        got = run(engine, scenario)
        return got, engine.snapshot().scheduler.num_preemptions

    together, preemptions = answers(together=True)
    alone, _ = answers(together=False)
    assert preemptions > 0
    assert together == alone


def test_a_request_that_can_no_longer_meet_its_deadline_is_shed_before_it_runs():
    engine, executor = simulated_engine(shed_late_requests=True)
    clock = executor.clock

    async def scenario() -> tuple[Exception | None, list[int]]:
        late = engine.submit(generate("late", [5, 6, 7], 8, deadline=clock() + 1e-6))
        met = engine.submit(generate("met", [5, 6, 7], 8, deadline=clock() + 20))
        try:
            await late.collect()
            error = None
        except EngineError as exc:
            error = exc
        return error, (await met.collect()).token_ids

    error, met = run(engine, scenario)
    assert isinstance(error, DeadlineExceeded)
    assert len(met) == 8
    assert engine.snapshot().scheduler.num_late == 1


DEADLINE_S = 0.02  # 20 decode steps at the prior's cost


def test_a_stream_preempted_after_its_first_token_is_not_shed():
    """The deadline is for the first token: six streams of 150 tokens outgrow 100 blocks of 4, the
    newest are preempted for recompute long after their deadline, and all of them end whole."""
    engine, executor = simulated_engine(block_size=4, num_kv_blocks=100, shed_late_requests=True)
    clock = executor.clock
    ends = Ends()

    async def scenario() -> None:
        streams = [engine.submit(generate(f"s{i}", [10 * i + 3, 4, 5], 150, deadline=clock() + 0.3))
                   for i in range(6)]
        await asyncio.gather(*(ends.watch(s) for s in streams))

    run(engine, scenario)
    assert engine.snapshot().scheduler.num_preemptions > 0
    assert clock() > 1000 + 5 * DEADLINE_S  # the preempted streams waited long past it
    assert engine.snapshot().scheduler.num_late == 0
    assert not ends.errors and all(len(out.token_ids) == 150 for out in ends.outputs.values())


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_under_edf_a_stream_preempted_after_its_first_token_goes_before_later_work(prefix_caching):
    """A stream preempted after its first token has met its deadline: ordered by it still (a
    generous one), it went behind every request without one that arrived before then, and
    stalled mid-answer. 32 blocks of 4 hold one 108-token sequence, not two."""
    engine, executor = simulated_engine(scheduling_policy="edf", block_size=4, num_kv_blocks=32,
                                        enable_prefix_caching=prefix_caching)
    clock = executor.clock
    ends = Ends()

    async def scenario() -> None:
        first = engine.submit(generate("first", [11, 12, 13, 14, 15, 16, 17, 18], 100))
        await first.first()
        early = engine.submit(generate("early", [21, 22, 23, 24, 25, 26, 27, 28], 100, deadline=clock() + 1e5))
        watched = [ends.watch(first), ends.watch(early)]
        await until(lambda: any(w.request.request_id == "early" and w.num_output_tokens
                                for w in engine.scheduler.waiting))
        later = engine.submit(generate("later", [31, 32, 33, 34, 35, 36, 37, 38], 100))
        await asyncio.gather(*watched, ends.watch(later))

    run(engine, scenario)
    assert not ends.errors
    assert ends.order.index("early") < ends.order.index("later"), ends.order


def test_a_poisoned_row_fails_only_its_own_request():
    """A step holding a row that raises is retried in halves: the poisoned requests end with the
    error, every other request with the answer it gets alone, and the engine goes on."""
    poison = 999
    good = [generate(f"good{i}", [3 + i, 40, 50 + i], 4) for i in range(8)]
    embeds = [embed(f"embed{i}", 6, start=i) for i in range(4)]
    bad = [generate("bad0", [3, 40, poison], 4), generate("bad1", [4, 40, poison], 4),
           Request("bad-embed", [7, 8, poison], SamplingParams(max_tokens=0), task=Task.EMBED)]

    def answers(requests: list[Request], poisoned: bool):
        engine, executor = simulated_engine()
        hook = PoisonedExecutor(executor, poison)
        if poisoned:
            engine.executors = Executors(hook, hook, hook)  # type: ignore[arg-type]
        ends = Ends()

        async def scenario() -> None:
            await asyncio.gather(*(ends.watch(s) for s in engine.submit_all(requests)))
            again = await engine.submit(generate("again", [3, 40, 50], 4)).collect()  # still serving
            assert again.token_ids == [51, 52, 53, 54]

        run(engine, scenario)
        return ends, hook.raised, engine.snapshot().stats

    alone, _, _ = answers(good + embeds, poisoned=False)
    ends, raised, stats = answers(good + bad + embeds, poisoned=True)
    assert raised > 0
    assert {rid: out.token_ids for rid, out in ends.outputs.items()} == \
        {rid: out.token_ids for rid, out in alone.outputs.items()}
    assert {rid: out.pooled for rid, out in ends.outputs.items()} == \
        {rid: out.pooled for rid, out in alone.outputs.items()}
    assert sorted(ends.errors) == ["bad-embed", "bad0", "bad1"]
    assert all("injected fault" in str(e) for e in ends.errors.values())
    assert stats.failed_requests == 3 and stats.failed_steps >= 1


def test_a_request_arriving_during_a_long_generation_runs_before_it_ends():
    """Running sequences' decode steps go back to back, each planned while the one before runs,
    only while nothing else waits: a request that arrives meanwhile is admitted within a step
    or two, with the generation still far from its end."""
    engine, executor = simulated_engine()

    async def scenario() -> tuple[int, int, int]:
        long = engine.submit(generate("long", [5, 6, 7], 400))
        seen = 0
        async for out in long:
            seen += len(out.token_ids)
            if seen >= 20:
                break
        arrived_at_step = len(executor.ran)
        short = engine.submit(generate("short", [8, 9], 1))
        assert (await short.collect()).token_ids == [10]
        ran_at_step = next(i for i, ran in enumerate(executor.ran) if short.key in ran.seq_ids)
        rest = await long.collect()
        return arrived_at_step, ran_at_step, seen + len(rest.token_ids)

    arrived, ran, long_tokens = run(engine, scenario)
    assert ran - arrived <= 2
    assert ran < 100 and long_tokens == 400  # far from the generation's end


def test_a_sequence_its_stop_token_ended_computes_no_row_after_it():
    """Decode steps run back to back, each planned before the one before it sampled: a row whose
    token ends its sequence (a stop token or EOS, unknown when the next step was planned) is
    dropped from that next step, not computed for a result no one reads. The executor's next
    token is the last + 1, so "short" samples 11, 12, 13, 14 and stops at 15, while "long" keeps
    the chain going."""
    engine, executor = simulated_engine()

    async def scenario():
        short = engine.submit(Request("short", [10], SamplingParams(max_tokens=100, temperature=0,
                                                                   stop_token_ids=(15,))))
        long = engine.submit(generate("long", [500], 30))
        return await asyncio.gather(short.collect(), long.collect())

    short, long = run(engine, scenario)
    assert short.token_ids == [11, 12, 13, 14, 15] and short.finish_reason == "stop"
    assert len(long.token_ids) == 30
    inputs = [r.token_id for b in executor.batches for r in decode_rows(b) if r.token_id < 500]
    assert inputs == [11, 12, 13, 14], inputs  # no row with 15, the token that ended it, as input
