"""The context's limits as vLLM's OpenAI server words them: what an unset or null max_tokens
means, and which field a refusal names."""
from __future__ import annotations

import httpx
import pytest


def test_null_max_tokens_asks_for_all_the_context_leaves(server, client):
    """Absent, a completion's max_tokens is OpenAI's 16; null (what the SDK sends for None) is
    the rest of the context, as in vLLM: it was read as 16, and near the limit refused for 16
    tokens nobody asked for."""
    room, model = 10, server.served.name
    prompt = [7] * (server.config.max_model_len - room)
    out = client.completions.create(model=model, prompt=prompt, max_tokens=None, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == room and out.choices[0].finish_reason == "length"
    out = client.completions.create(model=model, prompt=[7] * 8, temperature=0, extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 16


def test_a_prompt_filling_the_context_is_refused_for_the_context(server):
    """Not for the KV cache (whose size the message gave), so clients that match "maximum
    context length" (LiteLLM's ContextWindowExceededError) or OpenAI's code know what happened."""
    limit = server.config.max_model_len
    # A long chat cut to exactly the context (vLLM's truncate_prompt_tokens keeps its last tokens).
    messages = [{"role": "user", "content": "a b c d " * limit}]
    for path, body in (("/v1/chat/completions", {"messages": messages, "truncate_prompt_tokens": limit}),
                       ("/v1/completions", {"prompt": [7] * limit, "max_tokens": None})):
        response = httpx.post(server.base_url + path, json=body)
        assert response.status_code == 400
        error = response.json()["error"]
        assert "maximum context length" in error["message"] and "KV" not in error["message"], error
        assert error["param"] == ("messages" if "chat" in path else "prompt")
        # OpenAI's code for it, which LangChain maps to its ContextOverflowError (it was null)
        assert error["code"] == "context_length_exceeded"


@pytest.mark.parametrize("path, body", [
    ("/v1/embeddings", {"input": "hello"}),
    ("/v1/completions", {"prompt": "hello", "max_tokens": 1}),
    ("/v1/rerank", {"query": "q", "documents": ["d"]}),
])
def test_truncation_past_the_context_is_refused_whatever_the_prompt(server, path, body):
    """vLLM refuses it; here a short prompt passed, a long one was refused for its length
    (named `input`) and rerank cut at the context without a word."""
    limit = server.config.max_model_len + 1
    response = httpx.post(server.base_url + path, json={**body, "truncate_prompt_tokens": limit})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "truncate_prompt_tokens"
