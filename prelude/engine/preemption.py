"""Cooperative preemption (FlowPrefill), the whole policy: which OneShot steps may step aside,
which work they step aside for, which work keeps out of their way, and when they are asked to.

A long OneShot step runs on the model's fastest path (on the CPU, every layer in one native
call) and looks at a StopFlag between pieces of about CHECK_EVERY_MACS multiply-adds (between
layers where the model cannot look inside one). The flag goes up only when short work waits,
or running streams have waited STREAM_GAP_S for their next token; then the step parks where it
stands, short steps run, and it goes on from there with the same results. Until the flag goes
up, a preemptible step costs what an unpreemptible one costs: one load per piece.

Used by the scheduler (what goes in a step beside what) and the step runner (LongStep: when the
flag goes up, and how much short work runs while the step is parked)."""
from __future__ import annotations

from prelude.contract.stop import StopFlag
from prelude.engine.clock import SYSTEM_CLOCK, Clock, Timer
from prelude.engine.cost_model import StepCostModel

# A OneShot step predicted to take at least this long may step aside for short requests, those
# of at most SHORT_SHARE of its longest row's tokens. The longest row, not the step's total: a
# step of sixteen 128-token rows is a batch of short work, which must not park for the next
# 128-token arrival (batching would break up). Short requests' latency beside long ones:
# `python -m bench.serving.long_short`.
PREEMPTIBLE_S = 0.05
SHORT_SHARE = 1 / 8
# A running stream waits about this long at most for its next token because of OneShot work: a
# OneShot row predicted to take longer does not share a step with the streams' decodes (they
# would all stall for the whole row); it gets a step of its own, which steps aside this often
# for a step of their tokens. Decode prompts beside decodes are chunked to it too (scheduler).
# A stream's gaps beside a long request: `python -m bench.serving.stream_stall`.
STREAM_GAP_S = 0.1
MAX_SHORT_STEPS = 16  # steps of short work per park: bounds how long a parked step waits
# A parked step may stop again only once it has computed, since it began, at least this share
# of the time the short work it stepped aside for took: it keeps at least a third of the
# machine under any stream of short requests, and a short request arriving just after a park
# does not wait for more than that debt (`python -m bench.serving.long_short`).
LONG_RUN_PER_SHORT_S = 0.5
# The most work a preemptible step does between two looks at its flag: the demo model's MLP over
# 512 tokens, a few ms on two cores (attention pieces are sized to last about as long); fewer
# tokens on wider models. A short request waits for the running piece to end before its own step
# runs, so a piece's length is part of every short request's latency
# (`python -m bench.kernels.stop_latency` measures it). Counted in multiply-adds of fp32 panels:
# a projection stored as bf16x3 (AMX) takes three times the tokens a piece (step_layers.hpp).
CHECK_EVERY_MACS = 3 * 256 * 768 * 512


class PreemptionPolicy:
    """The scheduler's side: which steps are long enough to step aside, and which work goes in a
    step of its own. Off (--no-layer-preemption), nothing is preemptible and nothing kept apart."""

    def __init__(self, enabled: bool, costs: StepCostModel):
        self.enabled = enabled
        self.costs = costs

    def preemptible(self, tokens: int) -> bool:
        """Whether a OneShot step (or row) computing `tokens` may step aside for short work."""
        return self.enabled and self.costs.estimate(tokens) >= PREEMPTIBLE_S

    @staticmethod
    def short_tokens_beside(long_tokens: int) -> int:
        """The most tokens of work that runs while a step whose longest row has `long_tokens` is
        parked, rather than in that step."""
        return max(1, int(SHORT_SHARE * long_tokens))

    def apart(self, oneshot: bool, tokens: int, long_tokens: int, shortest: int) -> bool:
        """Whether work of `tokens` goes in another step than one whose longest preemptible row
        has `long_tokens` (0: none yet) and shortest row `shortest` (0: no row yet): it is short
        beside that row (it runs while the step is parked), or it is a long OneShot row that the
        short rows already planned would wait for. A long row passed over goes first in the
        next step unless more short work came first, for as long as the queue policy puts short
        work ahead of it (fcfs: never, sjf/edf: until its aging bound)."""
        if not self.enabled:
            return False
        if long_tokens and tokens <= self.short_tokens_beside(long_tokens):
            return True
        return oneshot and bool(shortest) and shortest <= self.short_tokens_beside(tokens) and self.preemptible(tokens)

    def stalls_streams(self, tokens: int) -> bool:
        """Whether a OneShot row of `tokens` would hold running streams' next token too long if
        it shared their step (it gets a step of its own, which steps aside for them)."""
        return self.enabled and self.costs.estimate(tokens) > STREAM_GAP_S


class LongStep:
    """The step runner's side, for the preemptible step in flight: its StopFlag, and when the
    flag goes up. The engine's event loop raises it (arrivals, timers) while the step runs in
    the worker thread; LONG_RUN_PER_SHORT_S of debt defers it."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self.flag = StopFlag(CHECK_EVERY_MACS)
        self._clock = clock
        self.long_tokens = 0  # the longest row of the step in flight; 0 when none runs
        self._computed = self._parked_for = 0.0  # seconds since the step began
        self._resumed = 0.0
        self._timers: list[Timer] = []

    @property
    def in_flight(self) -> bool:
        return self.long_tokens > 0

    @property
    def short_tokens(self) -> int:
        """The most tokens a step run while this one is parked may take."""
        return PreemptionPolicy.short_tokens_beside(self.long_tokens)

    def begin(self, long_tokens: int) -> None:
        self.long_tokens = long_tokens
        self._computed = self._parked_for = 0.0

    def end(self) -> None:
        self._cancel_timers()
        self.long_tokens = 0

    def resume(self, short_waiting: bool, streams_running: bool) -> None:
        """Before the step (re)starts in the worker: the flag goes up once the step has paid its
        debt, if short work waits already; streams' tokens count as short work once they have
        waited STREAM_GAP_S."""
        self.flag.clear()
        self._resumed = self._clock()
        if short_waiting:
            self._raise_after(0.0)
        if streams_running:
            self._raise_after(STREAM_GAP_S)

    def note_short_arrival(self) -> None:
        """A short request arrived while the step runs."""
        if self.in_flight and not self.flag.is_set():
            self._raise_after(0.0)

    def stopped(self) -> None:
        """The step came back from the worker, finished or parked."""
        self._cancel_timers()
        self._computed += self._clock() - self._resumed

    def parked(self, seconds: float) -> None:
        """Short steps ran for `seconds` while the step was parked."""
        self._parked_for += seconds

    def _raise_after(self, wait: float) -> None:
        """Raises the flag `wait` seconds after the step resumed, or once it paid its debt."""
        owed = LONG_RUN_PER_SHORT_S * self._parked_for - self._computed
        delay = self._resumed + max(wait, owed) - self._clock()
        if delay <= 0:
            self.flag.set()
        else:
            self._timers.append(self._clock.call_later(delay, self.flag.set))

    def _cancel_timers(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
