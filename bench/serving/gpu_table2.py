"""One device call's serving benchmark: random-weight Qwen3-0.6B and Qwen3-4B checkpoints with
the real configs, the Prelude server started on each (startup = time until /health answers
200), and the paper's workloads driven through /v1/completions with exact token-id prompts:

  0.6B  128 in / 1 out   c=1       100 requests
  0.6B  128 in / 32 out  c=4       400 requests
  4B    512 in / 1 out   c=1..96   sweep
  0.6B  512 in / 1 out   c=64, 128, 256  prefill-only throughput (issue #14 item 4)

With --ablation, the one-token shapes of the ablation table (0.6B 128/1 at c=1, 16, 64; 4B 512/1
at c=1, 32, 96) run on a OneShot server and a `--disable-oneshot` server of each model (every
request takes the decode lifecycle), both up at once and loaded in turn, in ROUNDS rounds of
alternating order, and a table of OneShot / ablation req/s and TTFT follows. With --against
CHECKOUT, the table's shapes run so on this checkout's server and on one of another checkout (an
A/B of two builds in one device call).

Every row also gives input tokens/s and MFU: input tokens/s x the model's FLOPs per prompt token
(its linear layers, and causal attention over the prompt; the LM head runs for one position
per prompt) over --peak-tflops (790: the bf16 matrix rate measured on the H100/H200 here).

Prints one table and writes $OUT/gpu_table2.json (OUT defaults to ./bench-results) plus each
server's log. Requests go through bench.serving's closed-loop runner, as `python -m
bench.serving` sends them: one keep-alive connection per worker, opened before timing, bodies
serialized before the run, every request streamed so TTFT is measured at the first token, and
percentiles from bench.serving.core.stats. Each workload starts with unmeasured warm-up requests on
the same connections so lazily captured CUDA graphs are in place before timing.

Run as a script (gpu_check.sh) or as `python -m bench.serving.gpu_table2`; on a CPU machine
`--models tiny` checks the whole path end to end in well under a minute.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as a script: bench.serving must import from this checkout
    sys.path.insert(0, str(REPO))
# The imports below must follow that set-up:
# ruff: noqa: E402

from bench.serving.checkpoint import write_checkpoint
from bench.serving.core.prompts import Prompt
from bench.serving.core.runner import Level, Limits, RunResult, run_level
from bench.serving.core.server import ServerProcess, prelude_env
from bench.serving.core.workloads import Options, Workload

SERVED_NAME = "bench"
WORKDIR = Path(tempfile.gettempdir()) / "prelude-bench"  # the checkpoints, as qwen3-<size>
SWEEP = (1, 2, 4, 8, 16, 32, 64, 96)
# Runs of ~1 s (100-400 requests) moved 15-30% from one device call to the next, more than the
# classes differ: 300 requests at least, 8 per worker. And the same build moved 40-55% between
# runs a minute apart on one machine (h200-2026-12-04): the two servers are measured in ROUNDS
# rounds of alternating order, each pooled over its rounds, each half of them a run of the ratio.
ROUNDS = 4
# The pair's KV caches, the same size whichever server starts first: --gpu-memory-utilization
# counts the other server's memory as used. Ample for the shapes (the 4B at c=96 x 512 tokens
# holds ~7 GB under the decode lifecycle); the CPU check (tiny) keeps its default.
ABLATION_KV = {"0.6B": ("--kv-cache-memory", "32GiB"), "4B": ("--kv-cache-memory", "32GiB")}
ABLATION = {"0.6B": [(128, 1, c, max(300, 8 * c)) for c in (1, 16, 64)],
            "4B": [(512, 1, c, max(300, 8 * c)) for c in (1, 32, 96)],
            "tiny": [(128, 1, c, 6) for c in (1, 2)]}


class RandomIds(Workload):
    """Distinct prompts of exactly `input_len` random ordinary token ids (past the bytes, below
    Qwen3's special tokens), sent as id lists, so no tokenizer is involved. Every request
    streams, one-token ones included, so TTFT is the first token's arrival."""

    def __init__(self, vocab: int, input_len: int, output_len: int):
        # No PromptFactory (the base class's only other state): ids are drawn directly.
        self.options = Options(SERVED_NAME)
        self.input_len, self.output_len = input_len, output_len
        self.low, self.high = min(1000, vocab // 4), min(150000, vocab)

    @property
    def label(self) -> str:
        return f"random ids {self.input_len}/{self.output_len}"

    @property
    def streamed(self) -> bool:
        return True

    def make_prompt(self, rng: random.Random) -> Prompt:
        return Prompt([rng.randrange(self.low, self.high) for _ in range(self.input_len)], "")


def flops_per_prompt_token(config: dict, prompt_len: int) -> float:
    """Forward FLOPs per token of a prompt of prompt_len tokens: 2 per weight of the linear
    layers (q, k, v, o, gate, up, down), and the causal attention's two products (QK^T and PV)
    over, on average, half the prompt. The embedding lookup is free and the LM head runs once per
    prompt, so both are left out."""
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q_width = config["num_attention_heads"] * head_dim
    kv_width = config["num_key_value_heads"] * head_dim
    linear = hidden * (q_width + 2 * kv_width) + q_width * hidden + 3 * hidden * config["intermediate_size"]
    attention = 2 * q_width * prompt_len  # 2 products x 2 FLOPs x q_width x prompt_len / 2 keys
    return layers * (2 * linear + attention)


def run_json(result: RunResult) -> dict:
    """One row of gpu_table2.json: times in ms, percentiles from bench.serving.core.stats."""
    s = result.summary
    row = {"requests": s.completed + s.errors, "errors": s.errors,
           "first_error": s.error_samples[0] if s.error_samples else None,
           "concurrency": int(result.level.value), "duration_s": s.duration_s, "req_per_s": s.request_rate,
           "out_tok_per_s": s.output_tok_per_s}
    if s.completed:
        row.update(ttft_p50_ms=1000 * s.ttft.p50, ttft_p95_ms=1000 * s.ttft.p95, ttft_p99_ms=1000 * s.ttft.p99,
                   e2e_p50_ms=1000 * s.e2e.p50, e2e_p99_ms=1000 * s.e2e.p99)
        if s.tpot.mean is not None:  # at least two output tokens
            row["tpot_ms"] = 1000 * s.tpot.mean
    return row


def checkpoint(size: str, args) -> tuple[Path, int]:
    """The model's random-weight checkpoint (written once per work folder) and its vocabulary size."""
    from tokenizers import Tokenizer

    model = write_checkpoint(args.workdir / f"qwen3-{size}", size, args.tokenizer).resolve()
    return model, Tokenizer.from_file(str(model / "tokenizer.json")).get_vocab_size()


def server_args(model: Path, workloads: list[tuple[int, int, int, int]], args,
                extra: tuple[str, ...] = ()) -> list[str]:
    """The flags every server of the table takes (room for the workloads' concurrency), then
    `extra`, then --server-args (which may override them)."""
    return ["--model", str(model), "--served-model-name", SERVED_NAME, *extra,
            "--max-num-seqs", str(max(128, max(c for _, _, c, _ in workloads))), *args.server_args]


def run_model(size: str, workloads: list[tuple[int, int, int, int]], args, out: Path) -> dict:
    model, vocab = checkpoint(size, args)
    server = ServerProcess(server_args(model, workloads, args), env=prelude_env(),
                           log_path=out / f"server-{size}.log", label=size)
    try:
        config = json.loads((model / "config.json").read_text())
        record = {"model": size, "startup_s": server.start(args.startup_timeout), "runs": []}
        print(f"[{size}] healthy after {record['startup_s']:.1f}s", flush=True)
        timeline = startup_timeline(server.log_path)
        if timeline:  # the server's own account of where its startup went
            record["startup_timeline"] = timeline
            print(f"[{size}] startup: {timeline}", flush=True)
        for i, (prompt_len, max_tokens, concurrency, requests) in enumerate(workloads):
            summary = run_json(drive(server, size, vocab, i, prompt_len, max_tokens, concurrency, requests))
            in_tok_per_s = summary["req_per_s"] * prompt_len
            mfu = in_tok_per_s * flops_per_prompt_token(config, prompt_len) / (args.peak_tflops * 1e12)
            summary.update(prompt_len=prompt_len, max_tokens=max_tokens, in_tok_per_s=in_tok_per_s, mfu=mfu)
            record["runs"].append(summary)
            print(f"[{size}] {prompt_len}in/{max_tokens}out c={concurrency}: {summary['req_per_s']:.1f} req/s",
                  flush=True)
        if args.py_spy:
            profile_server(server, size, vocab, workloads, out)
        return record
    finally:
        server.stop()


def run_pair(size: str, args, out: Path, kind: str, shapes: list[tuple[int, int, int, int]],
             sides: dict[str, tuple[tuple[str, ...], Path | None]]) -> dict:
    """`shapes` on two servers of the model, both up at once (each with ABLATION_KV's cache) and
    loaded in turn, ROUNDS rounds per shape, the order reversed every other round, so a drift of
    the machine's speed falls on both alike. `sides`: each server's label, its extra flags, and
    the checkout it runs from (None: this one). Each round sends a ROUNDS-th of the shape's
    requests; only the first warms up with 2 x c."""
    model, vocab = checkpoint(size, args)
    common = server_args(model, shapes, args, ABLATION_KV.get(size, ()))
    servers = {label: _server(size, label, [*common, *flags], checkout, out)
               for label, (flags, checkout) in sides.items()}
    labels = list(servers)
    try:
        record: dict = {"model": size, "kind": kind, "labels": labels, "pairs": [],
                        "startup_s": {label: server.start(args.startup_timeout) for label, server in servers.items()}}
        for i, (prompt_len, max_tokens, concurrency, requests) in enumerate(shapes):
            rounds: dict[str, list[dict]] = {label: [] for label in labels}
            for k in range(ROUNDS):
                for label in labels if k % 2 == 0 else reversed(labels):
                    result = drive(servers[label], size, vocab, 100 * i + k, prompt_len, max_tokens, concurrency,
                                   max(concurrency, requests // ROUNDS), warmup=2 * concurrency if k == 0 else 0)
                    rounds[label].append(run_json(result))
            record["pairs"].append({"prompt_len": prompt_len, "max_tokens": max_tokens, "concurrency": concurrency,
                                    "rounds": rounds})
            print(f"[{size}] {prompt_len}in/{max_tokens}out c={concurrency}: " + ", ".join(
                f"{label} {pooled_rate(rounds[label]):.1f} req/s" for label in labels), flush=True)
        return record
    finally:
        for server in servers.values():
            server.stop()


def _server(size: str, label: str, args: list[str], checkout: Path | None, out: Path) -> ServerProcess:
    """A server of this checkout, or of another one: first on its path, and the working directory
    kept off it (-P), which `python -m` would put first."""
    env = prelude_env()
    command = None
    if checkout is not None:
        _share_native_extensions(checkout)
        env["PYTHONPATH"] = os.pathsep.join([str(checkout.resolve()), env["PYTHONPATH"]])
        command = [sys.executable, "-P", "-m", "prelude"]
    return ServerProcess(args, command, env, out / f"server-{size}-pair-{label}.log", label=f"{size} {label}")


def _share_native_extensions(checkout: Path) -> None:
    """Another checkout without built native extensions gets this one's, where both were built
    from the same sources (an A/B of Python changes); else it must bring its own."""
    import shutil
    import subprocess

    def sources(root: Path) -> str:
        script = REPO / "bench" / "serving" / "native_sources.sh"
        return subprocess.run(["bash", str(script), str(root)], capture_output=True, text=True, check=True).stdout

    if sources(REPO) != sources(checkout):
        return
    for package in ("prelude/_fasttoken", "kernels/cpu"):
        if not any((checkout / package).glob("*.so")):
            for library in (REPO / package).glob("*.so"):
                shutil.copy2(library, checkout / package)


def pooled_rate(rounds: list[dict]) -> float:
    """Requests answered over the seconds they took, all rounds together."""
    seconds = sum(r["duration_s"] for r in rounds)
    return sum(r["requests"] - r["errors"] for r in rounds) / seconds if seconds else 0.0


def startup_timeline(log_path: Path, wait_s: float = 30.0) -> str | None:
    """The banner's startup line (phase by phase, from the process's start), if logged within
    `wait_s`: /health answers during the warm-up, and the banner comes once the engine is ready."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        lines = [line.split("startup", 1)[1].strip() for line in log_path.read_text().splitlines()
                 if line.lstrip().startswith("startup ")]
        if lines or time.monotonic() > deadline:
            return lines[-1] if lines else None
        time.sleep(0.05)


def drive(server: ServerProcess, size: str, vocab: int, seed: int, prompt_len: int, max_tokens: int,
          concurrency: int, requests: int, warmup: int | None = None) -> RunResult:
    """One closed-loop workload, after unmeasured warm-up (2 x concurrency requests on the
    measured connections unless `warmup` says otherwise)."""
    limits = Limits(requests, warmup=2 * concurrency if warmup is None else warmup)
    return asyncio.run(run_level(server.base_url, RandomIds(vocab, prompt_len, max_tokens),
                                 Level("concurrency", concurrency), limits, random.Random(seed),
                                 server=size, show_progress=False))


def profile_server(server: ServerProcess, size: str, vocab: int, workloads, out: Path) -> None:
    """Each workload once more (unmeasured) under py-spy, sampling without pausing the server
    whichever thread holds the GIL: OUT/pyspy-<size>-<in>-<out>-c<c>.txt, one collapsed stack
    per line with its sample count. What the event loop and the step thread spend the GIL on,
    between and around the GPU's work."""
    import shutil
    import signal
    import subprocess

    binary = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(binary).exists():
        print(f"[{size}] no py-spy: server profile skipped", flush=True)
        return
    for i, (prompt_len, max_tokens, concurrency, requests) in enumerate(workloads):
        path = out / f"pyspy-{size}-{prompt_len}-{max_tokens}-c{concurrency}.txt"
        spy = subprocess.Popen([binary, "record", "--pid", str(server.pid), "--rate", "500", "--nonblocking",
                                "--threads", "--gil", "--format", "raw", "--output", str(path)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            drive(server, size, vocab, 1000 + i, prompt_len, max_tokens, concurrency, requests)
        finally:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file then
            spy.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", type=Path, default=REPO / "shared" / "tokenizers" / "qwen3",
                        help="folder with the Qwen3 tokenizer.json (else the demo tokenizer)")
    parser.add_argument("--workdir", type=Path, default=WORKDIR)
    parser.add_argument("--models", default="0.6B,4B")
    parser.add_argument("--sweep", default=",".join(map(str, SWEEP)), help="4B concurrency levels")
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--server-args", default="", help="extra server flags, e.g. '--enforce-eager'")
    parser.add_argument("--peak-tflops", type=float, default=790.0, help="the MFU column's peak (bf16 TFLOP/s)")
    parser.add_argument("--py-spy", action="store_true", help="then each workload again under py-spy (server CPU)")
    parser.add_argument("--ablation", action="store_true",
                        help="the one-token shapes again against a --disable-oneshot server of each model")
    parser.add_argument("--against", type=Path, metavar="CHECKOUT",
                        help="the table's shapes again on this checkout's server and one of CHECKOUT (another "
                             "build, its native extensions built), both up, loaded in turn")
    args = parser.parse_args(argv)
    args.server_args = args.server_args.split()
    out = Path(os.environ.get("OUT", "bench-results"))
    out.mkdir(parents=True, exist_ok=True)
    plan = {
        "0.6B": [(128, 1, 1, 100), (128, 32, 4, 400)] + [(512, 1, c, 4 * c) for c in (64, 128, 256)],
        "4B": [(512, 1, c, max(100, 4 * c)) for c in map(int, args.sweep.split(","))],
        "tiny": [(128, 1, 1, 6), (128, 8, 2, 6)],
    }
    records = []
    for size in args.models.split(","):
        steps = [("", lambda: run_model(size, plan[size], args, out))]
        if args.ablation:
            steps.append((" ablation", lambda: run_pair(size, args, out, "ablation", ABLATION[size], {
                "oneshot": ((), None), "ablation": (("--disable-oneshot",), None)})))
        if args.against:
            steps.append((" against", lambda: run_pair(size, args, out, "against", plan[size], {
                "this": ((), None), "against": ((), args.against)})))
        for what, step in steps:
            try:
                records.append(step())
            except Exception as exc:  # one model failing must not lose the other's numbers
                print(f"[{size}{what}] FAILED: {exc!r}", flush=True)
                records.append({"model": size, "error": repr(exc)})
            (out / "gpu_table2.json").write_text(json.dumps(records, indent=1))
    print(f"\n{'model':<5} {'startup s':>9} {'in/out':>7} {'c':>3} {'n':>4} {'req/s':>7} {'tok/s':>7} "
          f"{'TTFT p50':>9} {'TTFT p95':>9} {'TTFT p99':>9} {'TPOT ms':>8} {'in tok/s':>9} {'MFU':>6} {'err':>4}")
    for rec in records:
        for run in rec.get("runs", []):
            print(f"{rec['model']:<5} {rec['startup_s']:>9.1f} {run['prompt_len']:>3}/{run['max_tokens']:<3} "
                  f"{run['concurrency']:>3} {run['requests']:>4} {run['req_per_s']:>7.1f} "
                  f"{run['out_tok_per_s']:>7.0f} {run.get('ttft_p50_ms', float('nan')):>9.1f} "
                  f"{run.get('ttft_p95_ms', float('nan')):>9.1f} "
                  f"{run.get('ttft_p99_ms', float('nan')):>9.1f} {run.get('tpot_ms', float('nan')):>8.2f} "
                  f"{run['in_tok_per_s']:>9.0f} {100 * run['mfu']:>5.1f}% {run['errors']:>4}")
        if "error" in rec:
            print(f"{rec['model']:<5} error: {rec['error']}")
    print_pairs(records)
    return 0 if all("error" not in r for r in records) else 1


def print_pairs(records: list[dict]) -> None:
    """Each pair of servers (the ablation, another checkout), shape by shape: req/s pooled over
    all rounds, the ratio of each half of the rounds (two runs), and the rounds' median TTFT P50."""
    titles = {"ablation": "OneShot against --disable-oneshot", "against": "This checkout against --against's"}
    for kind, title in titles.items():
        pairs = [rec for rec in records if rec.get("kind") == kind]
        if not pairs:
            continue
        first, second = pairs[0]["labels"]
        print(f"\n{title} ({ROUNDS} rounds, alternating)\n{'model':<5} {'in/out':>7} {'c':>3} {first:>8} {second:>8} "
              f"{'ratio':>6} {'run 1':>6} {'run 2':>6} {'TTFT p50':>9} {second:>9}")
        for rec in pairs:
            for pair in rec["pairs"]:
                on, off = pair["rounds"][first], pair["rounds"][second]
                rate_on, rate_off = pooled_rate(on), pooled_rate(off)
                if not rate_off:
                    continue
                half = (len(on) + 1) // 2
                runs = [ratio(on[part], off[part]) for part in (slice(0, half), slice(half, None))]
                ttft = [statistics.median(r.get("ttft_p50_ms", float("nan")) for r in rounds) for rounds in (on, off)]
                print(f"{rec['model']:<5} {pair['prompt_len']:>3}/{pair['max_tokens']:<3} {pair['concurrency']:>3} "
                      f"{rate_on:>8.1f} {rate_off:>8.1f} {rate_on / rate_off:>6.2f} "
                      f"{runs[0]:>6.2f} {runs[1]:>6.2f} {ttft[0]:>9.1f} {ttft[1]:>9.1f}")


def ratio(on: list[dict], off: list[dict]) -> float:
    """Pooled req/s of `on` over that of `off` (nan where `off` answered nothing)."""
    rate_off = pooled_rate(off)
    return pooled_rate(on) / rate_off if rate_off else float("nan")


if __name__ == "__main__":
    sys.exit(main())
