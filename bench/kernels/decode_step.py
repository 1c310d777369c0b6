"""`python -m bench.kernels.decode_step`: one CPU decode step of a checkpoint without the server
(ModelRunner.run: flattening, attention plan, forward, LM head, sampling at T=1) for a few rows
at a given context: the model's ops in torch (`kernels/reference.py`), the native kernels
(`kernels/cpu/ops.py`) layer by layer, and the whole step's layers in one native call
(`prelude/executor/fused_step.py`, what the server runs). Alternates them so a shared machine's
disturbances fall on all; reports the best and the median of the rounds."""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from bench.kernels.microbench import write_results
from bench.serving.core import report
from prelude.contract.batch import DecodeRow, OutputSpec
from prelude.contract.sampling import SamplingParams
from prelude.executor.attention.torch_ref import TorchAttention
from prelude.executor.fused_step import native_step
from prelude.executor.kv_cache import KVCache, KVCacheShape
from prelude.executor.runner import ModelRunner
from prelude.model.config import ModelConfig
from prelude.model.loader import load_model
from prelude.host_tuning import keep_freed_memory
from prelude.model.ops import TORCH_OPS, select_ops

BLOCK = 16


# What each column runs: torch's ops layer by layer; the native kernels layer by layer; the
# native kernels with the whole decode step in one call (what the server picks).
OPS = ("torch", "native ops", "fused step")


def cpu_runner(path: str, max_positions: int, blocks: int, ops=None, fused_step: bool = True) -> ModelRunner:
    """A float32 CPU runner of the checkpoint (the server's ops unless `ops`; without the one-call
    step unless `fused_step`) over a KV cache of `blocks` blocks, as the in-process step
    benchmarks (this one, suffix_step) time it."""
    config = ModelConfig.from_dir(path)
    ops = ops or select_ops(torch.device("cpu"))
    model = load_model(path, config, torch.float32, torch.device("cpu"), max_positions=max_positions, ops=ops)
    shape = KVCacheShape.for_model(config, num_blocks=blocks, block_size=BLOCK, dtype=torch.float32)
    return ModelRunner(model, TorchAttention(KVCache(shape, torch.device("cpu"))), torch.device("cpu"), BLOCK,
                       native_step(model, ops) if fused_step else None)


def runner_for(path: str, ops_name: str, context: int, rows: int) -> ModelRunner:
    return cpu_runner(path, context + 2, rows * -(-(context + 1) // BLOCK),
                      TORCH_OPS if ops_name == "torch" else None, fused_step=ops_name != "native ops")


def mean_ms(step: Callable[[], object], steps: int) -> float:
    """Milliseconds per call over `steps` calls, after one untimed call."""
    step()
    began = time.perf_counter()
    for _ in range(steps):
        step()
    return 1000 * (time.perf_counter() - began) / steps


def step_ms(runner: ModelRunner, context: int, rows: int, steps: int) -> float:
    per_row = -(-(context + 1) // BLOCK)
    spec = OutputSpec(sample=SamplingParams())
    batch = [DecodeRow(i, 5, context, list(range(i * per_row, (i + 1) * per_row)), spec) for i in range(rows)]
    return mean_ms(lambda: runner.run((), batch, "decode"), steps)


def add_step_flags(p: argparse.ArgumentParser, json_name: str, steps: int) -> None:
    """The flags the in-process step benchmarks (this one, suffix_step) share."""
    p.add_argument("--model", default=None, help="checkpoint directory (default: the demo model)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=steps, help="steps timed per round")
    p.add_argument("--json", type=Path, default=report.RESULTS_DIR / json_name)


def start_steps(args: argparse.Namespace) -> None:
    """Applies --threads, sets the allocator up as the server does, and resolves --model."""
    if args.threads:
        torch.set_num_threads(args.threads)
    keep_freed_memory()  # as the server does at startup
    if args.model is None:
        from prelude.demo import ensure_demo_model

        args.model = str(ensure_demo_model())


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.kernels.decode_step", description=__doc__)
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--context", type=int, default=150)
    add_step_flags(p, "decode_step.json", steps=100)
    args = p.parse_args(argv)
    start_steps(args)
    runners = {name: runner_for(args.model, name, args.context, args.rows) for name in OPS}
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(args.rounds):
        for name, runner in runners.items():
            times[name].append(step_ms(runner, args.context, args.rows, args.steps))
    print(f"{args.model}: {args.rows} rows at {args.context} tokens of context, {torch.get_num_threads()} threads")
    print(report.table(["ops", "best ms", "median ms"],
                       [[name, min(t), statistics.median(t)] for name, t in times.items()]))
    write_results(args.json, {"tool": "bench.kernels.decode_step", "model": args.model, "rows": args.rows,
                              "context": args.context, "threads": torch.get_num_threads(), "rounds_ms": times},
                  lambda ax: _plot(times, ax))
    return 0


def _plot(times: dict[str, list[float]], ax) -> None:
    ax.boxplot(list(times.values()), tick_labels=list(times))
    ax.set_ylabel("ms per decode step (rounds)")


if __name__ == "__main__":
    sys.exit(main())
