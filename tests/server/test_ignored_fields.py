"""Unknown request fields are ignored, as vLLM does, and named in one debug log line per
request; a request whose every field is known logs no such line, and nothing is logged at info."""
from __future__ import annotations

import logging

import httpx

SERVING_LOG = "prelude.server.serving"


def _ignored_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == SERVING_LOG and "ignored fields" in r.getMessage()]


def test_unknown_fields_are_ignored_with_one_debug_line(server, caplog):
    known = {"model": server.served.name, "prompt": "Hello", "max_tokens": 2, "temperature": 0}
    with caplog.at_level(logging.DEBUG, logger=SERVING_LOG):
        plain = httpx.post(server.base_url + "/v1/completions", json=known)
        assert plain.status_code == 200 and _ignored_lines(caplog) == []
        odd = httpx.post(server.base_url + "/v1/completions",
                         json={**known, "frobnicate": True, "guided_whatever": {"x": 1}})
        embedded = httpx.post(server.base_url + "/v1/embeddings", json={"input": "hi", "colour": "blue"})
    assert odd.status_code == 200 and embedded.status_code == 200
    assert odd.json()["choices"][0]["text"] == plain.json()["choices"][0]["text"]  # ignored, truly
    lines = _ignored_lines(caplog)
    assert lines == ["POST /v1/completions: ignored fields frobnicate, guided_whatever (unknown to this endpoint)",
                     "POST /v1/embeddings: ignored fields colour (unknown to this endpoint)"]
    assert all(r.levelno == logging.DEBUG for r in caplog.records if r.name == SERVING_LOG)


def test_no_debug_line_above_debug(server, caplog):
    with caplog.at_level(logging.INFO, logger=SERVING_LOG):
        response = httpx.post(server.base_url + "/v1/embeddings", json={"input": "hi", "colour": "blue"})
    assert response.status_code == 200 and _ignored_lines(caplog) == []
