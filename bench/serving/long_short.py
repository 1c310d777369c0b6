"""`python -m bench.serving.long_short`: short score requests (128 tokens) mixed with long
embedding requests (8K tokens), Poisson arrivals at about 70% of capacity, against one server
per scheduling policy, with and without deadlines on the short requests, and first against plain
FCFS (`fcfs` without layer preemption, the baseline the policies are measured against) and the
short requests alone at the same rate (their own queueing, the floor of their P99). Then an
overload run: 1,000 concurrent requests against a bounded queue.

Reports, per policy: short-request latency P50/P99 (a OneShot result is its first token),
long-request throughput and longest wait, SLO attainment of the short requests, rejections.
Capacity is calibrated first on an unloaded server: each shape's service time, alone. The short
requests' unloaded P99 is taken two ways: back to back (the server kept busy by one client,
its best case) and one at a time after idle gaps as long as the mixed run's (a server idle for
tens of milliseconds starts its next request slower on a shared VM); each policy's short P99 is
given as a multiple of both."""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import aiohttp

from bench import progress
from bench.serving.core import report
from bench.serving.core.client import TRANSPORT_ERRORS, open_session
from bench.serving.overload import overload, rss_mb
from bench.serving.core.server import ServerProcess, prelude_env
from bench.serving.core.stats import percentile, poisson_arrivals

SHORT_TOKENS, LONG_TOKENS = 128, 8192
BASELINE = "fcfs-whole-steps"  # fcfs with --no-layer-preemption: a long step runs to its end
# The short requests alone at the same rate: what their own Poisson queueing costs the P99, the
# floor no policy can go below with long requests beside them.
SHORTS_ALONE = "shorts alone"
CALIBRATION_PASSES = 3


def _ids(n: int, rng: random.Random) -> list[int]:
    return [rng.randrange(3, 500) for _ in range(n)]


@dataclass(slots=True)
class Outcome:
    kind: str  # "short" | "long"
    sent: float
    latency: float
    status: int  # 0: no HTTP response
    error: str = ""  # for a status other than 200 and 503: the body or the exception


@dataclass(slots=True)
class PolicyResult:
    policy: str
    deadlines: bool
    short_p50_ms: float | None
    short_p99_ms: float | None
    slo_attainment: float | None  # share of short requests answered 200 within the deadline
    long_per_s: float
    long_max_wait_s: float | None
    longs_completed: int
    rejected: int
    errors: int
    outcomes: list[Outcome] = field(default_factory=list, repr=False)


async def _send(session: aiohttp.ClientSession, url: str, kind: str, body: dict, headers: dict, at: float,
                began: float, out: list[Outcome]) -> None:
    await asyncio.sleep(max(0.0, began + at - time.perf_counter()))
    sent = time.perf_counter()
    path = "/v1/score" if kind == "short" else "/v1/embeddings"
    error = ""
    try:
        async with session.post(url + path, json=body, headers=headers) as response:
            answer = await response.read()
        status = response.status
        if status not in (200, 503):
            error = answer[:200].decode("utf-8", "replace")
    except TRANSPORT_ERRORS as exc:
        status, error = 0, repr(exc)
    out.append(Outcome(kind, sent - began, time.perf_counter() - sent, status, error))


def _short_body(rng: random.Random) -> dict:
    return {"query": _ids(SHORT_TOKENS - 8, rng), "items": [_ids(8, rng)], "label_token_ids": [5, 9]}


def _long_body(rng: random.Random, tokens: int = LONG_TOKENS) -> dict:
    return {"input": [_ids(tokens, rng)]}


