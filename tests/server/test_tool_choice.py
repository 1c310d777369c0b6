"""Forced tool calls through the real `openai` client, as vLLM serves them without a tool-call
parser: a named function's arguments generated under its parameters schema, "required" a list of
calls, both answered as tool_calls (whole and streamed); "auto" is refused, as vLLM refuses it
without --enable-auto-tool-choice."""
from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

WEATHER = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer",
           "minimum": 1, "maximum": 9}}, "required": ["city", "days"], "additionalProperties": False}
VERDICT = {"type": "object", "properties": {"winner": {"enum": ["A", "B"]}}, "required": ["winner"],
           "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "verdict", "description": "who won", "parameters": VERDICT}}]
MESSAGES = [{"role": "user", "content": "Which answer is better, A or B?"}]
SCHEMAS = {"get_weather": WEATHER, "verdict": VERDICT}


def _create(client, model, **kw):
    return client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS,
                                          **{"max_tokens": 60, "temperature": 0, **kw})


def test_a_named_function_is_called_with_arguments_its_schema_accepts(client, server):
    named = {"type": "function", "function": {"name": "verdict"}}
    answer = _create(client, server.served.name, tool_choice=named)
    message, choice = answer.choices[0].message, answer.choices[0]
    assert choice.finish_reason == "stop" and message.content == ""
    [call] = message.tool_calls
    assert call.type == "function" and call.function.name == "verdict" and call.id
    jsonschema.validate(json.loads(call.function.arguments), VERDICT)
    # Streamed: the id, type and name with the first arguments, then arguments as they come.
    chunks = list(_create(client, server.served.name, tool_choice=named, stream=True))
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].function.name == "verdict" and deltas[0].id and deltas[0].type == "function"
    assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
    assert not any(c.choices[0].delta.content for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_required_answers_with_calls_of_the_tools(client, server):
    answer = _create(client, server.served.name, tool_choice="required", temperature=1.0, seed=4, n=3)
    for choice in answer.choices:
        if choice.finish_reason == "length":  # a random model's list may go on past max_tokens
            continue
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
        for call in choice.message.tool_calls:
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    # Streamed: the calls whole in the last chunk (seed 1 ends its list within max_tokens on the demo model).
    streamed = list(_create(client, server.served.name, tool_choice="required", temperature=1.0, seed=1,
                            stream=True))
    whole = _create(client, server.served.name, tool_choice="required", temperature=1.0, seed=1)
    last = streamed[-1].choices[0]
    assert last.finish_reason == whole.choices[0].finish_reason == "tool_calls"
    got = [(d.function.name, d.function.arguments) for d in last.delta.tool_calls]
    assert got == [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]


@pytest.mark.parametrize("extra, param", [
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": {"type": "function"}}, "tool_choice"),
    ({"tool_choice": "required", "tools": []}, "tool_choice"),
    ({"tool_choice": "required", "tools": [{"type": "function"}]}, "tools[0]"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
])
def test_tool_choices_it_cannot_honour_are_refused(server, extra, param):
    body = {"messages": MESSAGES, "tools": TOOLS, **extra}
    response = httpx.post(server.base_url + "/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_none_renders_the_tools_and_answers_text(client, server):
    answer = _create(client, server.served.name, tool_choice="none", max_tokens=3)
    assert answer.choices[0].message.tool_calls is None and answer.choices[0].message.content is not None


def test_the_sdks_refusal_for_auto_is_a_bad_request(client, server):
    with pytest.raises(openai.BadRequestError):
        _create(client, server.served.name, tool_choice="auto")
