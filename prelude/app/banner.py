"""The startup banner: one short block saying what was loaded and where it listens, logged once
the engine is warm (so "ready in" is the time a client can be served)."""
from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class Banner:
    version: str
    model_path: str
    model_name: str  # what clients send as `model`
    architecture: str
    dtype: str
    device: str
    compute_threads: int  # torch's intra-op threads (--cpu-threads)
    tokenizer: str  # fasttoken, or hf with the reason it serves
    kv_capacity_tokens: int
    kv_blocks: int
    block_size: int
    prefix_caching: bool
    listen_url: str
    seconds_to_ready: float
    # Where startup went, in order: (phase, seconds), from the process's start to ready.
    startup: tuple[tuple[str, float], ...] = ()

    def fields(self) -> dict:
        """The JSON log line's keys (--log-format json)."""
        return {"event": "ready", **asdict(self)}

    def __str__(self) -> str:
        return "\n".join([
            f"Prelude {self.version} ready in {self.seconds_to_ready:.2f}s",
            f"  model      {self.model_path} ({self.architecture}), served as {self.model_name}",
            f"  dtype      {self.dtype} on {self.device}, {self.compute_threads} compute thread"
            f"{'' if self.compute_threads == 1 else 's'}",
            f"  tokenizer  {self.tokenizer}",
            f"  KV cache   {self.kv_capacity_tokens:,} tokens ({self.kv_blocks:,} blocks of {self.block_size}), "
            f"prefix caching {'on' if self.prefix_caching else 'off'}",
            f"  listening  {self.listen_url}",
            f"  startup    {', '.join(f'{phase} {seconds:.2f}s' for phase, seconds in self.startup)}",
        ])


def tokenizer_text(backend: str, fallback_reason: str | None, requested: str) -> str:
    """fasttoken; hf (--tokenizer-backend hf); or hf with the reason fasttoken could not serve."""
    if backend != "hf":
        return backend
    if requested == "hf":
        return "hf (--tokenizer-backend hf)"
    return f"hf (fallback: {fallback_reason})" if fallback_reason else "hf"


def process_age() -> float | None:
    """Seconds since this process started (the interpreter's own start and imports included), on
    Linux; None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/proc/self/stat") as stat:
            started_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
