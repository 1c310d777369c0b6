"""`python -m bench.serving.grammar_libs`: xgrammar against llguidance on this project's
tokenizers, for choosing the structured-output library.

For each library and tokenizer (the demo model's, Qwen3's, Llama 3's): the one-time tokenizer
preparation; per schema, the time from the schema to a matcher that gave its first mask (both
libraries finish some work lazily, so a compile alone would flatter one of them), over the judge
schemas, real-world-like ones and seeded generated ones, with the share that compiled; and the
per-token mask time at batch 1 and 16 along random walks through the judge and real-world
schemas it compiles (each step picks a random allowed token). Both libraries run with compact JSON
whitespace and two threads (the machine's cores). Prints a table, writes JSON and a PNG."""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

from bench.charts import write_chart
from bench.serving.core import report
from bench.serving.core.schemas import JUDGE, REAL_WORLD, Schema, corpus
from bench.shared_data import shared_dir

THREADS = 2
WALK_TOKENS = 48


def tokenizer_paths() -> dict[str, Path]:
    from prelude.demo import ensure_demo_model

    shared = shared_dir() / "tokenizers"
    return {"demo": ensure_demo_model() / "tokenizer.json", "qwen3": shared / "qwen3" / "tokenizer.json",
            "llama3": shared / "llama3" / "tokenizer.json"}


class LLGuidance:
    name = "llguidance"

    def __init__(self, path: Path):
        import llguidance
        import llguidance.torch

        self.llg, self.fill_par = llguidance, llguidance.torch.fill_next_token_bitmask_par
        self.tokenizer = llguidance.LLTokenizer(path.read_text())
        self.vocab = self.tokenizer.vocab_size
        self.executor = llguidance.LLExecutor(THREADS)

    def matcher(self, schema: Schema) -> Any:
        grammar = self.llg.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
        m = self.llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def fill(self, matchers: list, bitmask: torch.Tensor) -> None:
        if len(matchers) == 1:
            matchers[0].unsafe_compute_mask_ptr(bitmask.data_ptr(), bitmask.shape[1] * 4)
        else:
            self.fill_par(self.executor, [(m, i) for i, m in enumerate(matchers)], bitmask)

    @staticmethod
    def accept(m: Any, token: int) -> None:
        m.consume_token(token)

    @staticmethod
    def done(m: Any) -> bool:
        return m.is_stopped()


class XGrammar:
    name = "xgrammar"

    def __init__(self, path: Path):
        import xgrammar
        from transformers import PreTrainedTokenizerFast

        self.xgr = xgrammar
        hf = PreTrainedTokenizerFast(tokenizer_file=str(path))
        info = xgrammar.TokenizerInfo.from_huggingface(hf, vocab_size=len(hf))
        self.vocab = info.vocab_size
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=THREADS, cache_enabled=False)
        self.batch = xgrammar.BatchGrammarMatcher(THREADS)

    def matcher(self, schema: Schema) -> Any:
        compiled = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
        m = self.xgr.GrammarMatcher(compiled)
        m.fill_next_token_bitmask(self.xgr.allocate_token_bitmask(1, self.vocab))
        return m

    def fill(self, matchers: list, bitmask: torch.Tensor) -> None:
        if len(matchers) == 1:
            matchers[0].fill_next_token_bitmask(bitmask)
        else:
            self.batch.batch_fill_next_token_bitmask(matchers, bitmask)

    @staticmethod
    def accept(m: Any, token: int) -> None:
        m.accept_token(token)

    @staticmethod
    def done(m: Any) -> bool:
        return m.is_terminated()


LIBRARIES: dict[str, Callable[[Path], Any]] = {"llguidance": LLGuidance, "xgrammar": XGrammar}


