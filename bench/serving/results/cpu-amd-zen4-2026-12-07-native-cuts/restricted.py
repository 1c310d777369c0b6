"""A restricted draw at Qwen2.5's sampling defaults (T 0.7, top-p 0.8, top-k 20, repetition
penalty 1.05) over rows of its 151,936 entries, each with a 512-token history: the CPU runner's
draws without torch (executor.host_sampling: numpy restrictions, the native draw) against the
torch heads' (executor.sampler: torch's restrictions, the same native draw), which the runner
took for such rows before. Best of five, ms.

    python bench/serving/results/cpu-amd-zen4-2026-12-07-native-cuts/restricted.py
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from prelude.contract.batch import DecodeRow, OutputSpec
from prelude.contract.sampling import SamplingParams
from prelude.executor import host_sampling
from prelude.executor.sampler import sample

PARAMS = SamplingParams(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)


def best_ms(run) -> float:
    run()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times) * 1000


def main() -> None:
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    results = []
    print(f"{'rows':>4} {'without torch ms':>17} {'torch heads ms':>15}")
    for rows in (1, 16, 64):
        logits = (rng.standard_normal((rows, 151_936)) * 3).astype(np.float32)
        history = [int(t) for t in rng.integers(0, 151_936, 512)]
        row = DecodeRow(0, history[-1], 511, [], OutputSpec(sample=PARAMS), sample_step=100, history=history)
        params = [PARAMS] * rows
        host = best_ms(lambda: host_sampling.sample(logits.copy(), params, lambda k: row, rng, 2))
        reference = best_ms(lambda: sample(torch.from_numpy(logits.copy()), params, [100] * rows, [history] * rows))
        results.append({"rows": rows, "without_torch_ms": host, "torch_heads_ms": reference})
        print(f"{rows:>4} {host:17.2f} {reference:15.2f}")
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("restricted.json")
    out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