async def calibrate(url: str, rng: random.Random, long_tokens: int) -> tuple[float, float, float]:
    """(short service s, long service s, unloaded short P99 s), one request at a time. The
    shorts run in CALIBRATION_PASSES passes of 200 (a P99 of a few dozen samples is their worst
    one) and each figure is the passes' median: one pass's P99 is its second-worst request, and
    on the 2-core machine it ranged 14-26 ms between runs, moving both targets with it."""
    async with open_session(1, 600) as session:
        p50s, p99s = [], []
        for _ in range(CALIBRATION_PASSES):
            shorts = await _shorts_one_at_a_time(session, url, rng, 200)
            p50s.append(percentile(shorts, 50) or 0.0)
            p99s.append(percentile(shorts, 99) or 0.0)
        longs = []
        for _ in range(2):
            t = time.perf_counter()
            async with session.post(url + "/v1/embeddings", json=_long_body(rng, long_tokens)) as response:
                await response.read()
            longs.append(time.perf_counter() - t)
    return statistics.median(p50s), min(longs), statistics.median(p99s)


async def unloaded_after_gaps(url: str, rng: random.Random, rate: float, n: int = 300) -> float:
    """P99 of short requests sent one at a time, each after an exponential idle gap of mean
    1/rate: no two overlap, but the server idles between them as long as in a Poisson run at
    that rate. On the 2-core VM gaps of 32-100 ms made the next request 20-50% slower at P50 and
    P99 than back to back, and a bare GEMM loop on 2 threads up to 2x (most likely the host
    descheduling the idle vCPU), so back to back alone understates an idle server's latency."""
    async with open_session(1, 600) as session:
        return percentile(await _shorts_one_at_a_time(session, url, rng, n, rate), 99) or 0.0


async def _shorts_one_at_a_time(session: aiohttp.ClientSession, url: str, rng: random.Random, n: int,
                                gap_rate: float = 0.0) -> list[float]:
    """Latencies of n short requests sent one after another; with gap_rate, each after an
    exponential idle gap of mean 1/gap_rate."""
    times = []
    for _ in range(n):
        if gap_rate:
            await asyncio.sleep(rng.expovariate(gap_rate))
        body = _short_body(rng)
        t = time.perf_counter()
        async with session.post(url + "/v1/score", json=body) as response:
            await response.read()
        times.append(time.perf_counter() - t)
    return times


async def mixed_run(url: str, seconds: float, short_rate: float, long_rate: float, deadline_ms: float | None,
                    seed: int, long_tokens: int) -> list[Outcome]:
    rng = random.Random(seed)
    # A zero rate (--long-share 0: the short requests alone, the reference for their queueing)
    # sends none of that kind.
    plan = [(t, kind) for kind, rate in (("short", short_rate), ("long", long_rate)) if rate > 0
            for t in poisson_arrivals(rate, rng, horizon=seconds)]
    plan.sort()
    headers = {} if deadline_ms is None else {"X-Deadline-Ms": f"{deadline_ms:.1f}"}
    out: list[Outcome] = []
    async with open_session(2000, 600) as session:
        began = time.perf_counter()
        await asyncio.gather(*(
            _send(session, url, kind, _short_body(rng) if kind == "short" else _long_body(rng, long_tokens),
                  headers if kind == "short" else {}, at, began, out) for at, kind in plan))
    return out


