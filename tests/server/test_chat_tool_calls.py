"""A replayed conversation's assistant tool calls reach the chat template as vLLM hands them
over: `function.arguments` parsed from the OpenAI wire format's JSON string into an object (an
absent or empty one is {}), and an empty `tool_calls` list dropped. Templates that write the
arguments with `| tojson` (Qwen2.5's, Llama 3.1's) otherwise render them as a quoted, escaped
string: a prompt the model was never trained on, unlike vLLM's. Null fields are left out, and
the request's `documents` reach the template, as vLLM hands them over."""
from __future__ import annotations


import httpx
import pytest

from tests.server.harness import rendered_chat, with_chat_template

# The tool-call part of Qwen2.5-Instruct's template, which writes the arguments with tojson.
TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "{% if message.tool_calls %}{% for tool_call in message.tool_calls %}"
    "{% if tool_call.function is defined %}{% set tool_call = tool_call.function %}{% endif %}"
    '<tool_call>{"name": "{{ tool_call.name }}", "arguments": {{ tool_call.arguments | tojson }}}</tool_call>'
    "{% endfor %}{% elif message.tool_calls is defined %}[no calls]{% endif %}<|im_end|>\n{% endfor %}"
    "{% for doc in documents | default([]) %}[doc {{ doc.title }}: {{ doc.text }}]{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tool_server(demo_model, tmp_path_factory):
    with with_chat_template(demo_model, tmp_path_factory.mktemp("tojson-template"), TEMPLATE) as srv:
        yield srv


def _rendered(server, messages: list, **extra) -> str:
    return rendered_chat(server, messages, add_generation_prompt=False, **extra)


def _replay(*calls: dict) -> list:
    return [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": list(calls)},
            {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}]


def _call(arguments) -> dict:
    return {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}


def test_tool_call_arguments_reach_the_template_as_an_object(tool_server):
    text = _rendered(tool_server, _replay(_call('{"city": "Paris"}')))
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in text
    # A client that already sends an object gets the same prompt.
    assert text == _rendered(tool_server, _replay(_call({"city": "Paris"})))


@pytest.mark.parametrize("arguments", ["", None])
def test_absent_arguments_are_an_empty_object(tool_server, arguments):
    assert '"arguments": {}}' in _rendered(tool_server, _replay(_call(arguments)))


def test_an_empty_tool_calls_list_is_dropped(tool_server):
    assert "[no calls]" not in _rendered(tool_server, _replay())


def test_arguments_that_are_not_json_are_a_400(tool_server):
    response = httpx.post(tool_server.base_url + "/v1/chat/completions",
                          json={"messages": _replay(_call("{city: Paris")), "max_tokens": 1})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "messages[1].tool_calls[0].function.arguments"


def test_null_fields_are_left_out_as_vllm_leaves_them(tool_server):
    """Clients write "tool_calls": null on plain assistant turns; templates that test
    `'tool_calls' in message` (Llama 3.1's, DeepSeek-V3's) failed on it with a 400."""
    plain = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    nulls = [plain[0], {**plain[1], "tool_calls": None, "name": None}]
    assert "[no calls]" not in _rendered(tool_server, nulls)
    assert _rendered(tool_server, nulls) == _rendered(tool_server, plain)


def test_documents_reach_the_template(tool_server):
    """vLLM's chat `documents` (retrieval-augmented templates): they were dropped without a word."""
    messages = [{"role": "user", "content": "What colour is the sky?"}]
    text = _rendered(tool_server, messages, documents=[{"title": "Sky", "text": "The sky is green."}])
    assert "[doc Sky: The sky is green.]" in text
    response = httpx.post(tool_server.base_url + "/tokenize", json={"messages": messages, "documents": ["text"]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "documents"
