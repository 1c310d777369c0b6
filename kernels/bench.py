"""Micro-benchmark of every kernel against its torch reference: `python -m kernels.bench`.

CUDA only. Shapes are Qwen3-0.6B's and Qwen3-4B's at decode-like and prefill-like token counts;
times are do_bench medians (ms -> us), bandwidth counts each input read and output written once.
Prints one table; `--json PATH` also writes the rows.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

MODELS = {  # hidden, intermediate, q heads, kv heads, head dim
    "0.6B": (1024, 3072, 16, 8, 128),
    "4B": (2560, 9728, 32, 8, 128),
}
TOKENS = (1, 16, 128, 2048)


def _cases(model: str, tokens: int, device: torch.device):
    from kernels import reference
    from kernels.activation import silu_and_mul
    from kernels.gather import gather_last
    from kernels.norm import rms_norm
    from kernels.rope import rope_kv_write

    hidden, inter, hq, hkv, hd = MODELS[model]
    dt = torch.bfloat16
    x = torch.randn(tokens, hidden, device=device, dtype=dt)
    res = torch.randn_like(x)
    w = torch.randn(hidden, device=device, dtype=dt)
    size = x.element_size()
    yield "rms_norm+residual", (lambda: reference.rms_norm(x, w, 1e-6, res)), \
        (lambda: rms_norm(x, w, 1e-6, res)), 4 * x.numel() * size

    gate_up = torch.randn(tokens, 2 * inter, device=device, dtype=dt)
    yield "silu_and_mul", (lambda: reference.silu_and_mul(gate_up)), \
        (lambda: silu_and_mul(gate_up)), 3 * tokens * inter * size

    qkv = torch.randn(tokens, (hq + 2 * hkv) * hd, device=device, dtype=dt)
    q, k, v = qkv.split([hq * hd, hkv * hd, hkv * hd], dim=-1)
    q, k, v = q.view(tokens, hq, hd), k.view(tokens, hkv, hd), v.view(tokens, hkv, hd)
    table = torch.randn(tokens, 1, hd, device=device, dtype=dt)
    cos, sin = table.chunk(2, dim=-1)
    blocks = -(-tokens // 16) + 1
    k_cache = torch.zeros(blocks, 16, hkv, hd, device=device, dtype=dt)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.arange(tokens, device=device)
    qn, kn = torch.ones(hd, device=device, dtype=dt), torch.ones(hd, device=device, dtype=dt)
    cos_rows, sin_rows = cos.squeeze(1), sin.squeeze(1)  # the reference's [T, D/2], made once, untimed

    def torch_rope():
        return reference.rope_kv_write(q, k, v, cos_rows, sin_rows, k_cache, v_cache, slots, qn, kn, 1e-6)

    def triton_rope():
        return rope_kv_write(q, k, v, cos, sin, k_cache, v_cache, slots, qn, kn, 1e-6)

    yield "qknorm+rope+kv_write", torch_rope, triton_rope, (2 * qkv.numel() + 2 * tokens * hkv * hd) * size

    rows = max(1, tokens // 16)
    starts = torch.linspace(0, tokens, rows + 1, device=device).round().to(torch.int32)
    yield "gather_last", (lambda: reference.gather_last(x, starts)), \
        (lambda: gather_last(x, starts)), 2 * rows * hidden * size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("kernels.bench needs a CUDA GPU", file=sys.stderr)
        return 2
    from triton.testing import do_bench

    device = torch.device("cuda")
    rows = []
    for model in MODELS:
        for tokens in TOKENS:
            for name, torch_fn, triton_fn, nbytes in _cases(model, tokens, device):
                t_torch = do_bench(torch_fn, warmup=25, rep=100, return_mode="median")
                t_triton = do_bench(triton_fn, warmup=25, rep=100, return_mode="median")
                rows.append(dict(model=model, tokens=tokens, kernel=name, torch_us=1000 * t_torch,
                                 triton_us=1000 * t_triton, speedup=t_torch / t_triton,
                                 triton_gbps=nbytes / (t_triton * 1e-3) / 1e9))
    print(f"{'model':<5} {'tokens':>6} {'kernel':<22} {'torch us':>9} {'triton us':>9} {'x':>6} {'GB/s':>7}")
    for r in rows:
        print(f"{r['model']:<5} {r['tokens']:>6} {r['kernel']:<22} {r['torch_us']:>9.1f} "
              f"{r['triton_us']:>9.1f} {r['speedup']:>6.2f} {r['triton_gbps']:>7.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
