"""Benchmarks (run as modules, e.g. `python -m bench.tokenizer`)."""
