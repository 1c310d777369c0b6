"""The benchmark operations, timed the same way for each library (median µs of repeated runs)."""
from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from bench.tokenizer import textgen

ROWS = [
    ("encode 50 chars", "µs/call"),
    ("encode 500 chars", "µs/call"),
    ("encode 8K chars", "µs/call"),
    ("encode 200K chars", "µs/call"),
    ("decode 1,245 tokens", "µs/call"),
    ("stream decode", "µs/token"),
    ("batch encode b=64 x 500", "µs/batch"),
    ("batch encode b=1024 x 500", "µs/batch"),
    ("4 threads encode 500", "µs/text"),
    ("4 threads batch 64 x 500", "µs/text"),
    ("load cold", "ms"),
    ("load warm", "ms"),
]
ENCODE_ROWS = {r for r, _ in ROWS if r.startswith("encode")}


@dataclass
class Library:
    """One library's implementation of each operation (None where it has none)."""

    name: str
    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    batch: Callable[[list[str]], object]
    stream: Callable[[list[int]], int] | None  # decodes ids one by one, returns chars emitted


def median_us(fn: Callable[[], object], budget_s: float, min_reps: int = 5, max_reps: int = 2000) -> float:
    fn()  # warm caches and lazy state
    samples: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(samples) < min_reps or (time.perf_counter() < deadline and len(samples) < max_reps):
        start = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - start) / 1000)
    return statistics.median(samples)


def _rotating(encode: Callable[[str], object], inputs: list[str]) -> Callable[[], object]:
    following = itertools.cycle(inputs).__next__  # no index arithmetic inside the timed call
    return lambda: encode(following())


# Unique texts per encode row: enough that no timing call sees a text twice.
ENCODE_INPUTS = {50: 3000, 500: 1500, 8000: 250, 200_000: 12}


def run_rows(lib: Library, decode_ids: list[int], budget_s: float) -> dict[str, float]:
    out: dict[str, float] = {}
    for chars, row in ((50, "encode 50 chars"), (500, "encode 500 chars"), (8000, "encode 8K chars"),
                       (200_000, "encode 200K chars")):
        # Words from real papers, a new text on every call (paper_texts): a word cache sees real
        # English, never the same text twice; every library gets the same texts as new objects.
        inputs = textgen.paper_texts(ENCODE_INPUTS[chars] + 1, chars, seed=chars)
        out[row] = median_us(_rotating(lib.encode, inputs), budget_s, max_reps=len(inputs) - 1)
    out["decode 1,245 tokens"] = median_us(lambda: lib.decode(decode_ids), budget_s)
    if lib.stream is not None:
        out["stream decode"] = median_us(lambda: lib.stream(decode_ids), budget_s) / len(decode_ids)
    for size, row in ((64, "batch encode b=64 x 500"), (1024, "batch encode b=1024 x 500")):
        batches = [textgen.paper_texts(size, 500, seed=size * 1000 + k) for k in range(6)]
        out[row] = median_us(_rotating(lib.batch, batches), budget_s, min_reps=5, max_reps=5)
    out["4 threads encode 500"] = concurrent_us_per_text(lib.encode, budget_s)
    out["4 threads batch 64 x 500"] = concurrent_us_per_text(lib.batch, budget_s, batched=True)
    return out


def load_ms(load: Callable[[str], object], path: str, reps: int = 3) -> float:
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        load(path)
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def concurrent_us_per_text(encode: Callable, budget_s: float, threads: int = 4,
                           per_thread: int = 64, batched: bool = False) -> float:
    """Wall time per text with `threads` Python threads each encoding `per_thread` texts, one
    call per text or (batched) one batch call per thread."""
    work = [textgen.paper_texts(per_thread, 500, seed=1000 + t) for t in range(threads)]

    def one(texts: list[str]) -> None:
        if batched:
            encode(texts)
            return
        for text in texts:
            encode(text)

    with ThreadPoolExecutor(threads) as pool:
        def round_trip() -> None:
            list(pool.map(one, work))

        return median_us(round_trip, budget_s, min_reps=3) / (threads * per_thread)
