"""In-process embedding throughput of one library, the way an application calls it: no HTTP, one
call at a time (concurrency 1), each call encoding one request's texts.

- sentence-transformers: SentenceTransformer(dir, device="cpu").encode(texts, batch_size=32,
  normalize_embeddings=True);
- fastembed: the ONNX export of the same model registered as a custom model (mean pooling,
  normalized) and loaded from its directory; TextEmbedding.embed(texts, batch_size=32).

Run as a script by the interpreter that has the library (`bench.serving.encoders` runs fastembed
from its own venv): it imports nothing but the standard library and that library, and prints one
JSON object on stdout. Texts come from a JSON file the bench writes, so every peer encodes the
same strings. CPU is the process's own (every thread), memory from /proc/self/status."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable

BATCH_SIZE = 32  # the libraries' own batch: a 32-text request is one forward
FASTEMBED_NAME = "bench/all-minilm-l6-v2-onnx"  # the custom model's registry name (nothing is fetched by it)


def status_bytes(field: str) -> int | None:
    """VmRSS (resident now) or VmHWM (resident at its peak) of this process."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def machine_busy_seconds() -> float | None:
    """Every core's busy CPU seconds since boot (/proc/stat: all but idle and iowait)."""
    try:
        ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def max_seq_length(model: Path) -> int:
    """The longest input sentence-transformers embeds (sentence_bert_config.json), tokens."""
    return int(json.loads((model / "sentence_bert_config.json").read_text())["max_seq_length"])


def load(lib: str, model: Path) -> tuple[Callable[[list[str]], list], str]:
    """An encode function returning one vector per text, and the library's version."""
    if lib == "sentence-transformers":
        import sentence_transformers
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(str(model), device="cpu")
        return (lambda texts: list(st.encode(texts, batch_size=BATCH_SIZE, normalize_embeddings=True)),
                sentence_transformers.__version__)
    if lib == "fastembed":
        import fastembed
        import onnxruntime
        from fastembed import TextEmbedding
        from fastembed.common.model_description import ModelSource, PoolingType

        dim = json.loads((model / "config.json").read_text())["hidden_size"]
        # The source is never reached: specific_model_path points at the exported directory.
        TextEmbedding.add_custom_model(model=FASTEMBED_NAME, pooling=PoolingType.MEAN, normalization=True,
                                       sources=ModelSource(hf=FASTEMBED_NAME), dim=dim, model_file="model.onnx")
        fe = TextEmbedding(model_name=FASTEMBED_NAME, specific_model_path=str(model), local_files_only=True)
        # fastembed truncates at tokenizer_config.json's max_length (128 for all-MiniLM-L6-v2),
        # sentence-transformers (and every server here) at the model's max_seq_length (256): the
        # same cut for all, or fastembed would embed a passage's first 128 tokens only.
        fe.model.tokenizer.enable_truncation(max_length=max_seq_length(model))
        return (lambda texts: list(fe.embed(texts, batch_size=BATCH_SIZE)),
                f"{fastembed.__version__} (onnxruntime {onnxruntime.__version__})")
    raise SystemExit(f"unknown library {lib!r}")


def wait_quiet(busy_cores: float, limit_s: float = 60.0) -> None:
    """Returns after a second in which other processes used under `busy_cores`, or after `limit_s`."""
    began = time.perf_counter()
    while time.perf_counter() - began < limit_s:
        busy0, own0 = machine_busy_seconds(), cpu_seconds()
        time.sleep(1.0)
        busy1, own1 = machine_busy_seconds(), cpu_seconds()
        if busy0 is None or busy1 is None or busy1 - busy0 - (own1 - own0) < busy_cores:
            return


def run_cell(encode: Callable[[list[str]], list], pool: list[str], batch: int, args: argparse.Namespace) -> dict:
    """The cell measured again while other processes used more than --busy-cores, at most
    --retries more times; the least shared attempt is kept."""
    best = measure_cell(encode, pool, batch, args)
    attempts = 1
    while best["other_cores"] is not None and best["other_cores"] > args.busy_cores and attempts <= args.retries:
        attempts += 1
        wait_quiet(args.busy_cores)
        again = measure_cell(encode, pool, batch, args)
        if again["other_cores"] is not None and again["other_cores"] < best["other_cores"]:
            best = again
    return {**best, "attempts": attempts}


def measure_cell(encode: Callable[[list[str]], list], pool: list[str], batch: int,
                 args: argparse.Namespace) -> dict:
    """Warmup calls, then calls until `duration` has passed and at least `min_calls` ran. Texts
    are taken from the pool in order (warmup first), as the servers' requests are."""
    cursor = 0

    def next_texts() -> list[str]:
        nonlocal cursor
        texts = [pool[(cursor + i) % len(pool)] for i in range(batch)]
        cursor += batch
        return texts

    for _ in range(args.warmup):
        encode(next_texts())
    latencies: list[float] = []
    busy0, cpu0, began = machine_busy_seconds(), cpu_seconds(), time.perf_counter()
    while (time.perf_counter() - began < args.duration or len(latencies) < args.min_calls) \
            and len(latencies) < args.max_calls:
        texts = next_texts()
        start = time.perf_counter()
        vectors = encode(texts)
        latencies.append(time.perf_counter() - start)
        if len(vectors) != batch:
            raise SystemExit(f"{batch} texts gave {len(vectors)} vectors")
    seconds, cpu, busy1 = time.perf_counter() - began, cpu_seconds() - cpu0, machine_busy_seconds()
    other = None if busy0 is None or busy1 is None else max(0.0, busy1 - busy0 - cpu) / seconds
    return {"batch": batch, "calls": len(latencies), "texts": len(latencies) * batch, "seconds": seconds,
            "cpu_s": cpu, "other_cores": other, "latencies": latencies}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="encoder_inproc.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", choices=["sentence-transformers", "fastembed"], required=True)
    p.add_argument("--model", type=Path, required=True, help="model directory (fastembed: the ONNX export)")
    p.add_argument("--texts", type=Path, required=True, help="JSON file of the bench's texts")
    p.add_argument("--cells", default="", help="comma list of KIND:BATCH, e.g. short:1,passage:32")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per cell (at least)")
    p.add_argument("--min-calls", type=int, default=5)
    p.add_argument("--max-calls", type=int, default=100000)
    p.add_argument("--warmup", type=int, default=2, help="unmeasured calls before each cell")
    p.add_argument("--busy-cores", type=float, default=0.15, help="other processes' CPU that makes a cell run again")
    p.add_argument("--retries", type=int, default=2, help="times a cell may run again")
    p.add_argument("--spawned-at", type=float, help="time.time() when the parent spawned this process")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    texts = json.loads(args.texts.read_text())
    encode, version = load(args.lib, args.model)
    probe = [[float(x) for x in v] for v in encode(texts["probe"])]  # also the first call: startup ends here
    ready = time.time()
    out: dict = {"lib": args.lib, "version": version, "rss_ready": status_bytes("VmRSS"),
                 "startup_s": None if args.spawned_at is None else ready - args.spawned_at,
                 "probe": probe, "cells": []}
    for spec in filter(None, args.cells.split(",")):
        kind, batch = spec.split(":")
        print(f"{args.lib} embed {kind} b={batch}", file=sys.stderr, flush=True)
        out["cells"].append({"kind": kind, **run_cell(encode, texts[kind], int(batch), args)})
    out["rss_after"] = status_bytes("VmRSS")
    out["peak_rss"] = status_bytes("VmHWM")
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
