"""vLLM's token-id fields through the real `openai` client. return_tokens_as_token_ids: logprobs
entries name their tokens "token_id:<id>" instead of by text, in completions (whole, streamed,
echoed) and chat (whole, streamed), top alternatives included; RL and eval clients send it to
recover the exact ids (a byte-level piece's text is U+FFFD, and ids can share a text).
return_token_ids: prompt_token_ids and token_ids in the answer. Both were ignored."""
from __future__ import annotations

import httpx
import pytest

AS_IDS = {"return_tokens_as_token_ids": True}


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def _id(name: str) -> int:
    assert name.startswith("token_id:"), name
    return int(name.removeprefix("token_id:"))


def _texts(server, names: list[str]) -> list[str]:
    """The vocabulary text of each "token_id:<id>", what the entry says without the option."""
    return [httpx.post(server.base_url + "/detokenize", json={"tokens": [_id(n)]}).json()["prompt"] for n in names]


@pytest.mark.parametrize("echo", [False, True])
def test_completion_logprobs_name_token_ids(server, client, model, echo):
    kwargs = dict(model=model, prompt="Name the tokens", max_tokens=6, temperature=0, logprobs=2, echo=echo)
    plain = client.completions.create(**kwargs).choices[0].logprobs
    named = client.completions.create(**kwargs, extra_body=AS_IDS).choices[0].logprobs
    assert _texts(server, named.tokens) == plain.tokens
    # (approx: the second request reads the first's cached prefix, other float rounding)
    assert named.token_logprobs == pytest.approx(plain.token_logprobs, abs=1e-4)
    for names, texts in zip(named.top_logprobs, plain.top_logprobs):
        assert (names is None) == (texts is None)
        if names is not None:
            assert sorted(names.values()) == pytest.approx(sorted(texts.values()), abs=1e-4)
            assert all(_id(n) >= 0 for n in names)
    # Offsets count the names, as vLLM's do.
    assert named.text_offset == [sum(map(len, named.tokens[:i])) for i in range(len(named.tokens))]
    streamed = list(client.completions.create(**kwargs, stream=True, extra_body=AS_IDS))
    assert [t for c in streamed for t in c.choices[0].logprobs.tokens] == named.tokens


def test_chat_logprobs_name_token_ids(server, client, model):
    kwargs = dict(model=model, messages=[{"role": "user", "content": "Name the tokens"}], max_tokens=6,
                  temperature=0, logprobs=True, top_logprobs=2)
    plain = client.chat.completions.create(**kwargs).choices[0].logprobs.content
    named = client.chat.completions.create(**kwargs, extra_body=AS_IDS).choices[0].logprobs.content
    assert _texts(server, [e.token for e in named]) == [e.token for e in plain]
    assert [e.logprob for e in named] == pytest.approx([e.logprob for e in plain], abs=1e-4)
    assert all(e.bytes == list(e.token.encode()) for e in named)
    assert all(_id(t.token) >= 0 for e in named for t in e.top_logprobs)
    streamed = list(client.chat.completions.create(**kwargs, stream=True, extra_body=AS_IDS))
    assert [e.token for c in streamed if c.choices and c.choices[0].logprobs
            for e in c.choices[0].logprobs.content] == [e.token for e in named]


def _tokenized(server, **body) -> list[int]:
    return httpx.post(server.base_url + "/tokenize", json=body).json()["tokens"]


def _logprob_ids(names: list[str]) -> list[int]:
    return [_id(n) for n in names]


def test_completion_return_token_ids(server, client, model):
    """vLLM's return_token_ids: each choice carries its prompt's ids and its own output ids;
    streamed, the prompt's ids come once in a choice's first chunk and each chunk has its new
    ids. It was ignored, so clients reading choice.token_ids (agent RL stacks) found none."""
    prompts = ["Return the ids", "of two prompts"]
    kwargs = dict(model=model, prompt=prompts, max_tokens=5, n=2, seed=1, logprobs=0,
                  extra_body={"return_token_ids": True, **AS_IDS, "ignore_eos": True})
    whole = client.completions.create(**kwargs).model_dump()["choices"]
    for choice in whole:
        assert choice["prompt_token_ids"] == _tokenized(server, prompt=prompts[choice["index"] // 2])
        assert choice["token_ids"] == _logprob_ids(choice["logprobs"]["tokens"])
    firsts, streamed = {}, {c["index"]: [] for c in whole}
    for chunk in client.completions.create(**kwargs, stream=True):
        (choice,) = chunk.model_dump()["choices"]
        if choice.get("prompt_token_ids") is not None:
            assert choice["index"] not in firsts
            firsts[choice["index"]] = choice["prompt_token_ids"]
        streamed[choice["index"]] += choice["token_ids"]
    assert firsts == {c["index"]: c["prompt_token_ids"] for c in whole}
    assert streamed == {c["index"]: c["token_ids"] for c in whole}


def test_chat_return_token_ids(server, client, model):
    messages = [{"role": "user", "content": "Return the ids"}]
    kwargs = dict(model=model, messages=messages, max_tokens=5, temperature=0, logprobs=True,
                  extra_body={"return_token_ids": True, **AS_IDS, "ignore_eos": True})
    whole = client.chat.completions.create(**kwargs).model_dump()
    assert whole["prompt_token_ids"] == _tokenized(server, messages=messages)
    (choice,) = whole["choices"]
    assert choice["token_ids"] == _logprob_ids([e["token"] for e in choice["logprobs"]["content"]])
    chunks = [c.model_dump() for c in client.chat.completions.create(**kwargs, stream=True)]
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert [t for c in chunks[1:] for t in c["choices"][0]["token_ids"]] == choice["token_ids"]
