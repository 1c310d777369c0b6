from __future__ import annotations

from dataclasses import replace

import pytest

from prelude.contract.config import CHOICES, Config
from tests.server.harness import ServerThread

# What the HTTP server underneath decides (drain, disconnects, refusals, keep-alive, pipelining,
# UDS) is tested on every --http-server option.
HTTP_SERVERS = CHOICES["http_server"]


def _server_config(demo_model) -> Config:
    """The demo model; small KV blocks so short prompts share prefixes."""
    return Config(model=str(demo_model), block_size=4, max_model_len=512, num_kv_blocks=1024,
                  max_request_bytes=64 * 1024)


@pytest.fixture(scope="package")
def server(demo_model):
    """The demo model behind a real server (the default --http-server)."""
    with ServerThread(_server_config(demo_model)) as srv:
        yield srv


@pytest.fixture(scope="package", params=HTTP_SERVERS)
def each_server(request, server, demo_model):
    """`server`, and the same server on every other --http-server in turn."""
    if request.param == server.config.http_server:
        yield server
        return
    with ServerThread(replace(_server_config(demo_model), http_server=request.param)) as srv:
        yield srv


@pytest.fixture(params=HTTP_SERVERS)
def http_server(request) -> str:
    """Each --http-server option in turn, for tests that start their own server."""
    return request.param


@pytest.fixture(scope="package")
def client(server):
    import openai

    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0) as c:
        yield c
