"""Queue policies: the order in which waiting requests are offered to the planners.

- fcfs: arrival order.
- priority: the request's `priority` (lower first, as in vLLM), then arrival.
- sjf: JCT-aware (PrefillOnly): shortest estimated job first, the estimate made from the
  request's *uncached* tokens with the step cost model calibrated online, and refreshed when the
  prefix cache changes. Aging bounds every wait: see `SJF`.
- edf: slack-based earliest deadline first (FlowPrefill's S-EDF): the request that must start
  soonest to meet its deadline goes first; one that can no longer meet it goes behind those that
  still can (within a bound); requests without a deadline are ordered as under sjf.

The scheduler iterates a policy in order, then removes what it admitted; preempted work
re-enters with `push_front`. Every policy counts the tokens it holds waiting, for admission
control."""
from __future__ import annotations

import bisect
import itertools
import math
import time
from abc import ABC, abstractmethod
from collections import deque
from typing import Callable, Iterator

from prelude.cache.block_pool import BlockPool
from prelude.engine.cost_model import StepCostModel
from prelude.engine.work import Estimate, Sequence, Work

POLICY_NAMES = ("fcfs", "priority", "sjf", "edf")
# sjf/edf: a request's key is its arrival time plus AGING x its estimated cost, so a request is
# only ever overtaken by requests that arrive within AGING x its own cost after it.
AGING = 2.0
# Estimates are refreshed when the prefix cache changed, at most this often per request.
REFRESH_S = 0.05


def queued_tokens(work: Work) -> int:
    return len(work.tokens_to_compute)


class QueuePolicy(ABC):
    def __init__(self) -> None:
        self.num_tokens = 0  # tokens of the waiting work, for --max-queued-tokens

    def push(self, item: Work) -> None:
        self.num_tokens += queued_tokens(item)
        self._push(item, front=False)

    def push_front(self, item: Work) -> None:
        self.num_tokens += queued_tokens(item)
        self._push(item, front=True)

    def remove(self, item: Work) -> None:
        self.num_tokens -= queued_tokens(item)
        self._remove_many([item])

    def remove_many(self, items: list[Work]) -> None:
        """Removes the items the scheduler admitted in one tick (one pass over the queue)."""
        if items:
            self.num_tokens -= sum(map(queued_tokens, items))
            self._remove_many(items)

    @abstractmethod
    def _push(self, item: Work, front: bool) -> None: ...

    @abstractmethod
    def _remove_many(self, items: list[Work]) -> None: ...

    @abstractmethod
    def __iter__(self) -> Iterator[Work]:
        """Waiting work in the order to offer it; not mutated while the scheduler iterates."""

    @abstractmethod
    def __len__(self) -> int: ...

    def victim(self, candidates: list[Sequence]) -> Sequence:
        """Which running sequence (oldest first in `candidates`) is preempted when blocks run
        out: the newest, whose recompute costs least."""
        return candidates[-1]

    def cost(self, item: Work) -> float | None:
        """The seconds the policy estimates the waiting item to take, if it estimates costs."""
        return None


class FCFS(QueuePolicy):
    def __init__(self) -> None:
        super().__init__()
        self._queue: deque[Work] = deque()

    def _push(self, item: Work, front: bool) -> None:
        if front:
            self._queue.appendleft(item)
        else:
            self._queue.append(item)

    def _remove_many(self, items: list[Work]) -> None:
        if len(items) == len(self._queue):
            self._queue.clear()
        elif len(items) == 1:
            self._queue.remove(items[0])
        else:
            taken = {id(item) for item in items}
            self._queue = deque(item for item in self._queue if id(item) not in taken)

    def __iter__(self) -> Iterator[Work]:
        return iter(self._queue)

    def __len__(self) -> int:
        return len(self._queue)


class _Keyed(QueuePolicy):
    """Work kept sorted by a key (smaller first); ties and front pushes by a sequence number."""

    def __init__(self) -> None:
        super().__init__()
        self._entries: list[tuple[float, int, Work]] = []
        self._counter = itertools.count()
        self._front = itertools.count(-1, -1)

    @abstractmethod
    def key(self, item: Work) -> float: ...

    def _push(self, item: Work, front: bool) -> None:
        bisect.insort(self._entries, (self.key(item), next(self._front if front else self._counter), item),
                      key=lambda e: e[:2])

    def _remove_many(self, items: list[Work]) -> None:
        taken = {id(item) for item in items}
        self._entries = [e for e in self._entries if id(e[2]) not in taken]

    def __iter__(self) -> Iterator[Work]:
        return iter([e[2] for e in self._entries])

    def __len__(self) -> int:
        return len(self._entries)


