"""`python -m bench.kernels.head_grouping`: what grouping a OneShot step's rows by output head
buys (issue #19's "mixed embed + score traffic at c=64").

Two parts, in one run:

- `heads`, in process: one step's heads over 64 rows of 128 tokens (half embeddings, half
  label-token scores on the demo model; half embeddings, half classifications on the demo
  classifier), run as the executor runs them (each head once per step, on all its rows) and
  row by row (each head once per row: what grouping replaced). The hidden states are random:
  a head's cost does not depend on their values. Under both modes the results are compared.
- `http`, over loopback: closed-loop mixed traffic at `--concurrency` (64), embed and score
  requests alternating (and classify on the classifier), requests/s and latency per kind.
  Prelude has no switch that ungroups its heads; to compare builds, point `--server-cmd` (or
  `--base-url`) at another checkout, e.g. one with the grouping commit reverted."""
from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Sequence

import httpx
import torch

from bench.serving.core import report
from bench.serving.core.server import ServerProcess, parse_command, prelude_env
from bench.serving.core.stats import percentile
from prelude.contract.batch import OutputSpec, PrefillRow
from prelude.executor.heads import row_results
from prelude.model.attention import StepLayout
from prelude.model.config import ModelConfig
from prelude.model.loader import load_model

ROW_TOKENS, ROWS = 128, 64
LABELS = (5, 9)


def _layout(rows: int) -> StepLayout:
    """`rows` rows of ROW_TOKENS tokens each, nothing cached or stored (heads read query_starts)."""
    return StepLayout(query_starts=[i * ROW_TOKENS for i in range(rows + 1)], context_lens=[0] * rows,
                      block_tables=[()] * rows, store_kv=[False] * rows, num_prefill_rows=rows,
                      slot_mapping=torch.full((rows * ROW_TOKENS,), -1))


def _last_hidden(hidden: torch.Tensor, layout: StepLayout, rows: list[int]) -> torch.Tensor:
    """The executor's gather of each row's last position (ModelRunner.last_hidden)."""
    return hidden[torch.tensor([layout.query_starts[i + 1] - 1 for i in rows])]


def _specs(classifier: bool) -> list[OutputSpec]:
    other = OutputSpec(classify=True) if classifier else \
        OutputSpec(label_token_ids=LABELS, label_vocab_normalized=False)
    return [OutputSpec(pooling="last") if i % 2 == 0 else other for i in range(ROWS)]


def heads_ms(model_dir: Path, repeats: int) -> tuple[float, float]:
    """Median ms of one step's heads: grouped (one call for the step), then row by row."""
    config = ModelConfig.from_dir(model_dir)
    model = load_model(model_dir, config, torch.float32, torch.device("cpu"), ROW_TOKENS)
    specs = _specs(config.head == "ForSequenceClassification")
    rows = [PrefillRow(i, [7] * ROW_TOKENS, 0, (), spec) for i, spec in enumerate(specs)]
    hidden = torch.randn(ROWS * ROW_TOKENS, config.hidden_size, generator=torch.Generator().manual_seed(0))
    step, one = _layout(ROWS), _layout(1)

    def grouped():
        return row_results(model, hidden, rows, (), step, _last_hidden)

    def per_row():
        return [row_results(model, hidden[i * ROW_TOKENS:(i + 1) * ROW_TOKENS], [row], (), one, _last_hidden)[0]
                for i, row in enumerate(rows)]

    with torch.inference_mode():
        a, b = grouped(), per_row()
        for x, y in zip(a, b):  # the same numbers either way (up to float summation order)
            assert (x.pooled is None) == (y.pooled is None) and (x.scores is None) == (y.scores is None)
            for u, v in ((x.pooled, y.pooled), (x.scores, y.scores), (x.label_logprobs, y.label_logprobs)):
                assert u is None or max(abs(p - q) for p, q in zip(u, v)) < 1e-4
        times = {}
        for name, fn in (("grouped", grouped), ("per_row", per_row)):
            samples = []
            for _ in range(repeats):
                began = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - began)
            times[name] = 1000 * statistics.median(samples)
    return times["grouped"], times["per_row"]


def _ids(rng: random.Random) -> list[int]:
    return [rng.randrange(3, 500) for _ in range(ROW_TOKENS)]


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(("alpha", "river", "stone", "quiet", "north", "paper", "light", "seven"))
                    for _ in range(n))


