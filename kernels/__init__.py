"""Triton kernels for the CUDA executor; each has a torch reference it is tested against.

The modules that define kernels import triton at import time, so import them only after
`available()` says yes. `TRITON_INTERPRET=1` (set before the first import) runs them on the CPU
through Triton's interpreter, which is how the tests check them on machines without a GPU.
"""
from __future__ import annotations

import importlib.util
import os


def available(device_type: str = "cuda") -> bool:
    """Triton is importable and can run on tensors of `device_type`: CUDA tensors on a GPU,
    CPU tensors only through the interpreter."""
    if importlib.util.find_spec("triton") is None:
        return False
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    if device_type == "cpu":
        return interpreting
    import torch

    return interpreting or torch.cuda.is_available()
