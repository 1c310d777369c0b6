"""`python -m bench.kernels.linear_formats`: a decoder layer's linear products on the CPU in each
weight format the kernels store (prelude/model/cpu_linear.py), at decode and prompt row counts:
the layer's time (its qkv, o, gate_up and down weights one after another, each the best of the
repeats) and the GFLOP/s that makes. The shapes default to checkpoint B's (hidden 512,
intermediate 1536, 8 query and 4 KV heads of 64). A prompt's many rows are compute-bound, so
their GFLOP/s against the CPU's multiply-add peak says how much a format's kernel leaves; a
decode step's few rows read the weights once, so its bytes decide.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

import torch

from bench.kernels.microbench import add_flags, best_seconds, start, write_results
from bench.serving.core import report
from prelude.model import cpu_linear


def layer_shapes(hidden: int, intermediate: int, heads: int, kv_heads: int,
                 head_dim: int) -> dict[str, tuple[int, int]]:
    """A Qwen3/Llama decoder layer's weights as the CPU path stores them: [outputs, inputs]."""
    return {"qkv": ((heads + 2 * kv_heads) * head_dim, hidden), "o": (hidden, heads * head_dim),
            "gate_up": (2 * intermediate, hidden), "down": (hidden, intermediate)}


@torch.inference_mode()
def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.kernels.linear_formats", description=__doc__)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--intermediate", type=int, default=1536)
    p.add_argument("--heads", default="8,4,64", help="query heads, KV heads, head dim")
    p.add_argument("--rows", default="1,4,16,128,2048")
    p.add_argument("--formats", default="float32,bfloat16,bf16x2,int8,bf16x3",
                   help="those this CPU cannot store are left out (bf16x3 needs AMX)")
    add_flags(p, "linear_formats.json")
    args = p.parse_args(argv)
    if not start(args, cpu_linear.built):
        return 1
    heads, kv_heads, head_dim = map(int, args.heads.split(","))
    shapes = layer_shapes(args.hidden, args.intermediate, heads, kv_heads, head_dim)
    weights = {name: torch.randn(shape) * 0.02 for name, shape in shapes.items()}
    formats = [f for f in args.formats.split(",")
               if all(cpu_linear.storable(w, f, cpu_linear.PANELS) for w in weights.values())]
    from kernels.cpu import _native as native

    print(f"{torch.get_num_threads()} threads; bf16 products {native.bf16_products()}, "
          f"int8 products {native.int8_products()}, AMX {native.amx_products()}")
    results, table = [], []
    for fmt in formats:
        stored = {name: cpu_linear.store(w, fmt, cpu_linear.PANELS) for name, w in weights.items()}
        for n in map(int, args.rows.split(",")):
            ms = {name: 1000 * best_seconds(lambda: s.matmul(x), args.repeats)
                  for name, s in stored.items() for x in [torch.randn(n, s.inputs)]}
            total = sum(ms.values())
            gflops = sum(2 * n * o * i for o, i in shapes.values()) / total / 1e6
            results.append({"format": fmt, "rows": n, "ms": ms, "layer_ms": total, "gflops": gflops})
            table.append([fmt, n, *(f"{ms[k]:.3f}" for k in shapes), f"{total:.3f}", f"{gflops:.0f}"])
    print(report.table(["format", "rows", *(f"{k} ms" for k in shapes), "layer ms", "GFLOP/s"], table))
    write_results(args.json, {"tool": "bench.kernels.linear_formats", "shapes": shapes,
                              "threads": torch.get_num_threads(), "results": results},
                  lambda ax: _plot(results, ax))
    return 0


def _plot(results: list[dict], ax) -> None:
    for fmt in dict.fromkeys(r["format"] for r in results):
        mine = [r for r in results if r["format"] == fmt]
        ax.plot([r["rows"] for r in mine], [r["gflops"] for r in mine], "o-", label=fmt)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("rows")
    ax.set_ylabel("GFLOP/s over the layer's products")
    ax.legend()


if __name__ == "__main__":
    sys.exit(main())
