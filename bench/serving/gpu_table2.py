"""One device call's serving benchmark: random-weight Qwen3-0.6B and Qwen3-4B checkpoints with
the real configs, the Prelude server started on each (startup = time until /health answers
200), and the paper's workloads driven through /v1/completions with exact token-id prompts:

  0.6B  128 in / 1 out   c=1       100 requests
  0.6B  128 in / 32 out  c=4       400 requests
  4B    512 in / 1 out   c=1..96   sweep

Prints one table and writes $OUT/gpu_table2.json (OUT defaults to ./bench-results) plus each
server's log. The HTTP driver is a minimal self-contained httpx client (streaming, so TTFT is
measured at the first token). Each workload starts with unmeasured warm-up requests so lazily
captured CUDA graphs are in place before timing.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SIZES = {  # the published Qwen3 configs, less what they share (COMMON)
    "0.6B": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16),
    "4B": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32),
    # Not in the table: a smoke test of this script on a CPU machine (--models tiny).
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=2),
}
COMMON = dict(
    architectures=["Qwen3ForCausalLM"], model_type="qwen3", num_key_value_heads=8, head_dim=128,
    vocab_size=151936, tie_word_embeddings=True, rope_theta=1000000.0, max_position_embeddings=40960,
    rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False, torch_dtype="bfloat16",
    bos_token_id=151643, eos_token_id=151645,
)
SWEEP = (1, 2, 4, 8, 16, 32, 64, 96)


def write_checkpoint(target: Path, size: str, tokenizer: Path | None, seed: int = 0) -> Path:
    """Random bf16 weights (std 0.02, norms at 1) under the HF names, config.json, tokenizer."""
    import torch
    from safetensors.torch import save_file

    config = dict(COMMON, **SIZES[size])
    target.mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device).manual_seed(seed)
    h, inter, hd = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd
    rand = lambda *shape: (torch.randn(*shape, generator=gen, device=device) * 0.02).to(torch.bfloat16).cpu()
    ones = lambda n: torch.ones(n, dtype=torch.bfloat16)
    tensors = {"model.embed_tokens.weight": rand(config["vocab_size"], h), "model.norm.weight": ones(h)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": ones(h), p + "post_attention_layernorm.weight": ones(h),
            p + "self_attn.q_proj.weight": rand(q, h), p + "self_attn.k_proj.weight": rand(kv, h),
            p + "self_attn.v_proj.weight": rand(kv, h), p + "self_attn.o_proj.weight": rand(h, q),
            p + "self_attn.q_norm.weight": ones(hd), p + "self_attn.k_norm.weight": ones(hd),
            p + "mlp.gate_proj.weight": rand(inter, h), p + "mlp.up_proj.weight": rand(inter, h),
            p + "mlp.down_proj.weight": rand(h, inter),
        })
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    (target / "config.json").write_text(json.dumps(config, indent=1))
    source = tokenizer if tokenizer is not None and (tokenizer / "tokenizer.json").is_file() else None
    if source is None:  # the demo tokenizer: outputs are then not Qwen3 text, timings still are
        from prelude.demo import build_demo_model

        source = Path(tempfile.mkdtemp()) / "demo"
        build_demo_model(source)
        print(f"[{size}] no tokenizer at {tokenizer}: using the demo tokenizer", flush=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (source / name).is_file():
            shutil.copy(source / name, target / name)
    return target


class Server:
    """`python -m prelude` in a subprocess; startup is the time until /health answers 200."""

    def __init__(self, model: Path, log: Path, extra: list[str]):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        self.log = open(log, "w")
        cmd = [sys.executable, "-m", "prelude", "--model", str(model), "--port", str(self.port),
               "--served-model-name", "bench", *extra]
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=REPO)

    def wait_healthy(self, timeout: float) -> float:
        import httpx

        while time.perf_counter() - self.started < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; see {self.log.name}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return time.perf_counter() - self.started
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"no /health 200 within {timeout}s; see {self.log.name}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _one(client, prompt: list[int], max_tokens: int) -> dict:
    body = {"model": "bench", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}
    start = time.perf_counter()
    ttft = None
    async with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            return {"error": f"{response.status_code} {(await response.aread())[:200]!r}"}
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            if ttft is None:
                ttft = time.perf_counter() - start
            if '"error"' in line:  # a failed step ends the stream with an error event
                return {"error": line[6:206]}
    end = time.perf_counter() - start
    return {"ttft": ttft if ttft is not None else end, "e2e": end}


async def drive(url: str, prompts: list[list[int]], max_tokens: int, concurrency: int) -> dict:
    """Closed loop: `concurrency` clients, each sending its next request when the last ends."""
    import httpx

    queue = list(reversed(prompts))
    results: list[dict] = []
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        async def worker():
            while queue:
                results.append(await _one(client, queue.pop(), max_tokens))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        duration = time.perf_counter() - start
    errors = [r["error"] for r in results if "error" in r]
    ok = [r for r in results if "error" not in r]
    pct = lambda xs, q: 1000 * statistics.quantiles(xs, n=100)[q - 1] if len(xs) > 1 else 1000 * xs[0]
    ttft, e2e = [r["ttft"] for r in ok], [r["e2e"] for r in ok]
    summary = dict(requests=len(results), errors=len(errors), first_error=errors[0] if errors else None,
                   concurrency=concurrency, duration_s=duration, req_per_s=len(ok) / duration,
                   out_tok_per_s=len(ok) * max_tokens / duration)
    if ok:
        summary.update(ttft_p50_ms=pct(ttft, 50), ttft_p99_ms=pct(ttft, 99), e2e_p50_ms=pct(e2e, 50),
                       e2e_p99_ms=pct(e2e, 99))
        if max_tokens > 1:
            summary["tpot_ms"] = 1000 * statistics.mean((r["e2e"] - r["ttft"]) / (max_tokens - 1) for r in ok)
    return summary


def _prompts(n: int, length: int, seed: int, vocab: int) -> list[list[int]]:
    rng = random.Random(seed)  # ordinary ids: past the bytes, below Qwen3's special tokens
    low = min(1000, vocab // 4)
    return [[rng.randrange(low, min(150000, vocab)) for _ in range(length)] for _ in range(n)]


def run_model(size: str, workloads: list[tuple[int, int, int, int]], args, out: Path) -> dict:
    from tokenizers import Tokenizer

    model = write_checkpoint(args.workdir / f"qwen3-{size}", size, args.tokenizer)
    vocab = Tokenizer.from_file(str(model / "tokenizer.json")).get_vocab_size()
    extra = ["--max-num-seqs", str(max(128, max(c for _, _, c, _ in workloads)))] + args.server_args
    server = Server(model, out / f"server-{size}.log", extra)
    try:
        record = {"model": size, "startup_s": server.wait_healthy(args.startup_timeout), "runs": []}
        print(f"[{size}] healthy after {record['startup_s']:.1f}s", flush=True)
        for i, (prompt_len, max_tokens, concurrency, requests) in enumerate(workloads):
            asyncio.run(drive(server.url, _prompts(2 * concurrency, prompt_len, 10_000 + i, vocab), max_tokens, concurrency))
            summary = asyncio.run(drive(server.url, _prompts(requests, prompt_len, i, vocab), max_tokens, concurrency))
            summary.update(prompt_len=prompt_len, max_tokens=max_tokens)
            record["runs"].append(summary)
            print(f"[{size}] {prompt_len}in/{max_tokens}out c={concurrency}: {summary['req_per_s']:.1f} req/s",
                  flush=True)
        return record
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", type=Path, default=REPO / "shared" / "tokenizers" / "qwen3",
                        help="folder with the Qwen3 tokenizer.json (else the demo tokenizer)")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "prelude-bench")
    parser.add_argument("--models", default="0.6B,4B")
    parser.add_argument("--sweep", default=",".join(map(str, SWEEP)), help="4B concurrency levels")
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--server-args", default="", help="extra server flags, e.g. '--enforce-eager'")
    args = parser.parse_args(argv)
    args.server_args = args.server_args.split()
    out = Path(os.environ.get("OUT", "bench-results"))
    out.mkdir(parents=True, exist_ok=True)
    plan = {
        "0.6B": [(128, 1, 1, 100), (128, 32, 4, 400)],
        "4B": [(512, 1, c, max(32, 4 * c)) for c in map(int, args.sweep.split(","))],
        "tiny": [(128, 1, 1, 6), (128, 8, 2, 6)],
    }
    records = []
    for size in args.models.split(","):
        try:
            records.append(run_model(size, plan[size], args, out))
        except Exception as exc:  # one model failing must not lose the other's numbers
            print(f"[{size}] FAILED: {exc!r}", flush=True)
            records.append({"model": size, "error": repr(exc)})
        (out / "gpu_table2.json").write_text(json.dumps(records, indent=1))
    print(f"\n{'model':<5} {'startup s':>9} {'in/out':>7} {'c':>3} {'n':>4} {'req/s':>7} {'tok/s':>7} "
          f"{'TTFT p50':>9} {'TTFT p99':>9} {'TPOT ms':>8} {'err':>4}")
    for rec in records:
        for run in rec.get("runs", []):
            print(f"{rec['model']:<5} {rec['startup_s']:>9.1f} {run['prompt_len']:>3}/{run['max_tokens']:<3} "
                  f"{run['concurrency']:>3} {run['requests']:>4} {run['req_per_s']:>7.1f} "
                  f"{run['out_tok_per_s']:>7.0f} {run.get('ttft_p50_ms', float('nan')):>9.1f} "
                  f"{run.get('ttft_p99_ms', float('nan')):>9.1f} {run.get('tpot_ms', float('nan')):>8.2f} "
                  f"{run['errors']:>4}")
        if "error" in rec:
            print(f"{rec['model']:<5} error: {rec['error']}")
    return 0 if all("error" not in r for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
