"""Forced tool calls through the real `openai` client, as vLLM serves them without a tool-call
parser: a named function's arguments generated under its parameters schema, "required" a list of
calls, both answered as tool_calls (whole and streamed); "auto", also as the default where tools
are given, is refused, as vLLM refuses it without --enable-auto-tool-choice."""
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
    ({}, "tool_choice"),  # OpenAI's default where tools are given is "auto" (served as "none", calls lost in text)
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": {"type": "function"}}, "tool_choice"),
    ({"tool_choice": "required", "tools": []}, "tool_choice"),
    ({"tool_choice": "required", "tools": [{"type": "function"}]}, "tools[0]"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": [{"type": "function"}]}, "tools[0]"),  # checked without a tool_choice too, as vLLM checks them
])
def test_tool_choices_it_cannot_honour_are_refused(server, extra, param):
    body = {"messages": MESSAGES, "tools": TOOLS, **extra}
    response = httpx.post(server.base_url + "/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_none_renders_the_tools_and_answers_text(client, server):
    answer = _create(client, server.served.name, tool_choice="none", max_tokens=3)
    assert answer.choices[0].message.tool_calls is None and answer.choices[0].message.content is not None
    # an explicit null is "none", as in vLLM (only a tool_choice left out defaults to "auto")
    body = {"messages": MESSAGES, "tools": TOOLS, "tool_choice": None, "max_tokens": 3}
    assert httpx.post(server.base_url + "/v1/chat/completions", json=body).status_code == 200


def test_the_sdks_refusal_for_auto_is_a_bad_request(client, server):
    with pytest.raises(openai.BadRequestError):
        _create(client, server.served.name, tool_choice="auto")


NESTED = {"type": "object", "properties": {"address": {"$ref": "#/$defs/Address"}, "adult": {"type": "boolean"}},
          "required": ["address", "adult"], "additionalProperties": False,
          "$defs": {"Address": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
                                "required": ["city"], "additionalProperties": False}}}


def _required(server, tools, **extra) -> dict:
    response = httpx.post(server.base_url + "/v1/chat/completions", json={
        "messages": MESSAGES, "tools": tools, "tool_choice": "required", "max_tokens": 80, "temperature": 1.0,
        "seed": 1, **extra})
    assert response.status_code == 200, response.text
    return response.json()


def _strict(arguments: str):
    def refuse(constant):
        raise AssertionError(f"{constant} is no JSON")
    return json.loads(arguments, parse_constant=refuse)


def test_required_takes_a_pydantic_models_definitions(server):
    """openai.pydantic_function_tool of a model with a nested one writes $defs at the schema's root;
    under "required" the schema moved into a list, where '#/$defs/...' pointed at nothing (400)."""
    tool = {"type": "function", "function": {"name": "person", "parameters": NESTED}}
    answer = _required(server, [tool], n=3)
    calls = [c for choice in answer["choices"] for c in choice["message"]["tool_calls"]]
    assert calls
    for call in calls:
        jsonschema.validate(_strict(call["function"]["arguments"]), NESTED)


def test_parallel_tool_calls_false_makes_one_call(server):
    """Ignored before: "required" answered three calls to an agent that runs one a turn."""
    calls = [len(choice["message"]["tool_calls"]) for seed in (1, 2)  # each drew two calls in one choice
             for choice in _required(server, TOOLS, n=4, seed=seed, parallel_tool_calls=False)["choices"]]
    assert max(calls) == 1


@pytest.mark.parametrize("parameters", [{}, True, {"properties": {"x": {"type": "integer"}}}])
def test_parameters_without_a_type_are_an_object(server, parameters):
    """OpenAI's parameters are an object's schema: {} or true let "true", "[]" or "Infinity"
    through, and properties without a type a string."""
    tool = {"type": "function", "function": {"name": "ping", "parameters": parameters}}
    for answer in (_required(server, [tool], n=4),
                   _required(server, [tool], n=4, tool_choice={"type": "function", "function": {"name": "ping"}})):
        for choice in answer["choices"]:
            for call in choice["message"]["tool_calls"] if choice["finish_reason"] != "length" else []:
                assert isinstance(_strict(call["function"]["arguments"]), dict)


def test_required_arguments_are_the_generated_text(server):
    """Each call's arguments as generated: parsed and written again, a number past a float's
    range came back as Infinity, which strict JSON parsers refuse."""
    tool = {"type": "function", "function": {"name": "measure", "parameters": {
        "type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"], "additionalProperties": False}}}
    for seed in range(6):
        for choice in _required(server, [tool], seed=seed)["choices"]:
            for call in choice["message"]["tool_calls"]:
                assert isinstance(_strict(call["function"]["arguments"])["x"], (int, float))


def test_a_required_answer_cut_by_a_stop_string_finishes_stop(server):
    """Not "tool_calls" with no calls: a client would look for calls that are not there."""
    for stream in (False, True):
        response = httpx.post(server.base_url + "/v1/chat/completions", json={
            "messages": MESSAGES, "tools": TOOLS, "tool_choice": "required", "stop": ["}"], "max_tokens": 80,
            "stream": stream})
        assert response.status_code == 200
        if stream:
            chunks = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
            finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]
        else:
            finish = response.json()["choices"][0]["finish_reason"]
            assert response.json()["choices"][0]["message"]["tool_calls"] == []
        assert finish == "stop"
