"""A model's generation_config.json sampling fields are the defaults of requests that leave them
out, as in vLLM (--generation-config auto, its default): Qwen3's file asks for temperature 0.6,
top_p 0.95 and top_k 20, and vLLM samples a request without them that way, where this server
sampled at temperature 1 with no cut. `--generation-config vllm` keeps the neutral defaults, and
a field the request sets wins either way."""
from __future__ import annotations

import json
from dataclasses import replace

import httpx
import pytest

from prelude.contract.config import Config
from prelude.model.config import sampling_defaults
from tests.checkpoints import edited_copy
from tests.server.harness import ServerThread

PROMPT = "Once upon a time"
# top_k 1 makes the model's default greedy: a request without sampling fields answers the
# greedy text every time, which a temperature-1 default (the demo's flat random weights) does not.
GENERATION_CONFIG = {"eos_token_id": [2, 0], "top_k": 1, "temperature": 0.7, "top_p": 1.0}


@pytest.fixture(scope="module")
def model_dir(demo_model, tmp_path_factory):
    return edited_copy(demo_model, tmp_path_factory.mktemp("generation-config"), "generation_config.json",
                       lambda config: config.update(GENERATION_CONFIG))


def _texts(server, **fields) -> list[str]:
    response = httpx.post(server.base_url + "/v1/completions",
                          json={"prompt": PROMPT, "max_tokens": 8, "n": 4, "ignore_eos": True, **fields})
    assert response.status_code == 200, response.text
    return [c["text"] for c in response.json()["choices"]]


def test_the_models_defaults_apply_to_fields_a_request_leaves_out(model_dir):
    config = Config(model=str(model_dir), block_size=4, max_model_len=256, num_kv_blocks=256)
    with ServerThread(config) as server:
        greedy = _texts(server, temperature=0)
        assert _texts(server) == greedy  # top_k 1 from the file
        assert _texts(server, seed=5) == greedy
        # The request's own top_k wins: it samples at the file's temperature.
        assert _texts(server, top_k=0, seed=5) != greedy
    with ServerThread(replace(config, generation_config="vllm")) as server:
        assert _texts(server, seed=5) != greedy


def test_fields_at_transformers_defaults_are_not_defaults(model_dir):
    """vLLM reads the file's difference from transformers' GenerationConfig defaults, so a
    top_k of 50 or a temperature of 1.0 written out sets nothing."""
    assert sampling_defaults(model_dir) == {"top_k": 1, "temperature": 0.7}
    (model_dir / "generation_config.json").write_text(json.dumps({"top_k": 50, "temperature": 1.0, "min_p": 0.1}))
    try:
        assert sampling_defaults(model_dir) == {"min_p": 0.1}
    finally:
        (model_dir / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG))


def test_max_new_tokens_caps_every_requests_max_tokens(demo_model, tmp_path):
    """vLLM reads generation_config.json's max_new_tokens as the most any request generates (its
    default max_tokens, and the cap of a larger one); it was ignored: a chat request without
    max_tokens generated to the end of the context."""
    capped = edited_copy(demo_model, tmp_path, "generation_config.json", lambda c: c.update(max_new_tokens=7))
    assert sampling_defaults(capped) == {"max_tokens": 7}
    with ServerThread(Config(model=str(capped), block_size=4, max_model_len=256, num_kv_blocks=256)) as server:
        chat = httpx.post(server.base_url + "/v1/chat/completions",
                          json={"messages": [{"role": "user", "content": "hi"}], "ignore_eos": True}).json()
        assert chat["usage"]["completion_tokens"] == 7
        for max_tokens, generated in ((50, 7), (3, 3)):
            out = httpx.post(server.base_url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": max_tokens,
                                                                        "ignore_eos": True}).json()
            assert out["usage"]["completion_tokens"] == generated
