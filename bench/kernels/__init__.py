"""Micro-benchmarks of the CPU kernels and attention paths, without a server (most time one
kernel or one step in process; a few start a server to time a step inside it)."""
