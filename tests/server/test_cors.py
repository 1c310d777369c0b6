"""--allowed-origins: a browser page on an allowed origin may call the API (CORS), vLLM's flag."""
from __future__ import annotations

import httpx
import pytest

from prelude.app.cli import parse_args
from prelude.contract.config import Config
from tests.server.harness import ServerThread

ORIGIN = "https://app.example"


@pytest.fixture(scope="module")
def cors_server(demo_model):
    config = Config(model=str(demo_model), api_key="k", num_kv_blocks=256,
                    allowed_origins=parse_args(["--allowed-origins", f'["{ORIGIN}"]']).allowed_origins)
    with ServerThread(config) as srv:
        yield srv


def test_preflight_is_answered_before_the_key_is_checked(cors_server):
    response = httpx.options(cors_server.base_url + "/v1/chat/completions", headers={
        "origin": ORIGIN, "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type"})
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in response.headers["access-control-allow-methods"]
    assert "authorization" in response.headers["access-control-allow-headers"].lower()


def test_answers_and_refusals_carry_the_origin(cors_server):
    """The page reads the answer, and the 401 too (else the browser shows a bare network error)."""
    body = {"prompt": "hi", "max_tokens": 1}
    ok = httpx.post(cors_server.base_url + "/v1/completions", json=body,
                    headers={"origin": ORIGIN, "authorization": "Bearer k"})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == ORIGIN
    refused = httpx.post(cors_server.base_url + "/v1/completions", json=body, headers={"origin": ORIGIN})
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == ORIGIN


def test_other_origins_get_no_grant(cors_server):
    response = httpx.options(cors_server.base_url + "/v1/completions", headers={
        "origin": "https://evil.example", "access-control-request-method": "POST"})
    assert response.status_code == 400
    assert "access-control-allow-origin" not in response.headers


def test_no_cors_by_default(server):
    response = httpx.get(server.base_url + "/v1/models", headers={"origin": ORIGIN})
    assert "access-control-allow-origin" not in response.headers


def test_flag_forms():
    assert parse_args(["--allowed-origins", '["*"]']).allowed_origins == ("*",)
    assert parse_args(["--allowed-origins", ORIGIN]).allowed_origins == (ORIGIN,)
    with pytest.raises(SystemExit):
        parse_args(["--allowed-origins", "[]"])
