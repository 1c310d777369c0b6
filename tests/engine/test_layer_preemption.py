"""Cooperative preemption (FlowPrefill) through the engine, in simulated time: a long OneShot step
steps aside while short work waits, and only then; short work never shares its step; a running
stream keeps getting tokens beside it; and a long request still finishes under a stream of
short ones. Asserted on the order requests end in, the steps the executor ran and the engine's
counters. (That a parked step's results equal an uninterrupted one's is the model runner's
property, checked on the demo model in tests/server/test_layer_preemption.py.)"""
from __future__ import annotations

import asyncio

import pytest

from prelude.contract.batch import DecodeBatch, ForwardBatch
from prelude.engine.cost_model import PRIOR_PER_TOKEN_S
from prelude.engine.preemption import STREAM_GAP_S
from tests.engine.fakes import PIECE_TOKENS, Pause, Ran, seq_ids, step_tokens
from tests.engine.simulated import Ends, embed, generate, run, simulated_engine, until

LONG, SHORT = 6000, 24  # at the prior's 20 us a token: a 0.12 s step, and a row short beside it


@pytest.mark.parametrize("preemption", [True, False])
def test_a_short_request_arriving_during_a_long_step_ends_first_only_with_preemption(preemption):
    engine, executor = simulated_engine(layer_preemption=preemption)
    long_step = Pause(lambda batch: step_tokens(batch) == LONG)  # its first piece, or all of it
    executor.before_piece = long_step
    ends = Ends()

    async def scenario() -> None:
        long = ends.watch(engine.submit(embed("long", LONG)))
        await long_step.reached()
        short = ends.watch(engine.submit(embed("short", SHORT, start=500)))
        long_step.release()
        await asyncio.gather(long, short)

    run(engine, scenario)
    snapshot = engine.snapshot()
    assert not ends.errors
    if preemption:
        assert ends.order == ["short", "long"]
        assert (snapshot.preemptible_steps, snapshot.layer_preemptions) == (1, 1)
    else:
        assert ends.order == ["long", "short"]
        assert (snapshot.preemptible_steps, snapshot.layer_preemptions) == (0, 0)


def test_a_long_step_with_nothing_waiting_is_never_stopped():
    """Preemptible, but never asked to step aside: it runs all its pieces in one go."""
    engine, _ = simulated_engine()
    ends = Ends()

    async def scenario() -> None:
        for i in range(2):
            await ends.watch(engine.submit(embed(f"long{i}", LONG, start=i)))

    run(engine, scenario)
    snapshot = engine.snapshot()
    assert ends.order == ["long0", "long1"]
    assert (snapshot.preemptible_steps, snapshot.layer_preemptions) == (2, 0)


# Rows of 120 tokens: one step of 5,760 tokens, preemptible, but with no row long enough that a
# 24-token request is short beside it.
BUSY = [embed(f"busy{i}", 120, start=5 * i) for i in range(48)]


@pytest.mark.parametrize("policy,budget", [("fcfs", LONG), ("fcfs", 8192), ("edf", 8192)])
def test_short_work_queued_with_a_long_request_never_shares_its_step(policy, budget):
    """A short request waiting beside a long one, both queued while a busy step runs: the short
    one does not join (and wait for) the long one's step, whether the long one fills the step's
    token budget (`budget` == its length) or not; it runs while the long step is parked (fcfs) or
    before it (edf), and ends first."""
    engine, executor = simulated_engine(scheduling_policy=policy, max_num_batched_tokens=budget)
    busy_step = Pause(lambda batch: len(batch.rows) == len(BUSY))
    executor.before_piece = busy_step
    ends = Ends()

    async def scenario() -> dict[str, int]:
        busy = [ends.watch(stream) for stream in engine.submit_all(BUSY)]
        await busy_step.reached()
        streams = {"long": engine.submit(embed("long", LONG, start=7)),
                   "short": engine.submit(embed("short", SHORT, start=500))}
        assert engine.snapshot().layer_preemptions == 0  # the busy step was not asked to park
        busy_step.release()
        await asyncio.gather(*busy, *(ends.watch(s) for s in streams.values()))
        return {name: s.key for name, s in streams.items()}

    seq = run(engine, scenario)
    assert ends.order.index("short") < ends.order.index("long")
    assert not [ran for ran in executor.ran if {seq["long"], seq["short"]} <= ran.seq_ids]
    if policy == "fcfs":
        assert engine.snapshot().layer_preemptions == 1


