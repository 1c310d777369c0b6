"""A real in-process server on the demo model, one per test module that asks for it."""
from __future__ import annotations

import pytest

from prelude.contract.config import Config
from tests.server.harness import ServerThread


@pytest.fixture(scope="module")
def server(demo_model):
    srv = ServerThread(Config(model=str(demo_model), max_model_len=512, num_kv_blocks=512)).start()
    yield srv
    srv.stop()
