"""The in-process equality gate the benchmark runs before timing anything, and the check that
tiktoken's ids equal HF's on the inputs it is timed on."""
from __future__ import annotations

from bench.tokenizer import textgen
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