def test_a_running_stream_keeps_getting_tokens_beside_a_long_request():
    """A long OneShot row does not share a step with running decodes (the stream would stall for
    all of it): it gets a step of its own, which steps aside for the stream's next token whenever
    the stream has waited STREAM_GAP_S. (The step's token budget holds both: nothing else keeps
    them apart.)"""
    engine, executor = simulated_engine(max_num_batched_tokens=8 * LONG)
    clock = executor.clock
    long_seq: list[int] = []
    pieces_at: list[float] = []  # simulated time at which each piece of the long step began
    decodes_at: list[float] = []  # ... and each of the stream's decode steps

    def note(batch: ForwardBatch) -> None:
        if long_seq and long_seq[0] in seq_ids(batch):
            pieces_at.append(clock())
        elif isinstance(batch, DecodeBatch):
            decodes_at.append(clock())

    executor.before_piece = note

    async def scenario() -> None:
        stream = engine.submit(generate("stream", [5, 6, 7], max_tokens=100_000))
        await stream.first()
        long = engine.submit(embed("long", 5 * LONG))  # about 0.6 s
        long_seq.append(long.key)
        await long.collect()
        engine.abort(stream)

    run(engine, scenario)
    long_steps = [ran for ran in executor.ran if long_seq[0] in ran.seq_ids]
    assert long_steps == [Ran("oneshot", frozenset(long_seq), preemptible=True)]  # never beside decodes
    during = [t for t in decodes_at if pieces_at[0] <= t <= pieces_at[-1]]
    assert len(during) >= 4 and engine.snapshot().layer_preemptions == len(during)
    piece_s = PIECE_TOKENS * PRIOR_PER_TOKEN_S
    gaps = [b - a for a, b in zip([pieces_at[0], *during], [*during, pieces_at[-1]])]
    assert max(gaps) <= STREAM_GAP_S + 2 * piece_s, gaps


def test_a_long_request_still_ends_under_a_stream_of_short_ones():
    """Shortest-job-first with aging, under more short requests than a step takes (32 clients
    sending them back to back, 16 to a step): the long request is overtaken only by shorts that
    arrive within its aging bound, then runs (stepping aside for shorts while it owes them
    nothing) and ends while the shorts keep coming. Without aging it would wait for the stream
    to stop (here, after CAP shorts)."""
    engine, _ = simulated_engine(scheduling_policy="sjf", max_num_batched_tokens=512, num_kv_blocks=512)
    ends = Ends()
    shorts_before_long: list[int] = []

    async def client(k: int) -> None:
        i = 0
        while not shorts_before_long and len(ends.order) < CAP:
            await ends.watch(engine.submit(embed(f"s{k}.{i}", 32, start=k * 100 + i)))
            i += 1

    async def scenario() -> None:
        clients = [asyncio.create_task(client(k)) for k in range(32)]
        await until(lambda: len(ends.order) >= 64)  # the short stream is flowing
        await ends.watch(engine.submit(embed("long", 3000)))
        shorts_before_long.append(len(ends.order) - 1)
        await asyncio.gather(*clients)

    run(engine, scenario)
    assert not ends.errors
    assert shorts_before_long[0] < CAP - 32, "the long request waited for the short stream to stop"
    assert shorts_before_long[0] > 64 + 32  # the shorts did overtake it


CAP = 5000
