"""`python -m bench.serving.shared_prefix`: shared system prompts across Prelude replicas behind
the real sglang-router, one run per router policy (cache_aware, then round_robin by default).

Workload (Preble's shared-prefix shape): P system prompts of about 2K tokens each; every request
picks one (Zipf-skewed: prompt k with weight 1/(k+1)^s) and appends a short question of its own.
The same request sequence (same seed) goes to every policy, from C closed-loop clients, streamed,
so TTFT is the time to the first streamed chunk as the client sees it through the router.

Each policy gets fresh replicas (cold caches) and a fresh router. Each replica's KV pool holds
--cache-prompts system prompts (default: a bit over half of P), so one replica cannot keep every
prompt but two together can: the cache-aware router should keep each prompt on one replica,
round-robin makes both replicas churn through all of them. Prefix-hit rate is read from the
replicas' /metrics (vllm:prefix_cache_hits_total / queries_total, in tokens), summed over both."""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import aiohttp
import httpx

from bench import progress
from bench.charts import write_chart
from bench.serving.core import report
from bench.serving.core.client import TRANSPORT_ERRORS, open_session
from bench.serving.core.server import ServerProcess, free_port, log_tail, prelude_env
from bench.serving.core.stats import percentile

WORDS = ("policy account review signal market client risk credit order yield region season supply ledger "
         "audit vendor margin stock price trend claim refund score label ticket queue route agent cache").split()


@dataclass(slots=True)
class PolicyResult:
    policy: str
    requests: int
    ok: int
    errors: int
    seconds: float
    req_per_s: float
    ttft_mean_ms: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    hit_rate: float | None  # prefix-cache hit tokens / looked-up tokens, both replicas
    per_replica: list[int]  # requests each replica finished


def system_prompts(count: int, tokens: int, tokenize, seed: int) -> list[str]:
    """`count` distinct texts of at least `tokens` tokens (by the served tokenizer); distinct from
    the first word, so neither a token-block cache nor a character tree sees two as related."""
    out = []
    for k in range(count):
        rng = random.Random(seed * 1000 + k)
        words = [f"System prompt {k}: you are agent {rng.randrange(10**6)}."]
        while True:
            words.extend(rng.choice(WORDS) for _ in range(16))
            text = " ".join(words)
            if tokenize(text) >= tokens:
                break
        out.append(text)
    return out


def plan_requests(num: int, prompts: int, zipf_s: float, seed: int) -> list[tuple[int, str]]:
    """(prompt index, question) per request, the same for every policy."""
    rng = random.Random(seed)
    weights = [1 / (k + 1) ** zipf_s for k in range(prompts)]
    return [(rng.choices(range(prompts), weights)[0],
             f"\nQuestion {i}: should {rng.choice(WORDS)} {rng.randrange(1000)} be approved?")
            for i in range(num)]


