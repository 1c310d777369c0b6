"""The measured figures and the replica model behind bench.sim.simulate (see its docstring).

Every number here was measured on the 2-core box the shared-prefix bench runs on (demo model,
one torch thread per replica, under `flock /work/timing.lock`), at commit 10f6ae7 of main.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

# Engine step-time curve (seconds) of one replica: A per step, and per prefill row
# RP + B*new + Q*new*(new + 2*hit) + H*hit, RD per decode row. Shape from a curve taken on
# 2026-11-23 (fresh prompts of 40-4116 tokens: 15-1448 ms; a cached 2048-token prefix + 16 new
# tokens; 2 and 4 such requests at once, which fix RP, H and RD), rescaled to today's kernels with
# `python -m bench.sim.sim_costs` (replica access-log times): a fresh 2,098-token prompt's
# prefill 378 ms (B and Q scaled by 0.69 to match; it was 542), and one cached request's decode
# step 5.5 ms (A 5.0 -> 4.2 ms; RD kept).
STEP = {"A": 0.0042, "RP": 0.0026, "B": 1.096e-4, "Q": 3.20e-8, "H": 3.8e-6, "RD": 0.0013}

# Outside the engine, per request (seconds), from the shared-prefix bench's own run (run 1 below):
# client TTFT minus the replica's logged ttft, mean over its 300 requests: 13.2 ms (cache_aware),
# 13.4 ms (round_robin); client seconds per request (per client) minus the replica's logged total:
# 6.8 and 7.2 ms. `cycle` is when a request reaches its replica after the client got the previous
# answer, `ttft` what its first token costs beyond the engine. (One lone request at a time through
# the router costs more: 27-29 ms and 12-15 ms, sim_costs; under load the router and client
# never sleep between requests, so the bench's own figures are the ones used.)
OVERHEAD = {"ttft": 0.013, "cycle": 0.007}

# Two replicas on the host's two cores, with the client and the router: a step takes this much
# longer while the other replica of its host also runs one (sim_costs: the same cached request,
# the other replica idle vs busy with its own client, replica-logged total 35.8 vs 38.5 ms).
SHARE = 1.075

# bench.serving.shared_prefix at 10f6ae7, 2 replicas (mean TTFT ms, req/s); run 1 cache_aware
# first, run 2 round_robin first (the closing note has the tables and commands).
MEASURED = {"cache_aware": [(108.7, 46.2), (115.0, 44.3)], "round_robin": [(444.0, 12.7), (431.6, 12.4)]}


@dataclass(slots=True)
class Req:
    id: int
    client: int
    prompt: int
    sent: float
    replica: int = -1
    hit: int = 0
    left: int = 0
    ttft: float | None = None
    est: float = 0.0  # E2's estimated seconds of this request still to run on its replica


@dataclass(slots=True)
class Replica:
    capacity: int
    cached: OrderedDict = field(default_factory=OrderedDict)  # prompt -> cached blocks, LRU first
    pins: dict = field(default_factory=dict)  # prompt -> running requests that hold it
    private: int = 0
    waiting: deque = field(default_factory=deque)
    decoding: list = field(default_factory=list)
    busy: bool = False
    load: int = 0  # requests in flight (the router's view)
    work: float = 0.0  # E2: estimated seconds queued
    tree: set = field(default_factory=set)  # cache_aware: prompts the router sent here
    tree_size: int = 0
    step: list | None = None  # the step in flight: [seconds of work left, as of time, prefill, rows]
    version: int = 0  # of its end event (a stale one is skipped)

    def reserve(self, prompt: int, shared: int, private: int) -> int | None:
        """Admits a request: returns its cached blocks, or None if the pool cannot hold it."""
        hit = self.cached.get(prompt, 0)
        need = shared - hit + private
        used = sum(self.cached.values()) + self.private
        for victim in list(self.cached):
            if used + need <= self.capacity:
                break
            if victim != prompt and not self.pins.get(victim):
                used -= self.cached.pop(victim)
        if used + need > self.capacity:
            return None
        self.cached[prompt] = shared
        self.cached.move_to_end(prompt)
        self.pins[prompt] = self.pins.get(prompt, 0) + 1
        self.private += private
        return hit


def step_seconds(new: int, hit: int, k: dict = STEP) -> float:
    """One prefill row's share of a step."""
    return k["RP"] + k["B"] * new + k["Q"] * new * (new + 2 * hit) + k["H"] * hit