def summarize(policy: str, deadlines: bool, outcomes: list[Outcome], deadline_s: float, seconds: float) -> PolicyResult:
    shorts = [o for o in outcomes if o.kind == "short"]
    ok_short = [o.latency for o in shorts if o.status == 200]
    longs = [o for o in outcomes if o.kind == "long" and o.status == 200]
    met = sum(1 for o in shorts if o.status == 200 and o.latency <= deadline_s)
    return PolicyResult(
        policy, deadlines,
        None if not ok_short else 1000 * (percentile(ok_short, 50) or 0),
        None if not ok_short else 1000 * (percentile(ok_short, 99) or 0),
        met / len(shorts) if shorts else None,
        len(longs) / seconds, max((o.latency for o in longs), default=None), len(longs),
        sum(1 for o in outcomes if o.status == 503), sum(1 for o in outcomes if o.status not in (200, 503)),
        outcomes)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.serving.long_short", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model directory (default: the demo model)")
    p.add_argument("--policies", default="fcfs,sjf,edf")
    p.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True,
                   help="also run fcfs with --no-layer-preemption, the plain FCFS the policies are measured against")
    p.add_argument("--shorts-alone", action=argparse.BooleanOptionalAction, default=True,
                   help="also run the short requests alone at the same arrival rate (first policy): the "
                        "queueing floor of their P99, with no long request to wait for")
    p.add_argument("--seconds", type=float, default=30.0, help="length of each mixed run")
    p.add_argument("--load", type=float, default=0.7, help="offered load as a share of capacity")
    p.add_argument("--long-share", type=float, default=0.5, help="share of the offered work that is long")
    p.add_argument("--long-tokens", type=int, default=LONG_TOKENS,
                   help="tokens of a long request (below the step budget, 8,192, short ones could share its step)")
    p.add_argument("--idle-requests", type=int, default=300,
                   help="short requests of the unloaded-after-idle-gaps calibration (0: skip it)")
    p.add_argument("--deadline-x", type=float, default=2.0,
                   help="short-request deadline as a multiple of the unloaded short P99")
    p.add_argument("--deadlines", choices=("both", "on", "off"), default="both",
                   help="run each policy with and without short-request deadlines (both), or one way only")
    p.add_argument("--deadline-ms", type=float,
                   help="a fixed short-request deadline instead (runs stay comparable when the unloaded P99 "
                        "moves between calibrations, as it does on a shared VM)")
    p.add_argument("--overload", type=int, default=1000, help="concurrent requests of the overload run (0: skip)")
    p.add_argument("--max-queued-requests", type=int, default=256, help="queue bound in the overload run")
    p.add_argument("--overload-only", action="store_true",
                   help="skip the calibration and the policy runs: only the overload run")
    p.add_argument("--server-args", default="",
                   help="more flags for every server, e.g. '--max-num-batched-tokens 2048'")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=report.RESULTS_DIR / "long_short.json")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def server_args(args: argparse.Namespace, policy: str, extra: Sequence[str] = ()) -> list[str]:
    model = ["--model", args.model] if args.model else []
    return [*model, "--max-model-len", str(max(LONG_TOKENS, args.long_tokens) + 64), "--scheduling-policy", policy,
            *args.server_args.split(), *extra]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    env = prelude_env()
    calibration, results = ({}, []) if args.overload_only else policy_runs(args, env)
    over = None
    if args.overload:
        policy = args.policies.split(",")[0]
        with ServerProcess(server_args(args, policy, ["--max-queued-requests", str(args.max_queued_requests)]),
                           env=env, label="overload") as server:
            rng = random.Random(args.seed)
            over = asyncio.run(overload(server.base_url, args.overload, lambda: _short_body(rng), server.log_path))
            over["server_peak_rss_mb"] = rss_mb(server.pid)
        print(f"\noverload ({policy}, --max-queued-requests {args.max_queued_requests}): {json.dumps(over)}")
    path = report.write_json(args.json, {
        "tool": "bench.serving.long_short", "argv": list(sys.argv if argv is None else argv),
        "calibration": calibration,
        "results": [{k: v for k, v in asdict(r).items() if k != "outcomes"} for r in results],
        "overload": over})
    print(f"results: {path}")
    if results:
        _plot(results, args.json.with_suffix(".png"))
    return 0


