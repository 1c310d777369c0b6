"""`python -m bench.serving.hotpath`: the decision hot path's health in one command.

Runs, on the demo model (or --model), never loading two servers at once:

1. **OneShot against its ablation**: the same requests to a default server and to a
   `--disable-oneshot` one (every request takes the decode lifecycle), both up at once and
   loaded in turn, cell by cell, in short rounds of alternating order (oneshot then ablation,
   then the other way round); each half of the rounds, pooled, is one run of the ratio.
   Uniform cells (one-token 128/1 and 512/1 at c=1, 16, 64), and cells where the class
   contract saves work: a KV pool smaller than the concurrent prompts need, embeddings,
   /v1/score, prompt_logprobs, and judge traffic sharing one long rubric.
2. **Preemption when nothing preempts**: the uniform cells against `--no-layer-preemption`.
3. **Server CPU per request** (bench.serving.cpu_cost: null executor).

It ends with one line per target: met or not, with the figure. Flags after a lone `--` go to
every server it launches."""
from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from bench.charts import write_chart
from bench.serving.core import proc, report
from bench.serving import cpu_cost
from bench.serving.core.client import make_client
from bench.serving.core.loadgen import label_ids, launch_plan, prompt_source, split_server_args, started
from bench.serving.core.prompts import PromptFactory, TokenizerError
from bench.serving.core.runner import Level, Limits, RunResult, run_level
from bench.serving.core.server import ServerError, ServerProcess
from bench.serving.core.workloads import Embed, Fixed, Options, PromptLogprobs, Score, SharedPrefix, Workload

Make = Callable[[PromptFactory, Options, tuple[int, int]], Workload]


@dataclass(frozen=True, slots=True)
class Cell:
    """A workload at one concurrency; `flags` go to both servers it is measured on."""

    name: str
    make: Make
    concurrency: int
    requests: int
    flags: tuple[str, ...] = ()


def _fixed(tokens: int) -> Make:
    return lambda f, o, _: Fixed(f, o, tokens, 1)


# Requests per cell and round (here and below): a second or more of load per server on the dev
# machine. 80 requests of 128 tokens at c=64 lasted 0.12 s, a wave and a quarter, and that
# cell's ratio moved by 10% from one run to the next.
UNIFORM_REQUESTS = {(128, 1): 150, (128, 16): 320, (128, 64): 640, (512, 1): 50, (512, 16): 80, (512, 64): 128}
UNIFORM = [Cell(f"{n}/1 c={c}", _fixed(n), c, UNIFORM_REQUESTS[n, c]) for n in (128, 512) for c in (1, 16, 64)]
# A KV pool of 16 x 512 tokens (block size 16) at c=64: the decode lifecycle holds each prompt's
# KV until its token is out, OneShot only its step's.
CONTRACT = [
    Cell("512/1 c=64, KV pool of 16 x 512 tokens", _fixed(512), 64, 80, ("--num-kv-blocks", "512")),
    Cell("embeddings 512 c=16", lambda f, o, _: Embed(f, o, 512), 16, 64),
    Cell("score 256 + 8 x 32 c=16", lambda f, o, labels: Score(f, o, 256, 32, 8, labels, seed=0), 16, 96),
    Cell("prompt_logprobs 512 c=16", lambda f, o, _: PromptLogprobs(f, o, 512), 16, 48),
    Cell("judge 2048 + 32 c=16", lambda f, o, _: SharedPrefix(f, o, "judge", 1, 2048, 32, 1, seed=0), 16, 240),
]
# Targets (issue 45).
MIN_RATIO, MIN_LOWER_RUN, MIN_CONTRACT_RATIO = 1.0, 0.97, 1.25
MIN_PREEMPTION_RATIO = 0.97
CPU_TARGETS_US = {("OneShot", 64): 300, ("OneShot", 1): 400, ("Decode", 64): 1200}


