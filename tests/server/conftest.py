from __future__ import annotations

import pytest

from prelude.contract.config import Config
from tests.server.harness import ServerThread


@pytest.fixture(scope="package")
def server(demo_model):
    """The demo model behind a real server; small KV blocks so short prompts share prefixes."""
    with ServerThread(Config(model=str(demo_model), block_size=4, max_model_len=512,
                             num_kv_blocks=1024, max_request_bytes=64 * 1024)) as srv:
        yield srv


@pytest.fixture(scope="package")
def client(server):
    import openai

    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0) as c:
        yield c
