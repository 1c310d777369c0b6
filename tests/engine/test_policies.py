"""Queue policies and deadline-aware batching, on the scheduler with a fake executor: priority
order, shortest-uncached-first with aging (no starvation), slack-based EDF, SLO-aware step
sizing, shedding of late requests, and the waiting-token count admission control reads. Time is
CLOCK's, which moves only when a test moves it."""
from __future__ import annotations

import pytest

from prelude.cache.block_pool import BlockPool
from prelude.contract.batch import prefill_rows
from prelude.contract.config import Config
from prelude.contract.sampling import SamplingParams
from prelude.engine.policy import AGING
from prelude.engine.request import Request, Task
from prelude.engine.scheduler import Scheduler
from prelude.engine.scheduler_config import SchedulerConfig
from tests.engine.clock import FakeClock
from tests.engine.fakes import CountingExecutor
from tests.engine.test_scheduler import end_like_the_engine

BS = 4
CLOCK = FakeClock()  # the schedulers' and the requests' (tests read it afresh: it only goes forward)


def make(policy: str, **config) -> Scheduler:
    return Scheduler(SchedulerConfig.from_config(Config(scheduling_policy=policy, **config)), BlockPool(256, BS),
                     CLOCK)


def embed(rid, n: int, start: int = 0, **kw) -> Request:
    """An embedding request of n tokens from `start`, arriving now."""
    return Request(str(rid), list(range(start, start + n)), SamplingParams(max_tokens=0), task=Task.EMBED,
                   arrival_time=CLOCK(), **kw)


def first_rows(scheduler: Scheduler) -> list[str]:
    """Request ids in the order of the next step's rows."""
    step = scheduler.schedule()
    assert step is not None
    by_seq = {p.job.seq_id: p.job.request.request_id for p in step.oneshots}
    return [by_seq[r.seq_id] for r in prefill_rows(step.batch)]


def test_priority_runs_lower_values_first_then_arrival():
    scheduler = make("priority", max_num_batched_tokens=1000)
    for i, (rid, priority) in enumerate((("a", 5), ("b", 0), ("c", 5), ("d", -1))):
        scheduler.add(embed(rid, 8, start=100 * i, priority=priority))
    assert first_rows(scheduler) == ["d", "b", "a", "c"]


def test_priority_preempts_the_least_urgent_even_when_it_got_its_block_first():
    # Three less urgent sequences, older, get their next blocks first in a tick; the urgent one
    # then needs one and none is free. Preempting only what had no block yet preempted the
    # urgent one itself, and it finished last.
    scheduler = Scheduler(SchedulerConfig.from_config(Config(scheduling_policy="priority")), BlockPool(40, BS))
    executor, finished = CountingExecutor(), []
    for i in range(3):
        scheduler.add(Request(f"low{i}", [100 * (i + 1)], SamplingParams(max_tokens=60), priority=10))

    def tick() -> bool:
        step = scheduler.schedule()
        if step is not None:
            events = scheduler.update(step, executor.execute(step.batch))
            end_like_the_engine(scheduler, events)
            finished.extend(w.request.request_id for w, _ in events if w.status.value == "finished")
        return step is not None

    tick()
    scheduler.add(Request("urgent", [400, 2, 3], SamplingParams(max_tokens=60), priority=-10))
    while tick():
        pass
    assert scheduler.stats.num_preemptions and finished[-1] != "urgent", finished


def test_sjf_serves_short_uncached_work_first_and_counts_cached_tokens_as_free():
    scheduler = make("sjf", max_num_batched_tokens=100)
    executor = CountingExecutor()
    # Cache a 64-token prefix, then queue: a long cold request, a short one, and a long request
    # whose prefix is cached (short once the cache is counted).
    scheduler.add(embed("warm", 65))
    end_like_the_engine(scheduler, scheduler.update(step := scheduler.schedule(), executor.execute(step.batch)))
    scheduler.add(embed("cold-long", 64, start=500))
    scheduler.add(embed("short", 8, start=900))
    scheduler.add(embed("cached-long", 66))
    assert first_rows(scheduler) == ["cached-long", "short", "cold-long"]  # 2, 8, 64 uncached tokens


