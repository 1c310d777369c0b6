"""Serving benchmarks: the load generator (`python -m bench.serving`), the startup timer
(`python -m bench.serving.startup`) and the CPU-cost probe (`python -m bench.serving.cpu_cost`)."""
