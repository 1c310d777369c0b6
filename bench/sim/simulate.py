"""`python -m bench.sim.simulate`: a discrete-event simulator of bench.serving.shared_prefix's
workload over N Prelude replicas, to predict prefix-hit rate, TTFT and req/s past one machine for
three router policies: round_robin, cache_aware (sglang-router's) and Preble's E2.

Model (assumptions):
- Workload: the bench's request plan (same generator, same seed): P system prompts of
  --system-tokens tokens, Zipf-skewed choice, a --question-tokens question each, --max-tokens out,
  C closed-loop clients with no think time. Scaled to N replicas as N/2 copies of the 2-replica
  setup: 4 clients, 4 prompts and 150 requests per replica.
- Replica: one KV pool of --kv-blocks blocks of 16 tokens. A system prompt's full blocks are shared
  and cached; eviction is LRU by prompt, tail blocks first, never a prompt a running request holds.
  A request's partial last block, question and output are private blocks while it runs.
- Scheduling: continuous batching, one step at a time. A step takes every decoding row plus the
  FIFO-waiting requests that fit (--max-num-batched-tokens of uncached prompt, free KV blocks; no
  chunked prefill). The first token comes at the end of the request's prefill step (TTFT), then
  one token per step.
- Step time (seconds) = A + sum over prefill rows (RP + B*new + Q*new*(new + 2*hit) + H*hit)
  + RD * decode rows, `new`/`hit` the row's uncached/cached prompt tokens (sim_model.STEP).
- Outside the engine (sim_model.OVERHEAD): client, router and HTTP. A request reaches its replica
  `cycle` seconds after its client got the previous answer, and its first token costs `ttft` on
  top of the engine's. They matter most for short cache hits (a ~20 ms prefill, 5 ms decode steps),
  so without them cache_aware ran 40% too fast against the bench.
- Sharing the host (sim_model.SHARE): replicas 2j and 2j+1 are one machine's two cores (with the
  clients and the router); while both run a step, each step progresses SHARE times slower.
- cache_aware: sglang-router 0.3's logic: if loads (requests in flight per worker) are imbalanced
  (max-min > 64 and max > 1.5*min) the least loaded; else the worker whose router-side tree has the
  request's prefix (match > 0.3; the tree is what the router sent there, never evicted); else the
  worker with the smallest tree. E2 (Preble): minimum of the replica's queued work (estimated step
  seconds of its requests in flight) + this request's prefill seconds given that replica's actual
  cache (the router sees the caches, as with KV events), over the replicas caching more than half
  of the prompt if any (Preble's exploit case), else over all (explore). Hot prompts replicate
  (Preble's prefix autoscaling): when the best holder's queued work exceeds REPLICATE x the cost
  (queue + full prefill) on the cheapest replica not holding the prompt, the request goes there,
  which then caches the prompt too; so a hot prompt spreads over as many replicas as its load needs.

Every figure of the model is measured (sim_model says where from; `python -m
bench.sim.sim_costs` re-measures the overhead, the sharing and the step curve's scale)."""
from __future__ import annotations

import argparse
import heapq
import sys
from pathlib import Path
from typing import Sequence

from bench.serving.core import report
from bench.serving.shared_prefix import plan_requests
from bench.sim.sim_model import MEASURED, OVERHEAD, SHARE, STEP, Replica, Req, step_seconds
from bench.serving.core.stats import percentile

POLICIES = ("round_robin", "cache_aware", "e2")
REPLICATE = 2.0  # E2 copies a hot prompt when its holder's queue is this many times the cheapest other


