"""Kernel tests run on CUDA when there is one, else through Triton's CPU interpreter; without
triton (CI) every test here skips with the reason."""
from __future__ import annotations

import pytest
import torch

from tests.conftest import HAS_TRITON

ON_CUDA = torch.cuda.is_available()

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
