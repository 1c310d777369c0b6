"""Benchmarks, run from the repository root as modules: `python -m bench.serving`, `python -m bench.tokenizer`."""
