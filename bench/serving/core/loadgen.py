"""`python -m bench.serving`: the load generator. Sweeps closed-loop concurrency or open-loop
Poisson rates over one or more workloads, against a URL or against Prelude servers it launches
itself (two of them, one after the other, for the execution-class ablation)."""
from __future__ import annotations

import argparse
import asyncio
import random
import shlex
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import httpx

from bench.charts import write_chart
from bench.serving.core import report
from bench.serving.core.client import ClientPool, make_client
from bench.serving.core.prompts import LocalTokenizer, PromptFactory, RemoteTokenizer, TextTokenizer, TokenizerError
from bench.serving.core.runner import Level, Limits, RunResult, run_level
from bench.serving.core.server import ServerError, ServerProcess, parse_command, prelude_env
from bench.serving.core.workloads import (
    Choice,
    Embed,
    Fixed,
    Options,
    PromptLogprobs,
    Score,
    SharedPrefix,
    Workload,
)

DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 96)
WORKLOADS = ("fixed", "embed", "prompt-logprobs", "choice", "score", "recommend", "system-prompt")
# Shared-prefix presets: (prefixes, prefix tokens, suffix tokens, output tokens).
SHARED_PRESETS = {"recommend": (4, 1024, 64, 1), "system-prompt": (8, 512, 64, 32)}


@dataclass(slots=True)
class Target:
    label: str
    base_url: str
    server: ServerProcess | None = None


def split_server_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Everything after a lone `--` is passed to the launched server(s)."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def int_list(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def float_list(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def shapes(text: str) -> list[tuple[int, int]]:
    """'128/1,512/1,128/32' -> [(128, 1), (512, 1), (128, 32)]."""
    out = []
    for item in text.split(","):
        input_len, _, output_len = item.partition("/")
        out.append((int(input_len), int(output_len or 1)))
    return out


def add_target_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("target")
    g.add_argument("--base-url", help="benchmark this server (else: launch Prelude with the flags after --)")
    g.add_argument("--server-cmd", help="command launching the server (default: this python -m prelude)")
    g.add_argument("--ablation", action="store_true",
                   help="launch two servers in turn, the second with --disable-oneshot, and compare")
    g.add_argument("--compare", metavar="FLAGS", default=None,
                   help="launch a second server with these extra flags (e.g. '--no-enable-prefix-caching') "
                        "after the first, and compare")
    g.add_argument("--api-key", help="bearer token to send")
    g.add_argument("--model-name", help="the 'model' field to send (default: the first of GET /v1/models)")
    g.add_argument("--tokenizer", help="local tokenizer.json (or model dir) instead of the target's /tokenize")
    g.add_argument("--log-dir", type=Path, default=report.RESULTS_DIR / "logs", help="launched servers' logs")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.serving", description=__doc__,
                                epilog="Flags after a lone -- go to the launched server(s).")
    add_target_args(p)
    w = p.add_argument_group("workload")
    w.add_argument("--workload", default="fixed", help=f"comma list of: {', '.join(WORKLOADS)}")
    w.add_argument("--input-len", type=int, default=128)
    w.add_argument("--output-len", type=int, default=1)
    w.add_argument("--shapes", type=shapes, help="fixed-workload shapes IN/OUT,... (e.g. 128/1,512/1,128/32)")
    w.add_argument("--num-prefixes", type=int, help="shared-prefix workloads: users / system prompts")
    w.add_argument("--prefix-len", type=int, help="shared-prefix workloads: shared tokens")
    w.add_argument("--suffix-len", type=int, help="shared-prefix workloads: distinct tokens per request")
    w.add_argument("--shared-output-len", type=int, help="shared-prefix workloads: output tokens")
    w.add_argument("--query-len", type=int, default=256, help="score: shared query tokens")
    w.add_argument("--item-len", type=int, default=32, help="score: tokens per item")
    w.add_argument("--items", type=int, default=8, help="score: items per request")
    w.add_argument("--fresh-query", action="store_true",
                   help="score: a new query per request, so only a request's own items share it")
    w.add_argument("--label-token-ids", type=int_list, help="score: two ids (default: 'yes', 'no')")
    w.add_argument("--prompt-format", choices=("ids", "text"), default="ids",
                   help="send prompts as token ids (exact) or as text")
    w.add_argument("--no-ignore-eos", action="store_true", help="do not send ignore_eos")
    load = p.add_argument_group("load")
    load.add_argument("--concurrency", type=int_list, help="closed-loop levels (default 1,2,4,...,96)")
    load.add_argument("--qps", type=float_list, help="open-loop Poisson rates (replaces the default sweep)")
    load.add_argument("--num-requests", type=int,
                      help="per level (default: 10 x concurrency, at least 200; open loop: 30 s of arrivals)")
    load.add_argument("--duration", type=float, help="per level, seconds: stop sending after this")
    load.add_argument("--warmup", type=int, default=8, help="unmeasured requests before each level")
    load.add_argument("--timeout", type=float, default=600.0, help="per request, seconds")
    load.add_argument("--max-connections", type=int, default=1024, help="open loop: connection pool size")
    load.add_argument("--seed", type=int, default=0)
    out = p.add_argument_group("output")
    out.add_argument("--json", type=Path, help="results file (default bench-results/serving-<time>.json)")
    out.add_argument("--plot", type=Path, help="latency-vs-throughput chart (default: the JSON's path, .png)")
    out.add_argument("--save-requests", action="store_true", help="per-request records in the JSON")
    out.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    return p


