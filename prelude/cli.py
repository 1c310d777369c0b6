"""The command line: vLLM's flag names where they exist, every default read from Config."""
from __future__ import annotations

import argparse
from dataclasses import fields

from prelude.contract.config import Config, ConfigError, parse_bytes


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m prelude", description="Prelude inference server")
    d = Config()
    p.add_argument("--model", default=None,
                   help="local HF-format model directory (default: the embedded demo model)")
    p.add_argument("--served-model-name", default=None, help="model name clients use (default: --model)")
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on every route except /health, /ping, "
                        "/ready, /version and /metrics, which stay open as in vLLM")
    p.add_argument("--backlog", type=int, default=d.backlog,
                   help="pending connections the listening socket queues (default %(default)s)")
    p.add_argument("--log-level", default=d.log_level)
    p.add_argument("--dtype", default=d.dtype, help="auto (bf16 on CUDA, fp32 on CPU) | bfloat16 | float16 | float32")
    p.add_argument("--device", default=d.device, help="auto | cpu | cuda")
    p.add_argument("--max-model-len", type=int, default=None, help="prompt + output token limit")
    p.add_argument("--tokenizer-backend", default=d.tokenizer_backend, help="auto (fasttoken) | fasttoken | hf")
    p.add_argument("--tokenizer-workers", type=int, default=d.tokenizer_workers,
                   help="threads tokenizing long prompts off the event loop")
    p.add_argument("--block-size", type=int, default=d.block_size, help="tokens per KV block")
    p.add_argument("--num-kv-blocks", type=int, default=None, help="KV blocks (overrides the memory budget)")
    p.add_argument("--gpu-memory-utilization", type=float, default=d.gpu_memory_utilization)
    p.add_argument("--kv-cache-memory", type=parse_bytes, default=None,
                   help="KV cache bytes on CPU (default 512MiB), e.g. 2GiB")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs, help="running Decode sequences")
    p.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens,
                   help="tokens per step")
    p.add_argument("--scheduling-policy", default=d.scheduling_policy,
                   help="waiting-queue order: fcfs | priority (the request's `priority`, lower first) | "
                        "sjf (shortest uncached prompt first, with aging) | edf (earliest deadline "
                        "first by slack; sjf for requests without one)")
    p.add_argument("--max-queued-requests", type=int, default=None,
                   help="waiting requests beyond which new ones get 503 + Retry-After (default 4 x --max-num-seqs)")
    p.add_argument("--max-queued-tokens", type=int, default=None,
                   help="waiting prompt tokens beyond which new requests get 503 (default 4 x the KV pool)")
    p.add_argument("--default-deadline-ms", type=int, default=None,
                   help="deadline for the first token / OneShot result of requests that set none "
                        "(X-Deadline-Ms header or deadline_ms field); default none")
    p.add_argument("--shed-late-requests", action="store_true",
                   help="answer a waiting request that can no longer meet its deadline with 503 "
                        "deadline_exceeded at once instead of running it")
    p.add_argument("--shutdown-timeout", type=float, default=d.shutdown_timeout,
                   help="seconds in-flight requests get to finish after SIGTERM/SIGINT")
    p.add_argument("--multi-item-scoring", action=argparse.BooleanOptionalAction, default=d.multi_item_scoring,
                   help="/v1/score with several short items runs them in one masked forward "
                        "(per request: \"multi_item\": true/false)")
    p.add_argument("--disable-oneshot", action="store_true",
                   help="ablation: run OneShot work through the Decode lifecycle")
    p.add_argument("--executor", default=d.executor, help="model | null (no model work; for benchmarks)")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--max-logprobs", type=int, default=d.max_logprobs)
    p.add_argument("--max-request-bytes", type=parse_bytes, default=d.max_request_bytes,
                   help="largest accepted request body")
    p.add_argument("--pooling", default=None, help="embedding pooling: last | mean | cls (default: per model)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of unseeded sampling")
    return p


def parse_args(argv: list[str] | None = None) -> Config:
    parser = build_parser()
    args = parser.parse_args(argv)
    names = {f.name for f in fields(Config)}
    try:
        return Config(**{k: v for k, v in vars(args).items() if k in names})
    except ConfigError as exc:
        parser.error(str(exc))