def compile_times(lib: Any, schemas: dict[str, Schema]) -> tuple[list[float], list[str]]:
    """Seconds from schema to a matcher with its first mask, for each schema that compiled; the
    names of those that did not."""
    bitmask = torch.zeros(1, (lib.vocab + 31) // 32, dtype=torch.int32)
    seconds, failed = [], []
    for name, schema in schemas.items():
        started = time.perf_counter()
        try:
            m = lib.matcher(schema)
            lib.fill([m], bitmask)
        except Exception:  # noqa: BLE001 (a schema the library refuses is what is counted)
            failed.append(name)
            continue
        seconds.append(time.perf_counter() - started)
    return seconds, failed


def allowed(row: torch.Tensor, vocab: int) -> torch.Tensor:
    bits = (row[:, None] >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.flatten()[:vocab].nonzero().flatten()


def mask_times(lib: Any, schemas: list[Schema], batch: int, rng: random.Random) -> list[float]:
    """Seconds per mask fill of `batch` rows, along random walks of WALK_TOKENS tokens (a row
    whose document ended starts a new one)."""
    bitmask = torch.zeros(batch, (lib.vocab + 31) // 32, dtype=torch.int32)
    fresh = [lib.matcher(schemas[i % len(schemas)]) for i in range(batch)]
    matchers = list(fresh)
    times = []
    for step in range(WALK_TOKENS):
        started = time.perf_counter()
        lib.fill(matchers, bitmask)
        times.append(time.perf_counter() - started)
        for i, m in enumerate(matchers):
            ids = allowed(bitmask[i], lib.vocab)
            lib.accept(m, int(ids[rng.randrange(len(ids))]) if len(ids) else 0)
            if lib.done(m) or not len(ids):
                matchers[i] = lib.matcher(schemas[(i + step) % len(schemas)])
    return times


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--generated", type=int, default=200, help="seeded generated schemas (default 200)")
    parser.add_argument("--tokenizers", default="demo,qwen3,llama3")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(THREADS)
    sets = {"judge": dict(JUDGE), "real-world": dict(REAL_WORLD), "generated": corpus(args.generated, seed=1)}
    walk_schemas = list(JUDGE.values()) + [s for k, s in REAL_WORLD.items() if k != "any_json"]
    paths = tokenizer_paths()
    import llguidance.torch  # noqa: F401 (imports are not part of a library's preparation)
    import transformers  # noqa: F401
    import xgrammar  # noqa: F401
    rows, out = [], []
    for tok in args.tokenizers.split(","):
        for lib_name, make in LIBRARIES.items():
            started = time.perf_counter()
            lib = make(paths[tok])
            prepare_s = time.perf_counter() - started
            entry: dict[str, Any] = {"library": lib_name, "tokenizer": tok, "vocab": lib.vocab, "prepare_s": prepare_s}
            for set_name, schemas in sets.items():
                seconds, failed = compile_times(lib, schemas)
                entry[set_name] = {"p50_ms": 1e3 * (percentile(seconds, 0.5) or 0),
                                   "p99_ms": 1e3 * (percentile(seconds, 0.99) or 0),
                                   "max_ms": 1e3 * max(seconds, default=0), "compiled": len(seconds),
                                   "total": len(schemas), "failed": failed}
            walkable = [s for s in walk_schemas if not compile_times(lib, {"s": s})[1]]
            for batch in (1, 16):
                times = mask_times(lib, walkable, batch, random.Random(7))
                entry[f"mask_b{batch}_us"] = 1e6 * statistics.median(times)
                entry[f"mask_b{batch}_p99_us"] = 1e6 * (percentile(times, 0.99) or 0)
            out.append(entry)
            rows.append([tok, lib_name, prepare_s * 1e3] + [v for s in sets for v in (
                entry[s]["p50_ms"], entry[s]["p99_ms"], f"{entry[s]['compiled']}/{entry[s]['total']}")]
                + [entry["mask_b1_us"], entry["mask_b16_us"], entry["mask_b16_us"] / 16])
            print(f"{tok} {lib_name} done", flush=True)
    headers = ["tokenizer", "library", "prepare ms"] + [f"{s} {c}" for s in sets for c in ("p50 ms", "p99 ms", "ok")] \
        + ["mask b1 us", "mask b16 us", "b16 us/row"]
    print(report.table(headers, rows))
    path = report.write_json(args.json or report.default_json_path("grammar_libs"), {"results": out})
    print(f"json: {path}")
    write_chart(lambda p: _chart(out, p), path.with_suffix(".png"))


def _chart(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    labels = [f"{r['tokenizer']}\n{r['library']}" for r in results]
    x = range(len(results))
    for offset, key in enumerate(("judge", "real-world", "generated")):
        axes[0].bar([i + 0.27 * (offset - 1) for i in x], [r[key]["p50_ms"] for r in results], 0.27,
                    label=f"{key} p50")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("schema to first mask, ms (p50)")
    axes[0].legend(fontsize=8)
    for offset, batch in enumerate((1, 16)):
        axes[1].bar([i + 0.4 * (offset - 0.5) for i in x], [r[f"mask_b{batch}_us"] for r in results], 0.4,
                    label=f"batch {batch}")
    axes[1].set_ylabel("mask fill per step, us (median)")
    axes[1].legend(fontsize=8)
    for ax in axes:
        ax.set_xticks(list(x), labels, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
