"""vLLM's chat `continue_final_message` through the real `openai` client over loopback HTTP: the
prompt stops right after the final message's content, so the answer carries on inside that
message (a judge's prefilled "The verdict is"), instead of the template closing it and opening
a new one. And text parts join with newlines, and null content is "", as vLLM renders them."""
from __future__ import annotations

import httpx
import pytest

PREFILL = [{"role": "user", "content": "Is the sky green?"}, {"role": "assistant", "content": "The answer is"}]
CONTINUE = {"continue_final_message": True, "add_generation_prompt": False}


@pytest.fixture(scope="module")
def model(server):
    return server.served.name


def _ids(server, body: dict) -> list[int]:
    response = httpx.post(server.base_url + "/tokenize", json=body)
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


def _text(server, ids: list[int]) -> str:
    return httpx.post(server.base_url + "/detokenize", json={"tokens": ids}).json()["prompt"]


def test_the_prompt_ends_with_the_final_message_content(server):
    closed = _text(server, _ids(server, {"messages": PREFILL, "add_generation_prompt": False}))
    # What the template writes after the content (end of turn) is there without the flag only.
    assert not closed.endswith("The answer is")
    expected = closed[:closed.rindex("The answer is") + len("The answer is")]
    continued = _ids(server, {"messages": PREFILL, **CONTINUE})
    assert continued == _ids(server, {"prompt": expected, "add_special_tokens": False})


def test_the_answer_carries_on_the_final_message(server, client, model):
    continued = _ids(server, {"messages": PREFILL, **CONTINUE})
    want = client.completions.create(model=model, prompt=continued, max_tokens=5, temperature=0).choices[0].text
    answer = client.chat.completions.create(model=model, messages=PREFILL, max_tokens=5, temperature=0,
                                            extra_body=CONTINUE)
    assert (answer.choices[0].message.role, answer.choices[0].message.content) == ("assistant", want)
    echoed = client.chat.completions.create(model=model, messages=PREFILL, max_tokens=5, temperature=0,
                                            extra_body={**CONTINUE, "echo": True})
    assert echoed.choices[0].message.content == "The answer is" + want


def test_text_parts_join_with_newlines(server):
    parts = [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    assert _ids(server, {"messages": [{"role": "user", "content": parts}]}) == \
        _ids(server, {"messages": [{"role": "user", "content": "first\nsecond"}]})


def test_null_or_absent_content_renders_as_empty(server, client, model):
    """An assistant turn replayed with tool_calls has "content": null (the openai SDK's own
    message dump); vLLM renders it, and a missing content, as "". The demo's ChatML template
    concatenates the content, as many checkpoints' do, and failed on None (a 400)."""
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    replay = [{"role": "user", "content": "Look it up"}, {"role": "assistant", "content": None, "tool_calls": [call]},
              {"role": "tool", "content": "42", "tool_call_id": "call_1"}]
    empty = [replay[0], {**replay[1], "content": ""}, replay[2]]
    assert _ids(server, {"messages": replay}) == _ids(server, {"messages": empty})
    answer = client.chat.completions.create(model=model, messages=replay, max_tokens=2, temperature=0)
    assert answer.choices[0].finish_reason == "length"
    assert _ids(server, {"messages": [{"role": "user"}]}) == _ids(server, {"messages": [{"role": "user", "content": ""}]})
