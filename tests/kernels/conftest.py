"""Kernel tests run on CUDA when there is one, else through Triton's CPU interpreter; without
triton (CI) every test here skips with the reason."""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None
ON_CUDA = torch.cuda.is_available()
if HAS_TRITON and not ON_CUDA:
    # Must be set before the first kernels.* import: triton.jit reads it at decoration time.
    os.environ.setdefault("TRITON_INTERPRET", "1")

SKIP_REASON = "triton is not installed: kernels run only on CUDA or under TRITON_INTERPRET=1"


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if ON_CUDA else "cpu")


def pytest_collection_modifyitems(config, items):
    if HAS_TRITON:
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if "tests/kernels" in str(item.fspath):
            item.add_marker(skip)