def test_sjf_aging_bounds_the_wait_of_a_long_request():
    """A long request is overtaken only by requests that arrive within AGING x its cost after it:
    under an endless stream of short ones it still runs."""
    scheduler = make("sjf", max_num_batched_tokens=64)
    executor = CountingExecutor()
    scheduler.costs.fixed_s, scheduler.costs.per_token_s = 1e-3, 1e-4  # long: ~7 ms, short: ~1.4 ms
    long_request = embed("long", 60, start=1000)
    scheduler.add(long_request)
    started = CLOCK()
    ran_long_at = None
    for i in range(2000):
        scheduler.add(embed(f"s{i}", 4, start=4 * i))
        step = scheduler.schedule()
        ids = {p.job.request.request_id for p in step.oneshots}
        end_like_the_engine(scheduler, scheduler.update(step, executor.execute(step.batch)))
        if "long" in ids:
            ran_long_at = CLOCK() - started
            break
        CLOCK.advance(0.001)  # a short request a millisecond
    bound = AGING * scheduler.costs.estimate(60)
    assert ran_long_at is not None and ran_long_at < bound, (ran_long_at, bound)


@pytest.mark.parametrize("policy", ["sjf", "edf"])
def test_a_sequence_preempted_mid_answer_resumes_before_later_requests(policy):
    # Keyed with aging like unstarted work, its recompute (prompt and output so far) made it
    # long: a short request that arrived after its preemption went first and ran to its end
    # while the preempted stream stalled mid-answer. 32 blocks of 4 hold one 105-token sequence;
    # without prefix caching the recompute is all uncached.
    pool = BlockPool(32, BS, enable_prefix_caching=False)
    scheduler = Scheduler(SchedulerConfig.from_config(Config(scheduling_policy=policy)), pool)
    scheduler.costs.fixed_s, scheduler.costs.per_token_s = 1e-3, 1e-2  # aging windows of seconds
    executor, finished = CountingExecutor(), []

    def tick() -> None:
        step = scheduler.schedule()
        assert step is not None
        events = scheduler.update(step, executor.execute(step.batch))
        end_like_the_engine(scheduler, events)
        finished.extend(w.request.request_id for w, _ in events if w.status.value == "finished")

    scheduler.add(Request("first", [100, 1, 2, 3, 4], SamplingParams(max_tokens=100)))
    tick()
    early = scheduler.add(Request("early", [200, 1, 2, 3, 4], SamplingParams(max_tokens=100)))
    while not (early in list(scheduler.waiting) and early.num_output_tokens):
        tick()
    scheduler.add(Request("later", [300, 1, 2, 3, 4], SamplingParams(max_tokens=100)))
    while len(finished) < 3:
        tick()
    assert finished == ["first", "early", "later"]


def test_edf_orders_by_latest_start_time():
    scheduler = make("edf", max_num_batched_tokens=10_000)
    scheduler.costs.fixed_s, scheduler.costs.per_token_s = 1e-3, 1e-4  # 400 tokens: 41 ms
    now = CLOCK()
    scheduler.add(embed("relaxed", 8, deadline=now + 10))
    scheduler.add(embed("urgent", 8, start=100, deadline=now + 1))
    scheduler.add(embed("urgent-but-long", 400, start=200, deadline=now + 1.01))
    assert first_rows(scheduler) == ["urgent-but-long", "urgent", "relaxed"]


def test_edf_step_grows_only_while_the_most_urgent_row_meets_its_deadline():
    scheduler = make("edf", max_num_batched_tokens=10_000)
    scheduler.costs.fixed_s, scheduler.costs.per_token_s = 1e-3, 1e-3  # 1 ms per token
    now = CLOCK()
    scheduler.add(embed("urgent", 10, deadline=now + 0.05))  # 11 ms alone: fits
    for i in range(5):
        scheduler.add(embed(f"bulk{i}", 30, start=100 + 30 * i))  # +30 ms each
    step = scheduler.schedule()
    assert [p.job.request.request_id for p in step.oneshots] == ["urgent", "bulk0"]


