"""--api-key: bearer auth on every API route; /health (and /metrics) stay open."""
from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from prelude.contract.config import Config
from tests.server.harness import ServerThread


@pytest.fixture(scope="module")
def secured(demo_model):
    with ServerThread(Config(model=str(demo_model), api_key="s3cret", num_kv_blocks=256)) as srv:
        yield srv


def test_missing_or_wrong_key_is_401(secured):
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "s3cret"},
                    {"authorization": "Basic s3cret"}, {"authorization": "Bearer"}):
        response = httpx.post(secured.base_url + "/v1/completions", json={"prompt": "hi"}, headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
        assert response.headers["www-authenticate"] == "Bearer"
    assert httpx.get(secured.base_url + "/v1/models").status_code == 401


def test_bearer_scheme_is_case_insensitive(secured):
    for scheme in ("bearer", "BEARER", "Bearer"):
        response = httpx.get(secured.base_url + "/v1/models", headers={"authorization": f"{scheme} s3cret"})
        assert response.status_code == 200, scheme


def test_open_routes_are_the_documented_ones(secured):
    from prelude.app.cli import build_parser

    for path in ("/health", "/ping", "/ready", "/version", "/metrics"):
        assert httpx.get(secured.base_url + path).status_code == 200, path
    api_key_help = next(a.help for a in build_parser()._actions if "--api-key" in a.option_strings)
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    for path in ("/health", "/ping", "/ready", "/version", "/metrics"):
        assert path in api_key_help and f"`{path}`" in readme


def test_right_key_works_with_the_openai_client(secured):
    with openai.OpenAI(base_url=secured.base_url + "/v1", api_key="s3cret", max_retries=0) as client:
        out = client.completions.create(model=secured.served.name, prompt="hi", max_tokens=2, temperature=0)
        assert out.usage.completion_tokens == 2
    with openai.OpenAI(base_url=secured.base_url + "/v1", api_key="nope", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError):
            client.models.list()
