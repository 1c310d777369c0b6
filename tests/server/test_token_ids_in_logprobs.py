"""vLLM's return_tokens_as_token_ids through the real `openai` client: logprobs entries name
their tokens "token_id:<id>" instead of by text, in completions (whole, streamed, echoed) and
chat (whole, streamed), top alternatives included. RL and eval clients send it to recover the
exact ids (a byte-level piece's text is U+FFFD, and ids can share a text); it was ignored, and
their "token_id:" parsing failed on plain text."""
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
