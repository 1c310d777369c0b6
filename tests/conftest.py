"""Session fixtures shared by the test packages."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def demo_model(tmp_path_factory):
    """The embedded demo model (tiny Qwen3 + trained BPE tokenizer), built once per session."""
    from prelude.demo import build_demo_model

    path = tmp_path_factory.mktemp("demo-model")
    build_demo_model(path)
    return path
