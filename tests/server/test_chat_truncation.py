"""vLLM's truncate_prompt_tokens on chat, as on completions, through the real `openai` client:
the rendered prompt's last k tokens are the prompt. It was ignored: usage counted every token,
and a chat longer than the context was a 400 that the field exists to avoid."""
from __future__ import annotations

import httpx
import pytest


@pytest.fixture(scope="module")
def model(server):
    return server.served.name


def test_truncate_prompt_tokens_keeps_the_rendered_prompts_last_tokens(server, client, model):
    messages = [{"role": "user", "content": "word " * 600}]
    ids = httpx.post(server.base_url + "/tokenize", json={"messages": messages}).json()["tokens"]
    assert len(ids) > server.served.max_model_len
    want = client.completions.create(model=model, prompt=ids[-20:], max_tokens=3, temperature=0)
    answer = client.chat.completions.create(model=model, messages=messages, max_tokens=3, temperature=0,
                                            extra_body={"truncate_prompt_tokens": 20})
    assert answer.usage.prompt_tokens == 20
    assert answer.choices[0].message.content == want.choices[0].text
    over = httpx.post(server.base_url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 3})
    assert over.status_code == 400  # without the field, as before