async def measure(servers: Sequence[ServerProcess], cells: Sequence[Cell], rounds: int,
                  progress: bool) -> list[RunResult]:
    """Each cell on each server in turn, `rounds` times, the order reversed every other round:
    both servers stay up, and only one is loaded at a time, so a drift of the machine's speed
    (seen here: 20% within minutes) falls on both alike."""
    async with make_client(servers[0].base_url, 4, 120.0) as client:
        model, tokenizer, factory = await prompt_source(client, None)
        labels = await label_ids(tokenizer)
    options = Options(model)
    results = []
    for cell in cells:
        for k in range(rounds):
            for server in servers if k % 2 == 0 else list(reversed(servers)):
                # Both servers get the same requests in a round, and no cell repeats another's:
                # seeded by the round alone, each cell sent the prompts of the cell before it, and
                # 128/1 c=64 measured prefix-cache hits (620 req/s; 190 computed).
                rng = random.Random(f"{cell.name}#{k}")
                result = await run_level(server.base_url, cell.make(factory, options, labels),
                                         Level("concurrency", cell.concurrency), Limits(cell.requests, warmup=8),
                                         rng, f"{server.label}#{k + 1}", server.pid, show_progress=progress)
                result.workload = cell.name
                results.append(result)
    return results


def compare(cells: Sequence[Cell], base: list[str], labels: tuple[str, str], flags: list[str],
            args: argparse.Namespace) -> list[RunResult]:
    """`labels[0]` (base flags) against `labels[1]` (base + `flags`), one pair of servers per set
    of the cells' own flags."""
    results: list[RunResult] = []
    for group in dict.fromkeys(cell.flags for cell in cells):
        members = [cell for cell in cells if cell.flags == group]
        servers = launch_plan([(labels[0], [*base, *group]), (labels[1], [*base, *group, *flags])],
                              args.server_cmd, args.log_dir, "hotpath-")
        with started(servers[0]), started(servers[1]):
            results += asyncio.run(measure(servers, members, args.rounds, not args.no_progress))
    return results


def ratios(results: Sequence[RunResult], labels: tuple[str, str], rounds: int) -> dict[str, list[float]]:
    """Per cell, the req/s ratio labels[0] / labels[1] of each half of the rounds (two runs, each
    pooled over its rounds: completed requests over the time they took)."""
    pooled: dict[tuple[str, str, int], list[float]] = {}
    for r in results:
        label, k = r.server.split("#")
        half = 0 if int(k) <= (rounds + 1) // 2 else 1
        done, seconds = pooled.setdefault((label, r.workload, half), [0.0, 0.0])
        pooled[(label, r.workload, half)] = [done + r.summary.completed, seconds + r.summary.duration_s]
    out: dict[str, list[float]] = {}
    for cell in dict.fromkeys(r.workload for r in results):
        for half in (0, 1):
            num, den = pooled.get((labels[0], cell, half)), pooled.get((labels[1], cell, half))
            if num and den and num[1] and den[1] and den[0]:
                out.setdefault(cell, []).append((num[0] / num[1]) / (den[0] / den[1]))
    return out


def ratio_rows(found: dict[str, list[float]], results: Sequence[RunResult], labels: tuple[str, str]) -> list[list]:
    rate: dict[tuple[str, str], list[float]] = {}
    for r in results:
        rate.setdefault((r.server.split("#")[0], r.workload), []).append(r.summary.request_rate)
    return [[cell, *(statistics.median(rate.get((label, cell), [0])) for label in labels), *values,
             statistics.mean(values), min(values)] for cell, values in found.items()]


def target_lines(ablation: dict[str, list[float]], preemption: dict[str, list[float]],
                 cpu: Sequence[RunResult]) -> list[tuple[bool, str]]:
    lines = []
    uniform = {c.name for c in UNIFORM}
    for cell, values in ablation.items():
        if cell in uniform:
            ok = min(values) >= MIN_LOWER_RUN and statistics.mean(values) >= MIN_RATIO
            goal = f"mean >= {MIN_RATIO}, each >= {MIN_LOWER_RUN}"
        else:
            ok = min(values) >= MIN_CONTRACT_RATIO
            goal = f">= {MIN_CONTRACT_RATIO}"
        lines.append((ok, f"OneShot / ablation req/s, {cell}: {', '.join(f'{v:.2f}' for v in values)} ({goal})"))
    for cell, values in preemption.items():
        lines.append((min(values) >= MIN_PREEMPTION_RATIO,
                      f"default / --no-layer-preemption req/s, {cell}: "
                      f"{', '.join(f'{v:.2f}' for v in values)} (>= {MIN_PREEMPTION_RATIO})"))
    for r in cpu:
        key = (r.workload.split(" ")[0], int(r.level.value))
        limit = CPU_TARGETS_US.get(key)
        value = r.server_cpu_us_per_request
        if limit is not None and value is not None:
            lines.append((value <= limit, f"server CPU per request, {r.workload} {r.level.label}: "
                                          f"{value:,.0f} us (<= {limit:,})"))
    return lines