def simulate(policy: str, replicas: int, *, prompts: int, requests: int, clients: int, zipf: float = 1.0,
             seed: int = 0, system_tokens: int = 2070, question_tokens: int = 28, max_tokens: int = 4,
             kv_blocks: int = 692, block: int = 16, budget: int = 8192, k: dict = STEP,
             overhead: dict = OVERHEAD, share: float = SHARE, replicate: float = REPLICATE) -> dict:
    plan = [p for p, _ in plan_requests(requests, prompts, zipf, seed)]
    shared = system_tokens // block
    tokens = system_tokens + question_tokens
    private = -(-(tokens + max_tokens - shared * block) // block)
    reps = [Replica(kv_blocks) for _ in range(replicas)]
    events: list = []  # (time, seq, kind, payload)
    seq = 0
    now = 0.0
    rr = 0
    done: list[Req] = []
    queries = hits = 0
    decode_cost = (max_tokens - 1) * (k["A"] + k["RD"])

    def push(t: float, kind: str, payload) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, payload))

    def route(r: Req) -> int:
        nonlocal rr
        if policy == "round_robin":
            rr += 1
            return (rr - 1) % replicas
        if policy == "e2":
            costs = [x.work + k["A"] + step_seconds(tokens - block * x.cached.get(r.prompt, 0),
                                                     block * x.cached.get(r.prompt, 0), k) for x in reps]
            exploit = [i for i, x in enumerate(reps) if 2 * block * x.cached.get(r.prompt, 0) > tokens]
            best = min(exploit or range(replicas), key=costs.__getitem__)
            others = [i for i in range(replicas) if i not in exploit]
            if exploit and others:  # replicate a hot prompt: its holders are queued far deeper than another
                lo = min(others, key=costs.__getitem__)
                if reps[best].work > replicate * costs[lo]:
                    return lo
            return best
        loads = [x.load for x in reps]
        lo, hi = min(loads), max(loads)
        if hi - lo > 64 and hi > 1.5 * lo:
            return loads.index(lo)
        holders = [i for i, x in enumerate(reps) if r.prompt in x.tree]
        if holders:
            return min(holders, key=loads.__getitem__)
        return min(range(replicas), key=lambda i: reps[i].tree_size)

    def send(client: int, now: float) -> None:
        if plan_iter:
            rid, prompt = plan_iter.pop()
            push(now + overhead["cycle"], "arrive", Req(rid, client, prompt, now))

    def arrive(r: Req, now: float) -> None:
        i = r.replica = route(r)
        x = reps[i]
        x.load += 1
        if r.prompt not in x.tree:
            x.tree.add(r.prompt)
            x.tree_size += system_tokens
        x.tree_size += question_tokens
        cached = x.cached.get(r.prompt, 0) * block
        r.est = k["A"] + step_seconds(tokens - cached, cached, k) + decode_cost
        x.work += r.est
        x.waiting.append(r)
        if not x.busy:
            start(i, now)

    def start(i: int, now: float) -> None:
        nonlocal queries, hits
        x = reps[i]
        rows = list(x.decoding)
        seconds = k["A"] + k["RD"] * len(rows)
        prefill: list[Req] = []
        room = budget - len(rows)
        while x.waiting:
            r = x.waiting[0]
            held = x.cached.get(r.prompt, 0) * block
            if tokens - held > room and (prefill or rows):
                break
            got = x.reserve(r.prompt, shared, private)
            if got is None:
                break
            x.waiting.popleft()
            r.hit = got * block
            room -= tokens - r.hit
            queries += tokens
            hits += r.hit
            seconds += step_seconds(tokens - r.hit, r.hit, k)
            prefill.append(r)
        if not rows and not prefill:
            x.busy = False  # only when the pool cannot take the head request and nothing runs
            return
        x.busy = True
        advance(i ^ 1, now)
        x.step = [seconds, now, prefill, rows]
        schedule(i, now)
        schedule(i ^ 1, now)

    def rate(i: int) -> float:
        """A step's progress per second: slower while the other replica of its host runs one too."""
        return 1 / share if i ^ 1 < replicas and reps[i ^ 1].step else 1.0

    def advance(i: int, now: float) -> None:
        if i < replicas and reps[i].step:
            s = reps[i].step
            s[0] -= (now - s[1]) * rate(i)
            s[1] = now

    def schedule(i: int, now: float) -> None:
        if i < replicas and reps[i].step:
            reps[i].version += 1
            push(now + reps[i].step[0] / rate(i), "step", (i, reps[i].version))

    plan_iter = list(reversed(list(enumerate(plan))))
    for c in range(clients):
        send(c, 0.0)
    while events:
        now, _, kind, payload = heapq.heappop(events)
        if kind == "arrive":
            arrive(payload, now)
            continue
        i, version = payload
        x = reps[i]
        if version != x.version:
            continue
        advance(i ^ 1, now)
        _, _, prefill, rows = x.step
        x.step = None
        schedule(i ^ 1, now)
        x.decoding = []
        for r in prefill:
            r.ttft = now - r.sent + overhead["ttft"] - overhead["cycle"]
            r.left = max_tokens - 1
            x.work -= r.est - decode_cost
        for r in rows:
            r.left -= 1
            x.work -= decode_cost / (max_tokens - 1)
        for r in prefill + rows:
            if r.left > 0:
                x.decoding.append(r)
            else:
                x.load -= 1
                x.private -= private
                x.pins[r.prompt] -= 1
                done.append(r)
                send(r.client, now)
        start(i, now)
    ms = [1000 * r.ttft for r in done if r.ttft is not None]
    counts = [0] * replicas
    for r in done:
        counts[r.replica] += 1
    return {"policy": policy, "replicas": replicas, "clients": clients, "prompts": prompts, "requests": len(done),
            "ids": sorted(r.id for r in done), "seconds": now, "req_per_s": len(done) / now,
            "hit_rate": hits / queries, "ttft_mean_ms": sum(ms) / len(ms), "ttft_p50_ms": percentile(ms, 50),
            "ttft_p99_ms": percentile(ms, 99), "per_replica": counts}


