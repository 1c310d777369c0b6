"""`python -m bench.kernels.lm_head`: the CPU LM head, `hidden @ W.t()` against Prelude's
native kernel (prelude/model/cpu_linear.py, kernels/cpu/skinny_gemm.hpp), for the row counts it
takes (up to cpu_linear.MAX_SKINNY_ROWS: 64 on AVX-512, 32 on AVX2) on a Qwen3-vocabulary head,
beside what reading and copying the weight costs on this machine. Times are the minimum of the
repeats (the least-disturbed run on a shared machine); GB/s counts the weight's bytes once.

With `--format bfloat16` or `int8` (or fp32 with `--layouts`) the head is stored in that format
in both layouts the kernels take, by rows and in panels, and each is timed at every row count,
and as a tied embedding's lookups of 128 and 2,048 ids; the output names the layout the model
keeps (cpu_linear.HEAD_LAYOUTS).
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

import torch

from bench.serving.core import report
from bench.kernels.microbench import add_flags, best_seconds, start, write_results
from prelude.model.cpu_linear import BY_ROWS, HEAD_LAYOUTS, MAX_SKINNY_ROWS, PANELS, built, linear, store


def best_ms(fn: Callable[[], object], repeats: int) -> float:
    return 1000 * best_seconds(fn, repeats)


@torch.inference_mode()  # the server's mode: linear() leaves autograd-tracked products to torch
def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.kernels.lm_head", description=__doc__)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--hidden", type=int, default=512, help="512: the issue's checkpoint B; 1024: Qwen3-0.6B")
    p.add_argument("--rows", default="1,2,4,8,16,32,64")
    p.add_argument("--format", default="float32", choices=["float32", "bfloat16", "int8"],
                   help="the head's stored format (narrow ones: both layouts timed)")
    p.add_argument("--layouts", action="store_true",
                   help="fp32 too: both layouts the kernels take, instead of the native head against torch's")
    add_flags(p, "lm_head.json")
    args = p.parse_args(argv)
    if not start(args, built):
        return 1
    weight = torch.randn(args.vocab, args.hidden)
    if args.format != "float32" or args.layouts:
        return _layouts(args, weight)
    gigabytes = weight.numel() * weight.element_size() / 1e9
    copy_target = torch.empty_like(weight)
    read_ms = best_ms(lambda: weight.sum(), args.repeats)
    copy_ms = best_ms(lambda: copy_target.copy_(weight), args.repeats)
    print(f"weight [{args.vocab}, {args.hidden}] fp32, {gigabytes * 1000:.0f} MB, {torch.get_num_threads()} threads")
    print(f"read (sum): {read_ms:.1f} ms = {gigabytes / read_ms * 1000:.1f} GB/s; "
          f"copy: {copy_ms:.1f} ms = {2 * gigabytes / copy_ms * 1000:.1f} GB/s read+written")
    rows, results = [], []
    for n in (n for n in map(int, args.rows.split(",")) if n <= MAX_SKINNY_ROWS):
        hidden = torch.randn(n, args.hidden)
        plain = best_ms(lambda: hidden @ weight.t(), args.repeats)
        ours = best_ms(lambda: linear(hidden, weight), args.repeats)
        rows.append([n, plain, ours, plain / ours, gigabytes / ours * 1000, read_ms / ours])
        results.append({"rows": n, "matmul_ms": plain, "prelude_ms": ours})
    print(report.table(["rows", "x @ W.t() ms", "prelude ms", "speedup", "prelude GB/s", "of read speed"], rows))
    write_results(args.json, {"tool": "bench.kernels.lm_head", "vocab": args.vocab, "hidden": args.hidden,
                              "threads": torch.get_num_threads(), "read_ms": read_ms, "copy_ms": copy_ms,
                              "results": results}, lambda ax: _plot(results, read_ms, ax))
    return 0


def _layouts(args: argparse.Namespace, weight: torch.Tensor) -> int:
    """The head in its format, by rows and in panels, at each row count."""
    stored = {layout: store(weight, args.format, layout) for layout in (BY_ROWS, PANELS)}
    kept = HEAD_LAYOUTS.get(args.format, BY_ROWS)
    kept_name = "panels" if kept == PANELS else "by rows"
    print(f"weight [{args.vocab}, {args.hidden}] {args.format}, {stored[kept].nbytes / 1e6:.0f} MB, "
          f"{torch.get_num_threads()} threads; the model keeps it {'in ' if kept == PANELS else ''}{kept_name}")
    rows, results = [], []
    for n in map(int, args.rows.split(",")):
        hidden = torch.randn(n, args.hidden)
        by_rows = best_ms(lambda: stored[BY_ROWS].matmul(hidden), args.repeats)
        panels = best_ms(lambda: stored[PANELS].matmul(hidden), args.repeats)
        rows.append([n, by_rows, panels, by_rows / panels])
        results.append({"rows": n, "by_rows_ms": by_rows, "panels_ms": panels})
    print(report.table(["rows", "by rows ms", "panels ms", "by rows / panels"], rows))
    # The tied embedding's lookups read the same weight: a prompt's ids, gathered from each layout.
    lookups, looked = [], []
    for n in (128, 2048):
        ids = torch.randint(0, args.vocab, (n,))
        by_rows = best_ms(lambda: stored[BY_ROWS].rows(ids), args.repeats)
        panels = best_ms(lambda: stored[PANELS].rows(ids), args.repeats)
        looked.append([n, by_rows, panels])
        lookups.append({"ids": n, "by_rows_ms": by_rows, "panels_ms": panels})
    print(report.table(["lookup ids", "by rows ms", "panels ms"], looked))
    write_results(args.json, {"tool": "bench.kernels.lm_head", "vocab": args.vocab, "hidden": args.hidden,
                              "format": args.format, "kept": kept_name,
                              "threads": torch.get_num_threads(), "results": results, "lookups": lookups},
                  lambda ax: _plot_layouts(results, args.format, ax))
    return 0


def _plot_layouts(results: list[dict], format: str, ax) -> None:
    n = [r["rows"] for r in results]
    ax.plot(n, [r["by_rows_ms"] for r in results], "o-", label=f"{format} by rows")
    ax.plot(n, [r["panels_ms"] for r in results], "s-", label=f"{format} in panels")
    _rows_axes(ax)


def _plot(results: list[dict], read_ms: float, ax) -> None:
    n = [r["rows"] for r in results]
    ax.plot(n, [r["matmul_ms"] for r in results], "o-", label="x @ W.t()")
    ax.plot(n, [r["prelude_ms"] for r in results], "s-", label="prelude (native kernel)")
    ax.axhline(read_ms, color="grey", linestyle=":", label="reading the weight once")
    _rows_axes(ax)


def _rows_axes(ax) -> None:
    """Both charts' axes: row counts (log 2) against the best time."""
    ax.set_xscale("log", base=2)
    ax.set_xlabel("rows")
    ax.set_ylabel("ms (best of repeats)")
    ax.legend()


if __name__ == "__main__":
    sys.exit(main())
