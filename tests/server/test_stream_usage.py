"""vLLM's stream_options.continuous_usage_stats through the real `openai` client: with
include_usage, every chunk carries its choice's usage so far (prompt tokens, the tokens that
choice has generated, their sum), and the final usage chunk still closes the stream. The
option was ignored, and a client that meters a stream chunk by chunk read no usage."""
from __future__ import annotations

import httpx
import pytest

CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def _usage(chunk) -> tuple[int, int, int]:
    return chunk.usage.prompt_tokens, chunk.usage.completion_tokens, chunk.usage.total_tokens


@pytest.mark.parametrize("prompt", ["Count these tokens", ["Count these", "tokens, two prompts"]])
def test_completion_chunks_carry_their_choices_usage(server, client, model, prompt):
    chunks = list(client.completions.create(model=model, prompt=prompt, max_tokens=5, n=2, seed=3, stream=True,
                                            stream_options=CONTINUOUS, extra_body={"ignore_eos": True}))
    whole = client.completions.create(model=model, prompt=prompt, max_tokens=5, n=2, seed=3,
                                      extra_body={"ignore_eos": True})
    *tokens, final = chunks
    assert final.choices == [] and _usage(final) == (whole.usage.prompt_tokens, 5 * len(whole.choices),
                                                     whole.usage.total_tokens)
    prompts = [prompt] if isinstance(prompt, str) else prompt
    prompt_lens = [httpx.post(server.base_url + "/tokenize", json={"prompt": p}).json()["count"] for p in prompts]
    generated = [0] * len(whole.choices)
    for chunk in tokens:
        (choice,) = chunk.choices
        generated[choice.index] += 1
        want = prompt_lens[choice.index // 2]
        assert _usage(chunk) == (want, generated[choice.index], want + generated[choice.index])
    assert generated == [5] * len(whole.choices)


def test_chat_chunks_carry_usage_from_the_role_chunk_on(client, model):
    messages = [{"role": "user", "content": "Count these tokens"}]
    chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=4, temperature=0,
                                                 stream=True, stream_options=CONTINUOUS,
                                                 extra_body={"ignore_eos": True}))
    prompt = client.chat.completions.create(model=model, messages=messages, max_tokens=1).usage.prompt_tokens
    role, *tokens, final = chunks
    assert role.choices[0].delta.role == "assistant" and _usage(role) == (prompt, 0, prompt)
    assert [_usage(c) for c in tokens] == [(prompt, k, prompt + k) for k in range(1, 5)]
    assert final.choices == [] and _usage(final) == (prompt, 4, prompt + 4)


def test_without_continuous_stats_only_the_last_chunk_has_usage(client, model):
    chunks = list(client.completions.create(model=model, prompt="Usage", max_tokens=3, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert [c.usage is not None for c in chunks] == [False] * (len(chunks) - 1) + [True]