def policy_runs(args: argparse.Namespace, env: dict[str, str]) -> tuple[dict, list[PolicyResult]]:
    """The calibration, then one mixed run per policy with and without deadlines (printed)."""
    rng = random.Random(args.seed)
    with ServerProcess(server_args(args, "fcfs"), env=env, label="calibration") as server:
        t_short, t_long, p99_unloaded = asyncio.run(calibrate(server.base_url, rng, args.long_tokens))
        long_rate = args.load * args.long_share / t_long
        short_rate = args.load * (1 - args.long_share) / t_short
        p99_idle = (asyncio.run(unloaded_after_gaps(server.base_url, rng, short_rate, args.idle_requests))
                    if short_rate and args.idle_requests else None)
    # the stricter reference, unless fixed
    deadline_s = args.deadline_ms / 1000 if args.deadline_ms else args.deadline_x * p99_unloaded
    print(f"calibration: short {1000 * t_short:.1f} ms, long {1000 * t_long:.0f} ms, unloaded short P99 "
          f"{1000 * p99_unloaded:.1f} ms back to back, {_ms(p99_idle)} ms after idle gaps; offered "
          f"{short_rate:.1f} short/s + {long_rate:.2f} long/s; short deadline {1000 * deadline_s:.1f} ms", flush=True)
    results: list[PolicyResult] = []
    with_deadlines = {"both": (False, True), "on": (True,), "off": (False,)}[args.deadlines]
    runs = [(policy, policy, deadlines) for policy in args.policies.split(",") for deadlines in with_deadlines]
    if args.baseline:  # deadlines change nothing for it: fcfs ignores them and nothing is shed
        runs.insert(0, (BASELINE, "fcfs", False))
    if args.shorts_alone:
        runs.insert(0, (SHORTS_ALONE, args.policies.split(",")[0], False))
    for label, policy, deadlines in progress.each(runs, "policy runs", not args.no_progress, unit="run"):
        extra = ["--no-layer-preemption"] if label == BASELINE else []
        with ServerProcess(server_args(args, policy, extra), env=env, label=label) as server:
            outcomes = asyncio.run(mixed_run(server.base_url, args.seconds, short_rate,
                                             0.0 if label == SHORTS_ALONE else long_rate,
                                             1000 * deadline_s if deadlines else None, args.seed, args.long_tokens))
        results.append(summarize(label, deadlines, outcomes, deadline_s, args.seconds))

    def times(p99_ms: float | None, reference_s: float | None) -> float | None:
        return None if p99_ms is None or not reference_s else p99_ms / (1000 * reference_s)

    rows = [[r.policy, "yes" if r.deadlines else "no", r.short_p50_ms, r.short_p99_ms,
             times(r.short_p99_ms, p99_unloaded), times(r.short_p99_ms, p99_idle),
             None if r.slo_attainment is None else 100 * r.slo_attainment, r.long_per_s, r.longs_completed,
             r.long_max_wait_s, r.rejected, r.errors] for r in results]
    print()
    print(report.table(["policy", "deadlines", "short P50 ms", "short P99 ms", "x b2b", "x idle", "SLO %", "long/s",
                        "longs", "long max s", "503", "err"], rows))
    print(f"(unloaded short P99 {1000 * p99_unloaded:.1f} ms back to back (x b2b), {_ms(p99_idle)} ms after "
          f"idle gaps (x idle); SLO = answered within {1000 * deadline_s:.1f} ms)")
    for r in results:
        failed = [o for o in r.outcomes if o.status not in (200, 503)]
        if failed:
            first = failed[0]
            print(f"errors under {r.policy}: {len(failed)}, first: {first.kind} {first.status} {first.error}")
    calibration = {"short_s": t_short, "long_s": t_long, "unloaded_short_p99_s": p99_unloaded,
                   "unloaded_after_gaps_short_p99_s": p99_idle,
                   "short_rate": short_rate, "long_rate": long_rate, "deadline_s": deadline_s}
    return calibration, results


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.1f}"


def _plot(results: list[PolicyResult], path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        print("(no plot: matplotlib is not installed)")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    labels = [f"{r.policy}{'+dl' if r.deadlines else ''}" for r in results]
    axes[0].bar(labels, [r.short_p99_ms or 0 for r in results])
    axes[0].set_ylabel("short P99 ms")
    axes[1].bar(labels, [100 * (r.slo_attainment or 0) for r in results])
    axes[1].set_ylabel("SLO attainment %")
    for ax in axes:
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path)
    print(f"plot: {path}")


if __name__ == "__main__":
    sys.exit(main())
