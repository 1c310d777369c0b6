"""Triton kernels for the CUDA executor; each has a torch reference it is tested against."""
