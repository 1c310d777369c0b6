"""The in-process equality gate the benchmark runs before timing anything, and the check that
tiktoken's ids equal HF's on the inputs it is timed on."""
from __future__ import annotations

from collections.abc import Callable

from bench.tokenizer import textgen
from bench.tokenizer.measure import ENCODE_INPUTS
from bench.tokenizer.tiktoken_build import build as build_tiktoken
from bench.tokenizer.equality import check_text, corpus_for, load_pair, random_texts


def equality_problems(path: str, random_count: int) -> tuple[int, list[str]]:
    """(texts checked, differences) between fasttoken and HF for one tokenizer."""
    fast, hf, _ = load_pair(path)
    corpus = corpus_for(path)
    randoms = random_texts(path, random_count, seed=2024)
    problems = [p for text in corpus for p in check_text(path, text, stream=True)]
    problems += [p for text in randoms for p in check_text(path, text, stream=False)]
    bench_inputs = textgen.texts(16, 500, seed=500) + textgen.texts(64, 500, seed=64)
    # Every text the timed rows encode (measure.run_rows draws them with these seeds).
    for chars, count in ENCODE_INPUTS.items():
        bench_inputs += textgen.paper_texts(count + 1, chars, seed=chars)
    for size in (64, 1024):
        for k in range(6):
            bench_inputs += textgen.paper_texts(size, 500, seed=size * 1000 + k)
    bench_inputs += [t for k in range(4) for t in textgen.paper_texts(64, 500, seed=1000 + k)]
    if fast.encode_batch(bench_inputs) != hf.encode_batch(bench_inputs):
        problems.append("encode_batch differs on the benchmark inputs")
    return len(corpus) + len(randoms) + len(bench_inputs), problems


def tiktoken_agreement(path: str) -> str:
    """One line on whether tiktoken reproduces HF's ids (corpus and benchmark inputs)."""
    enc = build_tiktoken(path)
    if enc is None:
        return "no tiktoken equivalent (several Split regexes in sequence)"
    _, hf, _ = load_pair(path)
    corpus = corpus_for(path)
    differ = [t for t in corpus if enc.encode(t, allowed_special="all") != hf.encode(t, False)]
    bench_inputs = [textgen.text(n, seed=n) for n in (50, 500, 8000)] + textgen.texts(64, 500, seed=64)
    bench_differ = sum(enc.encode(t, allowed_special="all") != hf.encode(t, False) for t in bench_inputs)
    line = f"tiktoken ids == HF ids on {len(corpus) - len(differ)}/{len(corpus)} corpus texts"
    line += f" and {len(bench_inputs) - bench_differ}/{len(bench_inputs)} benchmark inputs"
    if differ:
        line += (f" (differs e.g. on {differ[0][:40]!r}; tiktoken has no normalizer, always tries the whole"
                 " pre-token as one token, and matches special tokens first-listed instead of longest)")
    return line


def contender_agreement(path: str, encode: Callable[[str], list[int]]) -> tuple[int, int]:
    """(equal, total): on how many corpus texts and benchmark inputs a contender's encode (with
    its defaults) gives HF's encode(text) ids."""
    _, hf, _ = load_pair(path)
    texts = corpus_for(path) + [t for n in (50, 500, 8000) for t in textgen.paper_texts(8, n, seed=n)]
    texts += textgen.paper_texts(2, 200_000, seed=200_000)
    equal = 0
    for text in texts:
        try:
            equal += list(encode(text)) == hf.encode(text, True)
        except Exception:  # noqa: BLE001 - a contender failing on an input counts as a difference
            pass
    return equal, len(texts)
