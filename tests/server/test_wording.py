"""Error wording and response fields that tell users the truth: a prompt that cannot fit is
blamed on the prompt (or messages), a structured choice's top logprobs list only the choices,
and prompt_logprobs appear only when asked for."""
from __future__ import annotations

import httpx
import pytest

from prelude.contract.config import Config
from tests.server.harness import ServerThread

LONG = " ".join(["the model token request"] * 200)  # about 800 tokens on the demo tokenizer


def post(srv, path: str, **body) -> httpx.Response:
    return httpx.post(srv.base_url + path, json=body, timeout=60)


@pytest.fixture(scope="module")
def small_kv(demo_model):
    """Context 512 tokens, KV cache 256 tokens: a Decode prompt can fit the context, not the cache."""
    with ServerThread(Config(model=str(demo_model), block_size=4, num_kv_blocks=64, max_model_len=512)) as srv:
        yield srv


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": LONG, "max_tokens": 16}, "prompt"),
    ("/v1/completions", {"prompt": LONG}, "prompt"),
    ("/v1/completions", {"prompt": [5] * 512, "max_tokens": 1}, "prompt"),  # fills the context: no room
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}], "max_tokens": 16}, "messages"),
    ("/v1/completions", {"prompt": [5] * 300, "max_tokens": 16}, "prompt"),  # alone fills the KV cache
    ("/v1/completions", {"prompt": [5] * 500, "max_tokens": 100}, "max_tokens"),  # together too long
    ("/v1/completions", {"prompt": [5] * 200, "max_tokens": 100}, "max_tokens"),  # together beyond the cache
])
def test_a_prompt_that_cannot_fit_is_blamed_on_the_prompt(small_kv, path, body, param):
    response = post(small_kv, path, **body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.json()


def test_guided_choice_top_logprobs_list_only_the_choices(server):
    choices = [" yes", " no"]
    out = post(server, "/v1/completions", prompt="Is it safe? Answer:", max_tokens=1, guided_choice=choices,
               logprobs=5, temperature=0).json()
    logprobs = out["choices"][0]["logprobs"]
    assert logprobs["tokens"][0] in choices
    assert set(logprobs["top_logprobs"][0]) == set(choices)  # both, and nothing else, though 5 were asked
    chat = post(server, "/v1/chat/completions", messages=[{"role": "user", "content": "Is it safe?"}],
                guided_choice=choices, logprobs=True, top_logprobs=5, temperature=0).json()
    (entry,) = chat["choices"][0]["logprobs"]["content"]
    assert entry["token"] in choices and {t["token"] for t in entry["top_logprobs"]} == set(choices)
    # Ordered best first, and the chosen token (greedy) is the best of them.
    top = entry["top_logprobs"]
    assert top[0]["logprob"] >= top[1]["logprob"] and top[0]["token"] == entry["token"]


def test_echo_with_logprobs_returns_no_unrequested_prompt_logprobs(server):
    prompt = "The answer is"
    out = post(server, "/v1/completions", prompt=prompt, max_tokens=0, echo=True, logprobs=2).json()
    choice = out["choices"][0]
    assert "prompt_logprobs" not in choice
    assert choice["text"] == prompt and choice["logprobs"]["token_logprobs"][0] is None
    assert all(lp is not None for lp in choice["logprobs"]["token_logprobs"][1:])
    asked = post(server, "/v1/completions", prompt=prompt, max_tokens=0, echo=True, logprobs=2,
                 prompt_logprobs=1).json()
    assert asked["choices"][0]["prompt_logprobs"][0] is None and len(asked["choices"][0]["prompt_logprobs"]) > 1
