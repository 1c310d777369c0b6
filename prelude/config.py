"""One frozen configuration object built from the command line (vLLM's flag names where they
exist). Imports nothing heavy: `--help` and flag errors must be instant."""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, fields

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_bytes(text: str) -> int:
    """'4GiB', '512MB', '1e9'-free integers: a byte count."""
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"not a byte size: {text!r} (examples: 2147483648, 2GiB, 512MB)")
    unit = (m.group(2) or "").lower().rstrip("b")
    return int(float(m.group(1)) * _UNITS[unit])


class ConfigError(ValueError):
    """A flag has an invalid value; the message names the flag."""


@dataclass(frozen=True, slots=True)
class Config:
    model: str | None = None  # None: the embedded demo model
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    backlog: int = 2048
    log_level: str = "info"
    dtype: str = "auto"
    device: str = "auto"
    max_model_len: int | None = None
    tokenizer_backend: str = "auto"
    tokenizer_workers: int = 2
    block_size: int = 16
    num_kv_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    kv_cache_memory: int | None = None
    enable_prefix_caching: bool = True
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    scheduling_policy: str = "fcfs"
    disable_oneshot: bool = False
    executor: str = "model"
    enforce_eager: bool = False
    max_logprobs: int = 20
    max_request_bytes: int = 32 * 2**20
    pooling: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        positive = ("port", "backlog", "tokenizer_workers", "block_size", "max_num_seqs",
                    "max_num_batched_tokens", "max_request_bytes", "num_kv_blocks", "max_model_len",
                    "kv_cache_memory")
        for name in positive:
            value = getattr(self, name)
            if value is not None and value <= 0:  # None: unset optional flags
                raise ConfigError(f"--{name.replace('_', '-')} must be positive")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError("--gpu-memory-utilization must be in (0, 1]")
        if self.max_logprobs < 0:
            raise ConfigError("--max-logprobs must be >= 0")
        choices = {
            "dtype": ("auto", "bfloat16", "float16", "float32"),
            "device": ("auto", "cpu", "cuda"),
            "tokenizer_backend": ("auto", "fasttoken", "hf"),
            "executor": ("model", "null"),
            "scheduling_policy": ("fcfs",),
            "log_level": ("debug", "info", "warning", "error", "critical"),
            "pooling": (None, "last", "mean", "cls"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                shown = ", ".join(str(a) for a in allowed if a is not None)
                raise ConfigError(f"--{name.replace('_', '-')} must be one of: {shown}")

    @property
    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        return self.model.rstrip("/") if self.model else "prelude-demo"


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
                        "/version and /metrics, which stay open as in vLLM")
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
    p.add_argument("--scheduling-policy", default=d.scheduling_policy)
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
