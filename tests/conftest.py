"""Session fixtures shared by the test packages."""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None
# Triton kernels on CPU tensors: only through the interpreter, i.e. on machines without a GPU.
TRITON_ON_CPU = HAS_TRITON and not torch.cuda.is_available()
if TRITON_ON_CPU:
    # Triton kernels then run through the CPU interpreter. Must be set before the first
    # kernels.* import: triton.jit reads it when the kernels are defined.
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def demo_model(tmp_path_factory):
    """The embedded demo model (tiny Qwen3 + trained BPE tokenizer), built once per session."""
    from prelude.demo import build_demo_model

    path = tmp_path_factory.mktemp("demo-model")
    build_demo_model(path)
    return path