async def mixed_http(url: str, concurrency: int, seconds: float, classifier: bool, seed: int) -> dict:
    """Closed loop: each of `concurrency` workers sends embed, score (and classify) in turn
    until `seconds` pass; per kind, requests/s and latency P50/P99 in ms."""
    kinds = ["embed", "score", *(["classify"] if classifier else [])]
    latencies: dict[str, list[float]] = {kind: [] for kind in kinds}
    errors = 0

    def request(kind: str, rng: random.Random) -> tuple[str, dict]:
        if kind == "embed":
            return "/v1/embeddings", {"input": [_ids(rng)]}
        if kind == "classify":
            return "/classify", {"input": [_ids(rng)]}
        if classifier:  # a cross-encoder scores text pairs with its classification head
            return "/v1/score", {"text_1": _words(rng, 100), "text_2": [_words(rng, 8)]}
        ids = _ids(rng)
        return "/v1/score", {"query": ids[:-8], "items": [ids[-8:]], "label_token_ids": list(LABELS)}

    async def worker(client: httpx.AsyncClient, w: int, until: float) -> None:
        nonlocal errors
        rng = random.Random(seed * 1000 + w)
        turn = w
        while time.perf_counter() < until:
            kind = kinds[turn % len(kinds)]
            turn += 1
            path, body = request(kind, rng)
            began = time.perf_counter()
            response = await client.post(path, json=body)
            if response.status_code == 200:
                latencies[kind].append(time.perf_counter() - began)
            else:
                errors += 1

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        began = time.perf_counter()
        await asyncio.gather(*(worker(client, w, began + seconds) for w in range(concurrency)))
        wall = time.perf_counter() - began
    out: dict = {"errors": errors, "requests_per_s": sum(map(len, latencies.values())) / wall}
    for kind, values in latencies.items():
        out[kind] = {"per_s": len(values) / wall, "p50_ms": 1000 * (percentile(values, 50) or 0),
                     "p99_ms": 1000 * (percentile(values, 99) or 0)}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from prelude.demo import ensure_demo_classifier, ensure_demo_model

    p = argparse.ArgumentParser(prog="python -m bench.kernels.head_grouping", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="heads,http", help="heads, http, or both")
    p.add_argument("--models", default="demo,classifier", help="demo, classifier, or both")
    p.add_argument("--repeats", type=int, default=30, help="heads: steps timed per mode")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--seconds", type=float, default=20.0, help="http: length of each run")
    p.add_argument("--server-cmd", help="http: command launching the server (default: this checkout)")
    p.add_argument("--base-url", help="http: benchmark this running server instead (one model)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=report.RESULTS_DIR / "head_grouping.json")
    args = p.parse_args(argv)
    dirs = {"demo": ensure_demo_model, "classifier": ensure_demo_classifier}
    models = [(name, dirs[name]()) for name in args.models.split(",")]
    results: dict = {"tool": "bench.kernels.head_grouping", "rows": ROWS, "row_tokens": ROW_TOKENS}
    if "heads" in args.parts:
        rows = []
        for name, path in models:
            grouped, per_row = heads_ms(path, args.repeats)
            rows.append([name, grouped, per_row, per_row / grouped])
            results[f"heads_{name}"] = {"grouped_ms": grouped, "per_row_ms": per_row}
        print(f"heads of one step: {ROWS} rows of {ROW_TOKENS} tokens, half embeddings, half scores "
              f"(demo) or classifications (classifier); median of {args.repeats}")
        print(report.table(["model", "grouped ms", "per row ms", "per row / grouped"], rows))
    if "http" in args.parts:
        rows = []
        for name, path in models:
            if args.base_url:
                run = mixed_http(args.base_url, args.concurrency, args.seconds, name == "classifier", args.seed)
                http = asyncio.run(run)
            else:
                with ServerProcess(["--model", str(path)], command=parse_command(args.server_cmd),
                                   env=prelude_env(), label=f"head-grouping-{name}") as server:
                    http = asyncio.run(mixed_http(server.base_url, args.concurrency, args.seconds,
                                                  name == "classifier", args.seed))
            results[f"http_{name}"] = http
            for kind in ("embed", "score", "classify"):
                if kind in http:
                    rows.append([name, kind, http[kind]["per_s"], http[kind]["p50_ms"], http[kind]["p99_ms"]])
            rows.append([name, "all", http["requests_per_s"], None, None])
        print(f"\nmixed traffic at c={args.concurrency}, {args.seconds:.0f} s per model")
        print(report.table(["model", "kind", "req/s", "P50 ms", "P99 ms"], rows))
    print(f"results: {report.write_json(args.json, results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
