"""The one frozen configuration object, and the single source of every default (the command
line in prelude.app.cli and the scheduler's settings derive from it). Imports nothing heavy:
`--help` and flag errors must be instant."""
from __future__ import annotations

import re
from dataclasses import dataclass

from prelude.contract.kv_events import KVEventsConfig

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


# The values each enumerated flag takes (the command line offers the same lists).
CHOICES: dict[str, tuple[str | None, ...]] = {
    "dtype": ("auto", "bfloat16", "float16", "float32"),
    "quantization": ("none", "int8"),
    "device": ("auto", "cpu", "cuda"),
    "tokenizer_backend": ("auto", "fasttoken", "hf"),
    "executor": ("model", "null"),
    "scheduling_policy": ("fcfs", "priority", "sjf", "edf"),
    "log_level": ("debug", "info", "warning", "error", "critical"),
    "log_format": ("text", "json"),
    "pooling": (None, "last", "mean", "cls"),
    "generation_config": ("auto", "vllm"),
    "http_server": ("uvicorn", "hypercorn"),
}


# vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN: set to 1 (or true), a --max-model-len past the model's
# max_position_embeddings is served instead of refused (positions the model never saw in training).
ALLOW_LONG_MAX_MODEL_LEN_ENV = "PRELUDE_ALLOW_LONG_MAX_MODEL_LEN"


class ConfigError(ValueError):
    """A flag has an invalid value; the message names the flag."""


@dataclass(frozen=True, slots=True)
class Config:
    model: str | None = None  # None: the embedded demo model
    served_model_name: str | None = None
    served_model_aliases: tuple[str, ...] = ()  # more names clients may send; answers say served_model_name
    host: str = "127.0.0.1"
    port: int = 8000
    uds: str | None = None  # a Unix domain socket path, served instead of host:port
    api_key: str | None = None
    # Origins a browser page may call the API from (vLLM's --allowed-origins; "*" for any). None
    # by default, unlike vLLM's "*": a loopback sidecar open to every page its host's browser loads.
    allowed_origins: tuple[str, ...] = ()
    backlog: int = 2048
    # uvicorn (with httptools): the least server CPU per request (bench.serving.http_servers);
    # hypercorn for deployments that already depend on it.
    http_server: str = "uvicorn"
    log_level: str = "info"
    log_format: str = "text"
    disable_log_requests: bool = False
    dtype: str = "auto"
    quantization: str = "none"  # int8: per-output-channel int8 weights, quantized at load (CPU)
    device: str = "auto"
    max_model_len: int | None = None
    allow_long_max_model_len: bool = False  # from ALLOW_LONG_MAX_MODEL_LEN_ENV, as in vLLM
    tokenizer_backend: str = "auto"
    tokenizer_workers: int = 2
    cpu_threads: int | None = None  # None: torch's default, one per core
    block_size: int = 16
    num_kv_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    kv_cache_memory: int | None = None
    enable_prefix_caching: bool = True
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    scheduling_policy: str = "edf"  # see docs/design/scheduling.md: why edf
    max_queued_requests: int | None = None  # None: 4 x max_num_seqs
    max_queued_tokens: int | None = None  # None: 4 x the KV pool's tokens
    default_deadline_ms: int | None = None
    shed_late_requests: bool = False
    shutdown_timeout: float = 30.0
    # Seconds an idle keep-alive connection stays open. Longer than any client pool keeps one
    # (httpx and the OpenAI client 5 s, aiohttp 15 s, Go and reqwest 90 s), so the client always
    # closes first: with both at 5 s, a request sent on a connection the server was closing
    # failed with a connection error, never reaching the server.
    keep_alive_timeout: float = 120.0
    disable_oneshot: bool = False
    multi_item_scoring: bool = True
    layer_preemption: bool = True
    executor: str = "model"
    enforce_eager: bool = False
    max_logprobs: int = 20
    max_request_bytes: int = 32 * 2**20
    pooling: str | None = None
    # vLLM's: auto takes generation_config.json's sampling fields as request defaults; vllm
    # ignores them (temperature 1, no top-k / top-p / min-p cut, no repetition penalty).
    generation_config: str = "auto"
    seed: int = 0
    kv_events_config: KVEventsConfig | None = None  # None: no KV-cache events

    def __post_init__(self) -> None:
        positive = ("port", "backlog", "tokenizer_workers", "cpu_threads", "block_size", "max_num_seqs",
                    "max_num_batched_tokens", "max_request_bytes", "num_kv_blocks", "max_model_len",
                    "kv_cache_memory", "max_queued_requests", "max_queued_tokens", "default_deadline_ms")
        for name in positive:
            value = getattr(self, name)
            if value is not None and value <= 0:  # None: unset optional flags
                raise ConfigError(f"--{name.replace('_', '-')} must be positive")
        # getaddrinfo takes a port past 65535 modulo 2**16 without a word: the server would
        # listen somewhere else than the banner (and the operator) say.
        if self.port > 65535:
            raise ConfigError("--port must be at most 65535")
        # An empty key turned authentication off without a word: `--api-key "$KEY"` with KEY
        # unset served everyone.
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError("--api-key must not be empty (leave the flag out for no authentication)")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError("--gpu-memory-utilization must be in (0, 1]")
        if self.shutdown_timeout < 0:
            raise ConfigError("--shutdown-timeout must be >= 0")
        if not self.keep_alive_timeout > 0:
            raise ConfigError("--keep-alive-timeout must be positive")
        if self.max_logprobs < 0:
            raise ConfigError("--max-logprobs must be >= 0")
        if self.seed < 0:  # numpy's generators take none: a traceback at startup
            raise ConfigError("--seed must be >= 0")
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                shown = ", ".join(str(a) for a in allowed if a is not None)
                raise ConfigError(f"--{name.replace('_', '-')} must be one of: {shown}")

    @property
    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        return self.model.rstrip("/") if self.model else "prelude-demo"