def test_edf_puts_work_that_can_no_longer_meet_its_deadline_behind_work_that_can():
    scheduler = make("edf", max_num_batched_tokens=10_000)
    scheduler.costs.fixed_s, scheduler.costs.per_token_s = 1e-3, 1e-3  # 10 tokens: 11 ms
    now = CLOCK()
    scheduler.add(embed("lost", 10, deadline=now + 0.005))  # its latest start has passed
    scheduler.add(embed("on-time", 10, start=100, deadline=now + 0.025))  # with lost: 21 ms
    assert first_rows(scheduler) == ["on-time", "lost"]


def test_edf_work_past_its_deadline_is_overtaken_only_by_work_due_before_a_bound():
    scheduler = make("edf", max_num_batched_tokens=10_000)
    scheduler.costs.fixed_s, scheduler.costs.per_token_s = 1e-3, 1e-3
    now = CLOCK()
    scheduler.add(embed("relaxed", 10, start=100, deadline=now + 1))  # may start up to now + 0.989
    scheduler.add(embed("lost", 10, deadline=now + 0.005))  # behind work due before now + 0.027 only
    assert first_rows(scheduler) == ["lost", "relaxed"]


def test_edf_step_stays_capped_by_its_urgent_row_when_a_late_row_joins():
    scheduler = make("edf", max_num_batched_tokens=10_000)
    scheduler.costs.fixed_s, scheduler.costs.per_token_s = 1e-3, 1e-3
    now = CLOCK()
    scheduler.add(embed("urgent", 10, deadline=now + 0.05))  # 11 ms alone
    scheduler.add(embed("late", 20, start=100, deadline=now + 0.015))  # 21 ms: lost; with urgent, 31 ms
    for i in range(5):
        scheduler.add(embed(f"bulk{i}", 30, start=200 + 30 * i))  # +30 ms each: urgent would miss
    step = scheduler.schedule()
    assert [p.job.request.request_id for p in step.oneshots] == ["urgent", "late"]


def test_late_requests_are_shed_only_when_asked():
    for shed in (False, True):
        scheduler = make("edf", shed_late_requests=shed)
        scheduler.costs.fixed_s, scheduler.costs.per_token_s = 1e-3, 1e-3
        late = scheduler.add(embed("late", 100, deadline=CLOCK() + 0.01))  # needs ~0.1 s
        scheduler.add(embed("fine", 4, start=500, deadline=CLOCK() + 5))
        assert scheduler.late(CLOCK()) == ([late] if shed else [])


def test_a_request_waiting_alone_is_shed_by_its_uncached_cost():
    scheduler = make("edf", shed_late_requests=True, max_num_batched_tokens=1000)
    executor = CountingExecutor()
    scheduler.costs.fixed_s, scheduler.costs.per_token_s = 1e-3, 1e-3
    scheduler.add(embed("warm", 97))  # caches the first 96 tokens
    end_like_the_engine(scheduler, scheduler.update(step := scheduler.schedule(), executor.execute(step.batch)))
    # ~0.1 s for its 100 tokens, ~5 ms for the 4 not cached: it can still make a 20 ms deadline.
    scheduler.add(embed("cached", 100, deadline=CLOCK() + 0.02))
    assert scheduler.late(CLOCK()) == []


def test_admission_counts_waiting_requests_and_tokens():
    scheduler = make("fcfs", max_queued_requests=3, max_queued_tokens=100)
    assert scheduler.has_room([embed("huge", 1000)])  # an empty queue takes anything
    scheduler.add(embed("a", 40))
    assert scheduler.num_waiting_tokens == 40
    assert scheduler.has_room([embed("b", 60)]) and not scheduler.has_room([embed("b", 61)])
    scheduler.add(embed("b", 10, start=50))
    scheduler.add(embed("c", 10, start=70))
    assert not scheduler.has_room([embed("d", 1, start=90)])
    step = scheduler.schedule()
    assert step is not None and scheduler.num_waiting_tokens == 0
