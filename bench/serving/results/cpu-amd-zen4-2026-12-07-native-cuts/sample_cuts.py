"""The sampler on 152K-entry rows (Qwen3's vocabulary), native kernel against the torch path
(which CUDA runs, and which the CPU ran for any row with a cut), alternating, best of five.

    python bench/serving/results/cpu-amd-zen4-2026-12-07-native-cuts/sample_cuts.py
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from prelude.contract.sampling import SamplingParams
from prelude.executor import sampler
from prelude.executor.sampler import sample

CASES = {"T 0.6, top-p 0.95, top-k 20 (Qwen3's)": SamplingParams(temperature=0.6, top_p=0.95, top_k=20),
         "T 1, top-p 0.9": SamplingParams(temperature=1.0, top_p=0.9),
         "T 0.8, min-p 0.05": SamplingParams(temperature=0.8, min_p=0.05),
         "T 0.6, no cut": SamplingParams(temperature=0.6)}


def best_ms(logits: torch.Tensor, params: list[SamplingParams], native: bool) -> float:
    kernel = sampler.sample_tokens
    if not native:
        sampler.sample_tokens = None
    try:
        sample(logits.clone(), params, [0] * len(params))
        times = []
        for _ in range(5):
            copy = logits.clone()
            start = time.perf_counter()
            sample(copy, params, [0] * len(params))
            times.append(time.perf_counter() - start)
        return min(times) * 1000
    finally:
        sampler.sample_tokens = kernel


def main() -> None:
    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(0)
    results = []
    print(f"{'rows':>4}  {'sampling':40s} {'native ms':>10} {'torch ms':>10}")
    for rows in (1, 16, 64):
        logits = torch.randn(rows, 151_936, generator=gen) * 3
        for name, params in CASES.items():
            native, reference = best_ms(logits, [params] * rows, True), best_ms(logits, [params] * rows, False)
            results.append({"rows": rows, "sampling": name, "native_ms": native, "torch_ms": reference})
            print(f"{rows:>4}  {name:40s} {native:10.2f} {reference:10.2f}")
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("sample_cuts.json")
    out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
