"""What the CPU kernel micro-benchmarks (lm_head, prefill_attention, linear_formats, decode_step)
share: the timer, the flags for threads, repeats and the JSON path, and writing the results with
their chart."""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Callable

import torch

from bench.charts import save_figure, write_chart
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


def write_results(json_path: Path, payload: dict, draw: Callable[[Any], None]) -> Path:
    """Writes the JSON and, beside it, the chart that draw(ax) fills (6 x 4 inches)."""
    path = report.write_json(json_path, payload)
    print(f"results: {path}")
    write_chart(lambda out: _draw(draw, out), path.with_suffix(".png"))
    return path


def _draw(draw: Callable[[Any], None], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    draw(ax)
    save_figure(fig, path)