def levels(args: argparse.Namespace) -> list[Level]:
    out = [Level("concurrency", c) for c in (args.concurrency or ([] if args.qps else DEFAULT_CONCURRENCY))]
    return out + [Level("qps", q) for q in args.qps or ()]


def limits_for(args: argparse.Namespace, level: Level) -> Limits:
    count = args.num_requests
    if count is None:
        count = max(200, int(10 * level.value)) if level.mode == "concurrency" else max(200, int(30 * level.value))
    return Limits(count, args.duration, args.warmup, args.timeout, args.max_connections)


async def model_name(client: httpx.AsyncClient) -> str | None:
    try:
        resp = await client.get("/v1/models")
        return resp.json()["data"][0]["id"] if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError, IndexError):
        return None


async def label_ids(tokenizer: TextTokenizer) -> tuple[int, int]:
    yes, no = await tokenizer.encode("yes", False), await tokenizer.encode("no", False)
    return yes[-1], no[-1]


async def build_workloads(args: argparse.Namespace, factory: PromptFactory, tokenizer: TextTokenizer,
                          options: Options) -> list[Workload]:
    out: list[Workload] = []
    for name in (w.strip() for w in args.workload.split(",")):
        if name == "fixed":
            out += [Fixed(factory, options, i, o) for i, o in args.shapes or [(args.input_len, args.output_len)]]
        elif name == "embed":
            out.append(Embed(factory, options, args.input_len))
        elif name == "prompt-logprobs":
            out.append(PromptLogprobs(factory, options, args.input_len))
        elif name == "choice":
            out.append(Choice(factory, options, args.input_len))
        elif name in SHARED_PRESETS:
            n, prefix, suffix, output = SHARED_PRESETS[name]
            out.append(SharedPrefix(factory, options, name, args.num_prefixes or n, args.prefix_len or prefix,
                                    args.suffix_len or suffix, args.shared_output_len or output, args.seed))
        elif name == "score":
            ids = tuple(args.label_token_ids) if args.label_token_ids else await label_ids(tokenizer)
            if len(ids) != 2:
                raise SystemExit("--label-token-ids takes two ids")
            out.append(Score(factory, options, args.query_len, args.item_len, args.items, ids, args.seed,
                             args.fresh_query))
        else:
            raise SystemExit(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    return out


async def reachable(pool: ClientPool, workload: Workload, rng: random.Random) -> bool:
    """One probe request; False (with a message) when the endpoint does not exist there."""
    record = await pool.send(workload.jobs(1, rng)[0])
    if record.error and record.error.startswith("HTTP 404"):
        print(f"skipping {workload.label}: the target answers 404 on {workload.path} ({record.error})",
              file=sys.stderr)
        return False
    return True


async def prompt_source(client: httpx.AsyncClient, tokenizer_path: str | None,
                        model: str | None = None) -> tuple[str | None, TextTokenizer, PromptFactory]:
    """The model name to send (`model`, else the target's first), the tokenizer (local with a
    path, else the target's /tokenize through `client`) and the exact-length prompt factory."""
    model = model or await model_name(client)
    tokenizer: TextTokenizer = LocalTokenizer(tokenizer_path) if tokenizer_path else RemoteTokenizer(client, model)
    return model, tokenizer, await PromptFactory.from_tokenizer(tokenizer)


def launch_plan(runs: Sequence[tuple[str, list[str]]], server_cmd: str | None, log_dir: Path,
                log_tag: str = "") -> list[ServerProcess]:
    """One (not yet started) server per (label, flags), run one after the other, each logging to
    log_dir/<time>-<log_tag><label>.log."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return [ServerProcess(flags, parse_command(server_cmd), prelude_env(), log_dir / f"{stamp}-{log_tag}{label}.log",
                          label) for label, flags in runs]


@contextmanager
def started(server: ServerProcess) -> Iterator[ServerProcess]:
    """The server started (ServerError if it never gets healthy), and stopped on the way out."""
    print(f"starting {server.label}: {' '.join(server.argv)} (log {server.log_path})", file=sys.stderr)
    try:
        server.start()
        yield server
    finally:
        server.stop()


async def bench_target(target: Target, args: argparse.Namespace) -> list[RunResult]:
    rng = random.Random(args.seed)  # same seed per target: every server gets the same requests
    async with make_client(target.base_url, 4, args.timeout, args.api_key) as client:
        model, tokenizer, factory = await prompt_source(client, args.tokenizer, args.model_name)
        options = Options(model, args.prompt_format, not args.no_ignore_eos)
        workloads = await build_workloads(args, factory, tokenizer, options)
        if args.prompt_format == "text":
            samples = [w.make_prompt(random.Random(1)) for w in workloads if not isinstance(w, Score)]
            await factory.verify(tokenizer, samples)
    async with ClientPool(target.base_url, 1, args.timeout, args.api_key) as probe:
        workloads = [w for w in workloads if await reachable(probe, w, random.Random(-1))]
    results = []
    pid = target.server.pid if target.server else None
    for workload in workloads:
        for level in levels(args):
            results.append(await run_level(target.base_url, workload, level, limits_for(args, level), rng,
                                           target.label, pid, args.api_key, not args.no_progress,
                                           args.save_requests))
    return results


def comparison_labels(args: argparse.Namespace) -> tuple[str, str] | None:
    if args.ablation:
        return ("oneshot", "ablation")
    return ("prelude", "compare") if args.compare else None


def comparison_flags(args: argparse.Namespace) -> list[str]:
    return ["--disable-oneshot"] if args.ablation else shlex.split(args.compare or "")


def targets(args: argparse.Namespace, server_args: list[str]) -> list[Target]:
    if args.base_url:
        if args.ablation or args.compare or server_args:
            raise SystemExit("--ablation, --compare and server flags need a launched server; drop --base-url")
        return [Target("target", args.base_url.rstrip("/"))]
    labels = comparison_labels(args)
    if labels is None:
        runs = [("prelude", server_args)]
    else:
        runs = [(labels[0], server_args), (labels[1], [*server_args, *comparison_flags(args)])]
    servers = launch_plan(runs, args.server_cmd, args.log_dir)
    return [Target(server.label, server.base_url, server) for server in servers]


async def run(args: argparse.Namespace, server_args: list[str]) -> tuple[list[RunResult], list[dict]]:
    results: list[RunResult] = []
    info: list[dict] = []
    for target in targets(args, server_args):
        server = target.server
        with started(server) if server is not None else nullcontext():
            results += await bench_target(target, args)
        info.append({"label": target.label, "base_url": target.base_url,
                     "argv": server.argv if server else None, "log": str(server.log_path) if server else None,
                     "startup_s": server.startup_s if server else None})
    return results, info


def main(argv: Sequence[str] | None = None) -> int:
    own, server_args = split_server_args(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(own)
    started = time.time()
    try:
        results, info = asyncio.run(run(args, server_args))
    except (ServerError, TokenizerError, httpx.ConnectError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report.print_report(results, comparison_labels(args))
    path = report.write_json(args.json or report.default_json_path("serving"), {
        "tool": "bench.serving", "argv": list(sys.argv if argv is None else argv), "started": started,
        "targets": info, "results": [report.result_json(r) for r in results]})
    print(f"\nresults: {path}")
    if results:
        write_chart(lambda png: report.plot(results, png), args.plot or path.with_suffix(".png"))
    return 0 if all(r.summary.completed for r in results) else 1