def plot(ablation: dict[str, list[float]], preemption: dict[str, list[float]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for ax, (title, found, line) in zip(axes, (("OneShot / --disable-oneshot (req/s)", ablation, MIN_RATIO),
                                               ("default / --no-layer-preemption (req/s)", preemption, 1.0))):
        cells = list(found)
        for k in range(max((len(v) for v in found.values()), default=0)):
            ax.barh([i + 0.4 * k for i in range(len(cells))], [v[k] if k < len(v) else 0 for v in found.values()],
                    height=0.4, label=f"round {k + 1}")
        ax.set_yticks([i + 0.2 for i in range(len(cells))], cells, fontsize=7)
        ax.axvline(line, color="black", linewidth=0.8)
        ax.set_title(title)
        if cells:  # a section not run has no bars to name
            ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.serving.hotpath", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Flags after a lone -- go to every server.")
    p.add_argument("--model", help="model directory for the servers (default: the demo model)")
    p.add_argument("--server-cmd", help="command launching the server (default: this python -m prelude)")
    p.add_argument("--sections", default="ablation,preemption,cpu", help="comma list of: ablation, preemption, cpu")
    p.add_argument("--rounds", type=int, default=8,
                   help="rounds of each comparison, the order alternating; their halves are its two runs")
    p.add_argument("--log-dir", type=Path, default=report.RESULTS_DIR / "logs")
    p.add_argument("--json", type=Path, help="results file (default bench-results/hotpath-<time>.json)")
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    own, server_args = split_server_args(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(own)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2: the two halves of the rounds are the ratio's two runs")
    sections = {s.strip() for s in args.sections.split(",")}
    base = [*(["--model", args.model] if args.model else []), *server_args]
    labels_ablation, labels_preemption = ("oneshot", "ablation"), ("default", "no-preemption")
    results: dict[str, list[RunResult]] = {}
    try:
        if "ablation" in sections:
            results["ablation"] = compare(UNIFORM + CONTRACT, base, labels_ablation, ["--disable-oneshot"], args)
        if "preemption" in sections:
            results["preemption"] = compare(UNIFORM, base, labels_preemption, ["--no-layer-preemption"], args)
        if "cpu" in sections:
            if not proc.available():
                raise SystemExit("the cpu section reads /proc/<pid>/stat; this system has no /proc")
            cpu_args = cpu_cost.build_parser().parse_args(["--num-requests", "1000", "--no-progress"])
            server = launch_plan([("cpu", ["--executor", "null", *base])], args.server_cmd, args.log_dir,
                                 "hotpath-")[0]
            with started(server):
                results["cpu"] = asyncio.run(cpu_cost.measure(server, cpu_args))
    except (ServerError, TokenizerError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ablation = ratios(results.get("ablation", []), labels_ablation, args.rounds)
    preemption = ratios(results.get("preemption", []), labels_preemption, args.rounds)
    rounds = ["run 1", "run 2"]
    if ablation:
        print("\nOneShot against its ablation (--disable-oneshot): req/s (median of the rounds) and ratios")
        print(report.table(["cell", "oneshot", "ablation", *rounds, "mean", "lower"],
                           ratio_rows(ablation, results["ablation"], labels_ablation)))
    if preemption:
        print("\nLayer preemption when nothing preempts: default against --no-layer-preemption, req/s and ratios")
        print(report.table(["cell", "default", "no-preemption", *rounds, "mean", "lower"],
                           ratio_rows(preemption, results["preemption"], labels_preemption)))
    if results.get("cpu"):
        print("\nServer CPU per request (null executor)")
        print(cpu_cost.cost_table(results["cpu"]))
    lines = target_lines(ablation, preemption, results.get("cpu", []))
    print("\nTargets")
    for ok, text in lines:
        print(f"{'met    ' if ok else 'NOT MET'}  {text}")
    path = report.write_json(args.json or report.default_json_path("hotpath"), {
        "tool": "bench.serving.hotpath", "argv": list(sys.argv if argv is None else argv),
        "ablation": ablation, "preemption": preemption,
        "targets": [{"met": ok, "line": text} for ok, text in lines],
        "results": {k: [report.result_json(r) for r in v] for k, v in results.items()}})
    print(f"\nresults: {path}")
    if ablation or preemption:
        write_chart(lambda png: plot(ablation, preemption, png), path.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