def scaled(policy: str, replicas: int, args: argparse.Namespace) -> dict:
    """N/2 copies of the 2-replica bench: clients, prompts and requests grow with N."""
    f = replicas / 2
    return simulate(policy, replicas, prompts=round(args.prompts * f), requests=round(args.num_requests * f),
                    clients=round(args.concurrency * f), zipf=args.zipf, seed=args.seed,
                    system_tokens=args.system_tokens, question_tokens=args.question_tokens,
                    max_tokens=args.max_tokens, kv_blocks=args.kv_blocks, budget=args.max_num_batched_tokens)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.sim.simulate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", default="2,8,32,64", help="replica counts (comma-separated)")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--prompts", type=int, default=8, help="system prompts per 2 replicas")
    p.add_argument("--system-tokens", type=int, default=2070,
                   help="tokens per system prompt (the bench's 2,048-token prompts overshoot by a few words; "
                        "its replicas log 2,064 cached tokens per hit)")
    p.add_argument("--question-tokens", type=int, default=28,
                   help="question tokens (the bench's prompts average 2,098 tokens in the replica logs)")
    p.add_argument("--zipf", type=float, default=1.0)
    p.add_argument("--kv-blocks", type=int, default=692, help="KV blocks of 16 per replica (the bench's 5 prompts)")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--num-requests", type=int, default=300, help="requests per 2 replicas")
    p.add_argument("--concurrency", type=int, default=8, help="closed-loop clients per 2 replicas")
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=report.RESULTS_DIR / "simulate.json")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    results = [scaled(policy, int(n), args) for n in args.replicas.split(",") for policy in args.policies.split(",")]
    print(report.table(["policy", "replicas", "clients", "prompts", "hit %", "TTFT mean ms", "TTFT P50 ms",
                        "TTFT P99 ms", "req/s"],
                       [[r["policy"], r["replicas"], r["clients"], r["prompts"], 100 * r["hit_rate"], r["ttft_mean_ms"],
                         r["ttft_p50_ms"], r["ttft_p99_ms"], r["req_per_s"]] for r in results]))
    check = []
    for policy, runs in MEASURED.items():
        sim = scaled(policy, 2, args)
        for name, i, value in (("mean TTFT ms", 0, sim["ttft_mean_ms"]), ("req/s", 1, sim["req_per_s"])):
            measured = sum(run[i] for run in runs) / len(runs)
            check.append([policy, name, value, measured, " / ".join(f"{run[i]:g}" for run in runs),
                          f"{100 * (value - measured) / measured:+.0f}%",
                          " / ".join(f"{100 * (value - run[i]) / run[i]:+.0f}%" for run in runs)])
    print("\nCheck against the 2-replica bench (measured: mean of the runs; error vs each run):")
    print(report.table(["policy", "figure", "simulated", "measured", "runs", "error", "per run"], check))
    for r in results:
        del r["ids"]
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    path = report.write_json(args.json, {"tool": "bench.sim.simulate", "settings": settings, "step": STEP,
                                         "overhead": OVERHEAD, "share": SHARE, "replicate": REPLICATE,
                                         "results": results, "check": check})
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
