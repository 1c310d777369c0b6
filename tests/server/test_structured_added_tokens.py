"""Structured outputs on a tokenizer whose added tokens are text (Phi-2's runs of spaces): a
constraint holding such text is served, spelled as the tokenizer spells it. Only the texts of
tokens the grammar library holds apart from text (special ones, Qwen3's <think>) are refused."""
from __future__ import annotations

import json
import re

import httpx
import pytest

from prelude.contract.config import Config
from tests.checkpoints import make_model_dir
from tests.data import tokenizer_dir
from tests.server.harness import ServerThread


@pytest.fixture(scope="module")
def phi2(tmp_path_factory):
    path = make_model_dir(tmp_path_factory.mktemp("llama-phi2-tok"), "llama", tokenizer_dir("phi2"))
    with ServerThread(Config(model=str(path), num_kv_blocks=256, max_model_len=256)) as srv:
        yield srv


@pytest.mark.parametrize("field, value, pattern", [
    ("guided_regex", "def f\\(\\):\n    return [0-9]", r"def f\(\):\n    return [0-9]"),
    ("guided_choice", ["New  York", "Paris"], r"New  York|Paris"),
    ("guided_json", {"type": "object", "properties": {"city": {"enum": ["New  York", "Paris"]}},
                     "required": ["city"], "additionalProperties": False, "description": "two  spaces"}, None),
])
def test_text_of_added_text_tokens_is_served(phi2, field, value, pattern):
    """Each was a 400 ("holds '  ', the text of one of the tokenizer's added tokens")."""
    response = httpx.post(phi2.base_url + "/v1/completions", json={
        "prompt": "x", field: value, "max_tokens": 200, "temperature": 1.0, "seed": 1})
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    if pattern is None:
        assert json.loads(choice["text"])["city"] in ("New  York", "Paris")
    else:
        assert re.fullmatch(pattern, choice["text"]), choice["text"]