class Priority(_Keyed):
    def key(self, item: Work) -> float:
        return item.request.priority

    def victim(self, candidates: list[Sequence]) -> Sequence:
        """The newest of the least urgent, as vLLM's priority scheduling preempts: the newest
        alone was most often the urgent request just admitted beside older, less urgent ones,
        so it finished after all of them."""
        return max(reversed(candidates), key=lambda seq: seq.request.priority)


class SJF(_Keyed):
    """Shortest estimated job first with aging. The key is arrival + AGING x estimated seconds,
    so a request r of cost C is overtaken only by requests arriving before arrival(r) + AGING x C:
    its wait is bounded by the work queued when it arrived plus the work arriving in the next
    AGING x C seconds. No stream of short requests can starve it. A sequence preempted after
    its first token is overtaken by none that arrived after it."""

    def __init__(self, pool: BlockPool, costs: StepCostModel, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.pool = pool
        self.costs = costs
        self.clock = clock

    def estimate(self, item: Work) -> Estimate:
        """The item's cost from its uncached tokens, refreshed when the prefix cache changed."""
        now = self.clock()
        current = item.estimate
        if current is not None and (current.pool_version == self.pool.version or now - current.made_at < REFRESH_S):
            return current
        tokens = item.tokens_to_compute
        bs = self.pool.block_size
        uncached = len(tokens) - bs * self.pool.cached_blocks(tokens, (len(tokens) - 1) // bs)
        seconds = self.costs.estimate(uncached)
        item.estimate = Estimate(seconds, self.order_key(item, seconds), self.pool.version, now)
        return item.estimate

    def order_key(self, item: Work, seconds: float) -> float:
        # A sequence preempted mid-answer is keyed by its arrival alone: with its recompute cost
        # (prompt and output so far) aged in, short requests that came after it went first, and
        # its client's stream stalled mid-answer while each of them ran to its end.
        if item.num_output_tokens:
            return item.request.arrival_time
        return item.request.arrival_time + AGING * seconds

    def key(self, item: Work) -> float:
        return self.current_key(item, self.clock())

    def current_key(self, item: Work, now: float) -> float:
        return self.estimate(item).key

    def cost(self, item: Work) -> float | None:
        return self.estimate(item).seconds

    def _push(self, item: Work, front: bool) -> None:
        if self._entries:
            super()._push(item, front)
            return
        # Alone, it has nothing to be ordered against: its cost is estimated (a walk of the prefix
        # trie) only once other work waits beside it, when __iter__ keys every entry. NaN equals
        # no key, so that pass always replaces it.
        self._entries.append((math.nan, next(self._front if front else self._counter), item))

    def __iter__(self) -> Iterator[Work]:
        if len(self._entries) > 1:
            now = self.clock()
            keys = [self.current_key(e[2], now) for e in self._entries]
            if any(e[0] != k for e, k in zip(self._entries, keys)):
                self._entries = sorted(((k, n, w) for k, (_, n, w) in zip(keys, self._entries)),
                                       key=lambda e: e[:2])
        return super().__iter__()


class EDF(SJF):
    """Slack-based earliest deadline first: a request with a deadline is keyed by the latest
    time it can start and still finish (deadline - estimated cost); one without, as under SJF.

    Once that time has passed (negative slack) the request is keyed by deadline + AGING x cost:
    it goes behind the requests that can still make theirs, as FlowPrefill's S-EDF puts it,
    rather than spend their slack on a deadline already lost. Beside long inputs on the CPU,
    short requests that waited out a segment together ran in one step, and the step's length
    made all of them late. The key is still a fixed time, so the request is overtaken only by
    work due before it: its extra wait is bounded as under SJF."""

    def current_key(self, item: Work, now: float) -> float:
        estimate = self.estimate(item)
        deadline = item.open_deadline
        if deadline is None or now <= estimate.key:
            return estimate.key
        return deadline + AGING * estimate.seconds

    def order_key(self, item: Work, seconds: float) -> float:
        # The deadline still to be met: a sequence preempted after its first token has none
        # left. Keyed by its past first-token deadline, a stream with a generous one went
        # behind every request that arrived before that deadline: stalled mid-answer for as
        # long as such work kept coming.
        deadline = item.open_deadline
        return super().order_key(item, seconds) if deadline is None else deadline - seconds


def make_policy(name: str, pool: BlockPool, costs: StepCostModel,
                clock: Callable[[], float] = time.monotonic) -> QueuePolicy:
    if name == "fcfs":
        return FCFS()
    if name == "priority":
        return Priority()
    if name == "sjf":
        return SJF(pool, costs, clock)
    if name == "edf":
        return EDF(pool, costs, clock)
    raise ValueError(f"unknown scheduling policy {name!r}; choose one of {POLICY_NAMES}")