class Router:
    """The real sglang-router in front of the replicas (no tokenizer flags: it learns the model
    and tokenizer from the replicas' /model_info, as in tests/server/test_router.py)."""

    def __init__(self, workers: Sequence[str], policy: str, log_path: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        log = open(log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *workers,
                                      "--policy", policy, "--host", "127.0.0.1", "--port", str(self.port),
                                      "--log-level", "warn"], stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        log.close()
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(self.url + "/v1/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"sglang-router did not come up; log {log_path}:\n{log_tail(log_path)}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def counters(url: str) -> tuple[float, float, float]:
    """(prefix-cache query tokens, hit tokens, finished requests) from a replica's /metrics."""
    values = {"vllm:prefix_cache_queries_total": 0.0, "vllm:prefix_cache_hits_total": 0.0,
              "vllm:request_success_total": 0.0}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in values:
            values[name] += float(line.rsplit(" ", 1)[1])
    return (values["vllm:prefix_cache_queries_total"], values["vllm:prefix_cache_hits_total"],
            values["vllm:request_success_total"])


async def drive(url: str, model: str, texts: list[str], plan: list[tuple[int, str]], concurrency: int,
                max_tokens: int, show: bool) -> tuple[list[float], int, float]:
    """Closed loop: `concurrency` clients take the next planned request as each finishes.
    Returns (TTFTs of the successful requests, errors, wall seconds)."""
    ttfts: list[float] = []
    errors = 0
    queue = list(reversed(plan))
    bar = progress.bar(len(plan), "requests", show, unit="req")

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        while queue:
            k, question = queue.pop()
            body = {"model": model, "prompt": texts[k] + question, "max_tokens": max_tokens, "temperature": 0,
                    "stream": True}
            sent = time.perf_counter()
            first = None
            try:
                async with session.post(url + "/v1/completions", json=body) as r:
                    if r.status != 200:
                        if not errors:
                            detail = (await r.read()).decode(errors="replace")[:300]
                            progress.say(f"first error: {r.status} {detail}")
                        errors += 1
                        bar.update(1)
                        continue
                    async for raw in r.content:
                        line = raw.decode("utf-8", "replace")
                        if first is None and line.startswith("data:") and line.strip() != "data: [DONE]":
                            first = time.perf_counter() - sent
                ttfts.append(first if first is not None else time.perf_counter() - sent)
            except TRANSPORT_ERRORS:
                errors += 1
            bar.update(1)

    async with open_session(concurrency, 600) as session:
        began = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        seconds = time.perf_counter() - began
    bar.close()
    return ttfts, errors, seconds


def run_policy(args: argparse.Namespace, policy: str, texts: list[str] | None, log_dir: Path
               ) -> tuple[PolicyResult, list[str]]:
    env = prelude_env()
    env.setdefault("OMP_NUM_THREADS", str(args.replica_threads))  # two replicas share the cores
    model = ["--model", args.model] if args.model else []
    replica_args = [*model, "--num-kv-blocks", str(args.kv_blocks), "--block-size", str(args.block_size),
                    "--max-model-len", str(args.prompt_tokens + 1024), *args.server_args]
    with ServerProcess(replica_args, env=env, label=f"{policy}-a", log_path=log_dir / f"{policy}-a.log") as a, \
            ServerProcess(replica_args, env=env, label=f"{policy}-b", log_path=log_dir / f"{policy}-b.log") as b:
        name = httpx.get(a.base_url + "/v1/models").json()["data"][0]["id"]
        if texts is None:
            def tokenize(text: str) -> int:
                return httpx.post(a.base_url + "/tokenize", json={"prompt": text}, timeout=30).json()["count"]
            texts = system_prompts(args.prompts, args.prompt_tokens, tokenize, args.seed)
        router = Router([a.base_url, b.base_url], policy, log_dir / f"{policy}-router.log")
        try:
            before = [counters(s.base_url) for s in (a, b)]
            plan = plan_requests(args.num_requests, args.prompts, args.zipf, args.seed)
            ttfts, errors, seconds = asyncio.run(drive(router.url, name, texts, plan, args.concurrency,
                                                       args.max_tokens, not args.no_progress))
            after = [counters(s.base_url) for s in (a, b)]
        finally:
            router.stop()
    queries = sum(x[0] - y[0] for x, y in zip(after, before))
    hits = sum(x[1] - y[1] for x, y in zip(after, before))
    ms = [1000 * t for t in ttfts]
    return PolicyResult(policy, len(plan), len(ttfts), errors, seconds, len(ttfts) / seconds,
                        sum(ms) / len(ms) if ms else None, percentile(ms, 50), percentile(ms, 99),
                        hits / queries if queries else None,
                        [int(x[2] - y[2]) for x, y in zip(after, before)]), texts


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.serving.shared_prefix", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model directory (default: the demo model)")
    p.add_argument("--policies", default="cache_aware,round_robin", help="sglang-router --policy values, in order")
    p.add_argument("--prompts", type=int, default=8, help="system prompts (P)")
    p.add_argument("--prompt-tokens", type=int, default=2048, help="tokens per system prompt")
    p.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent s of the prompt choice")
    p.add_argument("--cache-prompts", type=float, default=5.0,
                   help="system prompts one replica's KV pool holds (sets --num-kv-blocks)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-requests", type=int, default=300)
    p.add_argument("--concurrency", type=int, default=8, help="closed-loop clients")
    p.add_argument("--max-tokens", type=int, default=4, help="tokens generated per request")
    p.add_argument("--replica-threads", type=int, default=1, help="OMP_NUM_THREADS of each replica")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=report.RESULTS_DIR / "shared_prefix.json")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("server_args", nargs="*", help="after a lone --: flags for both replicas")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    per_prompt = -(-(args.prompt_tokens + 64) // args.block_size)
    args.kv_blocks = int(args.cache_prompts * per_prompt) + args.concurrency * 4
    log_dir = args.json.parent / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    results: list[PolicyResult] = []
    texts = None
    for policy in args.policies.split(","):
        result, texts = run_policy(args, policy, texts, log_dir)
        results.append(result)
        progress.say(f"{policy}: {json.dumps(asdict(result))}")
    rows = [[r.policy, r.ok, r.errors, r.req_per_s, r.ttft_mean_ms, r.ttft_p50_ms, r.ttft_p99_ms,
             None if r.hit_rate is None else 100 * r.hit_rate, "/".join(map(str, r.per_replica))] for r in results]
    print()
    print(report.table(["policy", "ok", "err", "req/s", "TTFT mean ms", "TTFT P50 ms", "TTFT P99 ms", "hit %",
                        "per replica"], rows))
    print(f"(P={args.prompts} prompts of {args.prompt_tokens} tokens, Zipf s={args.zipf}, {args.num_requests} "
          f"requests, {args.concurrency} clients, {args.max_tokens} tokens out, {args.kv_blocks} KV blocks of "
          f"{args.block_size} per replica = {args.cache_prompts:g} prompts)")
    ratios = {}
    if len(results) >= 2 and results[0].ttft_mean_ms and results[1].ttft_mean_ms:
        first, second = results[0], results[1]
        ratios = {"mean_ttft_x": second.ttft_mean_ms / first.ttft_mean_ms,
                  "req_per_s_x": first.req_per_s / second.req_per_s}
        print(f"{second.policy} / {first.policy} mean TTFT: {ratios['mean_ttft_x']:.2f}x; "
              f"{first.policy} / {second.policy} req/s: {ratios['req_per_s_x']:.2f}x")
    path = report.write_json(args.json, {
        "tool": "bench.serving.shared_prefix", "argv": list(sys.argv if argv is None else argv),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "results": [asdict(r) for r in results], "ratios": ratios})
    print(f"results: {path}")
    write_chart(lambda out: _plot(results, out), args.json.with_suffix(".png"))
    return 0


def _plot(results: list[PolicyResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(11, 3.6))
    labels = [r.policy for r in results]
    x = range(len(results))
    axes[0].bar([i - 0.2 for i in x], [r.ttft_mean_ms or 0 for r in results], 0.4, label="mean")
    axes[0].bar([i + 0.2 for i in x], [r.ttft_p99_ms or 0 for r in results], 0.4, label="P99")
    axes[0].set_ylabel("TTFT ms")
    axes[0].legend()
    axes[1].bar(labels, [100 * (r.hit_rate or 0) for r in results])
    axes[1].set_ylabel("prefix-cache hit %")
    axes[2].bar(labels, [r.req_per_s for r in results])
    axes[2].set_ylabel("req/s")
    for ax in axes:
        ax.set_xticks(list(x), labels)
    fig.suptitle("2 Prelude replicas behind sglang-router: shared 2K-token system prompts")
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    sys.exit(main())
