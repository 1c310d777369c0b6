"""`python -m bench.kernels.prefill_attention`: one prompt row's causal attention on the CPU,
torch's flash kernel (`scaled_dot_product_attention`) against Prelude's native kernel
(kernels/cpu/prefill_attention.hpp), for the heads of the demo model, checkpoint B and
Qwen3-0.6B over prompt lengths, and for chunks over a cached context. The context lies in KV
blocks of 16 tokens in shuffled order, as a prefix-cache hit's do, and Prelude's figure is its
whole path from there. Times are the minimum of the repeats (the least-disturbed run on a shared
machine); GFLOPS count the causal products."""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence
from unittest.mock import patch

import torch
import torch.nn.functional as F

from bench.serving.core import report
from bench.kernels.microbench import add_flags, best_seconds, start, write_results
from bench.kernels.scattered_blocks import scattered_context

from kernels.cpu import ops

HEADS = {"demo": (8, 4, 32), "B": (8, 4, 64), "0.6B": (16, 8, 128)}
BLOCK = 16


def best_us(fn: Callable[[], object], repeats: int) -> float:
    return 1e6 * best_seconds(fn, repeats)


def _native(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: ops.CachedContext | None) -> torch.Tensor:
    """Prelude's path from the cache, also where it declines the kernel (ops.WIDE_HEAD)."""
    out = ops.causal_prefill(q, k, v, context)
    assert out is not None
    return out


def torch_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    qt, kt, vt = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
    if len(q) == len(k):
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True)
    seen = torch.ones(len(q), len(k), dtype=torch.bool).tril(len(k) - len(q))
    return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=seen, enable_gqa=True)


def _measure(shapes: list[tuple[int, int]], repeats: int) -> tuple[list[list], list[dict]]:
    """(table rows, JSON results) of every head shape at every (tokens, context)."""
    rows, results = [], []
    for name, (heads, kv_heads, dim) in HEADS.items():
        for n, past in shapes:
            q = torch.randn(n, heads, dim)
            k, v = torch.randn(past + n, kv_heads, dim), torch.randn(past + n, kv_heads, dim)
            flops = 4 * heads * dim * (n * past + n * (n + 1) / 2)
            paged = None
            if past:  # the context in shuffled blocks of a cache, as a prefix-cache hit finds it
                paged = scattered_context(k[:past], v[:past], BLOCK, torch.Generator().manual_seed(past))
            plain = best_us(lambda: torch_attention(q, k, v), repeats)
            ours = best_us(lambda: _native(q, k[past:], v[past:], paged), repeats)
            rows.append([name, f"{heads}/{kv_heads} x {dim}", n, past, plain, ours, plain / ours,
                         flops / ours / 1e3])
            results.append({"heads": name, "tokens": n, "context": past, "torch_us": plain, "prelude_us": ours})
    return rows, results


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.kernels.prefill_attention", description=__doc__)
    p.add_argument("--tokens", default="128,512,2048", help="prompt lengths (queries = keys)")
    p.add_argument("--chunk", default="256:4096,16:1024,64:1024,16:4096,64:4096",
                   help="QUERIES:CONTEXT,..., chunks over a cached context ('' to skip)")
    add_flags(p, "prefill_attention.json")
    args = p.parse_args(argv)
    if not start(args, ops.built):
        return 1
    shapes = [(n, 0) for n in map(int, args.tokens.split(","))]
    if args.chunk:
        shapes += [tuple(map(int, chunk.split(":"))) for chunk in args.chunk.split(",")]
    with patch.object(ops, "WIDE_HEAD_MAX_KEYS", sys.maxsize):  # the kernel's own figures at every length
        rows, results = _measure(shapes, args.repeats)
    print(f"{torch.get_num_threads()} threads")
    print(report.table(["heads", "q/kv x dim", "tokens", "context", "torch us", "prelude us", "speedup",
                        "prelude GFLOPS"], rows))
    write_results(args.json, {"tool": "bench.kernels.prefill_attention", "threads": torch.get_num_threads(),
                              "results": results}, lambda ax: _plot(results, ax))
    return 0


def _plot(results: list[dict], ax) -> None:
    labels = [f"{r['heads']} {r['tokens']}" + (f"+{r['context']}" if r["context"] else "") for r in results]
    ax.bar(range(len(results)), [r["torch_us"] / r["prelude_us"] for r in results])
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(results)), labels, rotation=45, ha="right")
    ax.set_ylabel("speedup over torch's flash kernel")
    ax.set_title("CPU prefill attention, one row")


if __name__ == "__main__":
    raise SystemExit(main())
