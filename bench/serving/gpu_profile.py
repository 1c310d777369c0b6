"""Where a CUDA step's time goes (#14 item 4): the executor alone, without the server, on the
random-weight Qwen3 checkpoints, for the batches the serving table sends. For each batch: the
step's wall time (mean of timed steps after warm-up; `execute` returns after the results reach
the host, so this is the whole step), then one step under torch.profiler: GPU busy time, host
time in torch's operators and launches, and the kernels that take the most GPU time.

  python -m bench.serving.gpu_profile --tokenizer .tok [--sizes 0.6B 4B] [--out DIR]

The checkpoints are the ones gpu_table2 wrote (WORKDIR/qwen3-<size>, the same seed-0 weights),
written there first when missing: gpu_check.sh runs this after the table, and writing the 4B's
8 GB again cost the device call time it measures nothing in.

Writes DIR/gpu_profile.txt (the tables) and DIR/gpu_profile.json (the step times)."""
from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

import torch

from bench.serving.checkpoint import write_checkpoint
from bench.serving.gpu_table2 import WORKDIR
from prelude.contract.batch import DecodeBatch, DecodeRow, OneShotBatch, OutputSpec, PrefillRow
from prelude.contract.config import Config
from prelude.contract.sampling import SamplingParams
from prelude.executor.executors import Executors
from prelude.executor.kv_cache import KVCacheShape
from prelude.model.config import ModelConfig
from prelude.model.loader import load_model
from prelude.model.ops import select_ops
from prelude.app.runner_setup import cuda_runner

BS = 16
ONE_TOKEN = OutputSpec(sample=SamplingParams(temperature=0.0))


def oneshot(rows: int, length: int, rng: random.Random) -> OneShotBatch:
    """Fresh prompts whose full blocks are stored, as the server stores them for the prefix cache."""
    per_row = length // BS
    return OneShotBatch([PrefillRow(i, [rng.randrange(1000, 150000) for _ in range(length)], 0,
                                    list(range(i * per_row, (i + 1) * per_row)), ONE_TOKEN)
                         for i in range(rows)])


def judge(rows: int, prefix: int, length: int, rng: random.Random) -> OneShotBatch:
    """Rows over one cached prefix (a rubric the prefix cache holds), their own tokens unstored:
    the steps no whole-step graph takes, which replay in pieces."""
    table = list(range(prefix // BS))
    return OneShotBatch([PrefillRow(i, [rng.randrange(1000, 150000) for _ in range(length)], prefix, table,
                                    ONE_TOKEN) for i in range(rows)])


def decode(rows: int, context: int) -> DecodeBatch:
    per_row = context // BS + 1
    return DecodeBatch([DecodeRow(i, 1000 + i, context, list(range(i * per_row, (i + 1) * per_row)), ONE_TOKEN)
                        for i in range(rows)])


def runner_for(path: Path, enforce_eager: bool):
    device = torch.device("cuda")
    config = ModelConfig.from_dir(path)
    model = load_model(path, config, torch.bfloat16, device, max_positions=4096, ops=select_ops(device))
    per_block = KVCacheShape.bytes_per_block(config, BS, torch.bfloat16)
    cfg = Config(model=str(path), block_size=BS, num_kv_blocks=16384, max_num_seqs=256,
                 max_num_batched_tokens=16384, enforce_eager=enforce_eager)
    runner, *_ = cuda_runner(cfg, model, device, torch.bfloat16, 4096, 1024, per_block)
    runner.warmup()
    return runner


def profile(executors: Executors, batch, label: str, report: list[str], steps: int = 10) -> dict:
    for _ in range(3):
        executors.execute(batch)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        executors.execute(batch)
    wall_ms = 1000 * (time.perf_counter() - start) / steps
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        executors.execute(batch)
    events = prof.key_averages()
    gpu_ms = sum(e.self_device_time_total for e in events) / 1000
    # The host's time in torch's operators and launches (the profiler's own cost included).
    host_ms = sum(e.self_cpu_time_total for e in events) / 1000
    report.append(f"\n## {label}: step {wall_ms:.2f} ms wall, {gpu_ms:.2f} ms of kernels, "
                  f"{host_ms:.2f} ms of host operators (profiled step)")
    report.append(events.table(sort_by="self_device_time_total", row_limit=14, max_name_column_width=60))
    print(f"{label}: {wall_ms:.2f} ms/step, kernels {gpu_ms:.2f} ms, host {host_ms:.2f} ms", flush=True)
    return {"label": label, "step_ms": wall_ms, "kernel_ms": gpu_ms, "host_ms": host_ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", type=Path, default=None)
    parser.add_argument("--sizes", nargs="+", default=["0.6B", "4B"])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench-results")))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng, report, records = random.Random(0), [], []
    # The one-token shapes' steps: a row alone (c=1), a few or many rows (c=16, 64), past the
    # largest prefill graph (32 x 512 of the 0.6B, 4 x 512 of the 4B), and decode rows.
    shapes = {"0.6B": [(1, 128), (4, 128), (16, 128), (64, 128), (16, 512), (32, 512)],
              "4B": [(1, 512), (2, 512), (4, 512), (16, 512)]}
    batches = {size: [(f"{rows} x {length} OneShot", oneshot(rows, length, rng)) for rows, length in shapes[size]]
               for size in shapes}
    batches["0.6B"] += [("16 x 128 over a 512-token prefix", judge(16, 512, 128, rng)),
                        ("4 x decode at 160", decode(4, 160))]
    batches["4B"].append(("4 x 128 over a 1024-token prefix", judge(4, 1024, 128, rng)))
    for size in args.sizes:
        path = WORKDIR / f"qwen3-{size}"
        if not (path / "config.json").is_file():  # written after the weights: its presence means both
            write_checkpoint(path, size, args.tokenizer)
        for eager in (False, True):
            executors = Executors.over(runner_for(path, eager))
            for label, batch in batches[size]:
                records.append(profile(executors, batch, f"{size} {label}{' eager' if eager else ''}", report))
            del executors
            torch.cuda.empty_cache()
    (args.out / "gpu_profile.txt").write_text("\n".join(report))
    (args.out / "gpu_profile.json").write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
