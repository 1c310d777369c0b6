"""`python -m bench.kernels.lm_head`: the CPU LM head, `hidden @ W.t()` against Prelude's
native kernel (prelude/model/cpu_linear.py, kernels/cpu/skinny_gemm.hpp), for the row counts it
takes (up to cpu_linear.MAX_SKINNY_ROWS: 64 on AVX-512, 32 on AVX2) on a Qwen3-vocabulary head,
beside what reading and copying the weight costs on this machine. Times are the minimum of the
repeats (the least-disturbed run on a shared machine); GB/s counts the weight's bytes once.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

import torch

from bench.serving.core import report
from bench.kernels.microbench import add_flags, best_seconds, start, write_results
from prelude.model.cpu_linear import MAX_SKINNY_ROWS, built, linear


def best_ms(fn: Callable[[], object], repeats: int) -> float:
    return 1000 * best_seconds(fn, repeats)


@torch.inference_mode()  # the server's mode: linear() leaves autograd-tracked products to torch
def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.kernels.lm_head", description=__doc__)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--hidden", type=int, default=512, help="512: the issue's checkpoint B; 1024: Qwen3-0.6B")
    p.add_argument("--rows", default="1,2,4,8,16,32,64")
    add_flags(p, "lm_head.json")
    args = p.parse_args(argv)
    if not start(args, built):
        return 1
    weight = torch.randn(args.vocab, args.hidden)
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


def _plot(results: list[dict], read_ms: float, ax) -> None:
    n = [r["rows"] for r in results]
    ax.plot(n, [r["matmul_ms"] for r in results], "o-", label="x @ W.t()")
    ax.plot(n, [r["prelude_ms"] for r in results], "s-", label="prelude (native kernel)")
    ax.axhline(read_ms, color="grey", linestyle=":", label="reading the weight once")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("rows")
    ax.set_ylabel("ms (best of repeats)")
    ax.legend()


if __name__ == "__main__":
    sys.exit(main())
