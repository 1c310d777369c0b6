"""What the CPU kernel micro-benchmarks (lm_head, prefill_attention) share: the timer, and the
flags for threads, repeats and the JSON path."""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Callable

import torch

from bench.serving.core import report

NOT_BUILT = "kernels.cpu is not built (pip install -e . or python setup.py build_ext --inplace)"


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    """The minimum over the repeats, after one untimed call: the least-disturbed run on a shared
    machine."""
    fn()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)


def add_flags(p: argparse.ArgumentParser, json_name: str) -> None:
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--json", type=Path, default=report.RESULTS_DIR / json_name)


def start(args: argparse.Namespace, built: bool) -> bool:
    """Applies --threads and seeds torch; False (with the reason printed) when the kernels are not built."""
    if args.threads:
        torch.set_num_threads(args.threads)
    if not built:
        print(NOT_BUILT)
        return False
    torch.manual_seed(0)
    return True
