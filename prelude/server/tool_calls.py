"""Forced tool calls on chat, as vLLM serves them without a tool-call parser: a `tool_choice`
naming a function has the answer generated under that function's parameters schema, and one of
"required" under a schema of a non-empty list of calls (each a tool's name and its parameters);
the answer comes back as `tool_calls`. "auto" would need a parser that finds calls in free text:
refused, as vLLM refuses it without --enable-auto-tool-choice. Clients that force a call to get
a structured verdict (LangChain's with_structured_output, instructor's tools mode) get one."""
from __future__ import annotations

import json
import os
from typing import Any

from prelude.contract.record import record
from prelude.server.errors import bad_request
from prelude.server.protocol import Body
from prelude.structured.closing import DATA
from prelude.structured.compiler import Constraint

PARAM = "tool_choice"


@record
class ForcedTools:
    constraint: Constraint
    name: str | None  # the function named; None for "required" (the answer is a list of calls)


def forced_tools(body: Body) -> ForcedTools | None:
    """The request's forced tool call, or None (no tool_choice, or "none")."""
    # Checked whatever tool_choice says, as vLLM checks them: a malformed tool was rendered.
    functions = _functions(body.list("tools") or [])
    # OpenAI's default where tools are given and tool_choice is left out: "auto" (served as
    # "none", the calls the model wrote stayed in the text). A null one is "none", as in vLLM.
    given = PARAM in body.data
    choice = body.data[PARAM] if body.has(PARAM) else (None if given else "auto" if functions else None)
    if choice is None or choice == "none":
        return None
    if choice == "auto":
        implied = "" if given else " (the default where 'tools' are given)"
        raise bad_request(f"'tool_choice' \"auto\"{implied} is not supported: this server does not parse tool "
                          "calls out of free text (vLLM needs --enable-auto-tool-choice for it); name a function, "
                          "send \"required\", or \"none\" for an answer in text", PARAM)
    if not functions:
        raise bad_request("'tool_choice' needs the functions among 'tools'", PARAM)
    if choice == "required":
        return ForcedTools(Constraint.json_schema(_calls_schema(functions, body.data.get("parallel_tool_calls")),
                                                  PARAM), None)
    function = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise bad_request("'tool_choice' must be \"none\", \"auto\", \"required\" or "
                          "{\"type\": \"function\", \"function\": {\"name\": ...}}", PARAM)
    if name not in functions:
        raise bad_request(f"'tool_choice' names {name!r}, which is not among 'tools'", PARAM)
    return ForcedTools(Constraint.json_schema(functions[name], PARAM), name)


def _functions(tools: list) -> dict[str, Any]:
    """Each function tool's name and its parameters' schema (any object where it gives none)."""
    functions: dict[str, Any] = {}
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type", "function") == "function" \
            else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad_request(f"'tools[{i}]' must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                              f"tools[{i}]")
        schema = function.get("parameters")
        if not isinstance(schema, (dict, bool, type(None))):
            raise bad_request(f"'tools[{i}].function.parameters' must be a JSON schema (an object)",
                              f"tools[{i}].function.parameters")
        functions[function["name"]] = _object_schema(schema)
    return functions


def _object_schema(schema: dict | bool | None) -> dict:
    """A function's parameters as an object's schema, as OpenAI defines them: absent, empty or
    `true` is any object (vLLM's reading; the library read {} as any JSON value, and arguments
    came back as "true" or "[]"), and a schema that names no type nor combines others is an
    object's (one with properties but no type let a string through)."""
    if not isinstance(schema, dict) or not schema:
        return {"type": "object", "properties": {}}
    if "type" in schema or any(key in schema for key in ("$ref", "anyOf", "oneOf", "allOf", "enum", "const")):
        return schema
    return {**schema, "type": "object"}


def _calls_schema(functions: dict[str, Any], parallel: object) -> dict:
    """A "required" answer's schema: a list of calls, each a tool's name and its parameters; one
    call at most with parallel_tool_calls false (it was ignored: agents that run one tool a turn
    got three). Each tool's definitions move to the root, where its references point (a pydantic
    model with a nested one could not compile: "Pointer '/$defs/Address' does not exist")."""
    root: dict[str, Any] = {"type": "array", "minItems": 1}
    if parallel is False:
        root["maxItems"] = 1
    calls = []
    for index, (name, schema) in enumerate(functions.items()):
        schema = dict(schema)
        for key in ("$defs", "definitions"):
            for ref, definition in (schema.pop(key, None) or {}).items():
                held = root.setdefault(key, {})
                if held.get(ref, definition) != definition:
                    raise bad_request(f"'tools' define {ref!r} differently in two functions; a \"required\" "
                                      "tool_choice needs one definition of it", "tools")
                held[ref] = definition
        if _refers_within(schema):
            # References into the tool's own schema ("#": a recursive UI tree) pointed at the
            # list of calls once it was nested in one: the schema moves to the root's $defs,
            # and they point there.
            home = f"tool{index}_parameters"  # (by index: a tool's name may not fit in a URI)
            root.setdefault("$defs", {})[home] = _rerooted(schema, f"#/$defs/{home}")
            schema = {"$ref": f"#/$defs/{home}"}
        calls.append({"type": "object", "properties": {"name": {"const": name}, "parameters": schema},
                      "required": ["name", "parameters"], "additionalProperties": False})
    root["items"] = {"anyOf": calls}
    return root


def _is_within(ref: object) -> bool:
    """A reference into the schema's own root, not into its definitions."""
    return isinstance(ref, str) and (ref == "#" or ref.startswith("#/")) and \
        not ref.startswith(("#/$defs/", "#/definitions/"))


def _refers_within(node: object) -> bool:
    if isinstance(node, dict):
        return _is_within(node.get("$ref")) or any(_refers_within(value) for key, value in node.items()
                                                   if key not in DATA)
    return isinstance(node, list) and any(_refers_within(item) for item in node)


def _rerooted(node: object, home: str) -> object:
    """The schema with its references into its own root made to point below `home`."""
    if isinstance(node, list):
        return [_rerooted(item, home) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: value if key in DATA else _rerooted(value, home) for key, value in node.items()}
    if _is_within(node.get("$ref")):
        out["$ref"] = home + node["$ref"][1:]
    return out


def tool_calls(forced: ForcedTools, text: str) -> list[dict]:
    """The calls an answer's text holds, each call's arguments the text as generated (cut short
    with the answer, as OpenAI's are); a "required" list cut short holds none. Not parsed and
    written again: a number past a float's range came back as Infinity, which is no JSON."""
    if forced.name is not None:
        return [_call(forced.name, text)]
    try:
        return [_call(name, arguments) for name, arguments in _listed_calls(text)]
    except (ValueError, KeyError, TypeError):  # cut short (max_tokens, a stop string)
        return []


def _listed_calls(text: str) -> list[tuple[str, str]]:
    """Each call's name and its parameters' text, from a whole JSON list of call objects."""
    decoder = json.JSONDecoder()

    def skip(at: int) -> int:
        while at < len(text) and text[at] in " \t\n\r":
            at += 1
        return at

    def expect(at: int, char: str) -> int:
        at = skip(at)
        if text[at:at + 1] != char:
            raise ValueError(f"expected {char!r} at {at}")
        return at + 1

    calls, at = [], expect(0, "[")
    while True:
        at, fields = expect(at, "{"), {}
        while True:
            key, at = decoder.raw_decode(text, skip(at))
            start = skip(expect(at, ":"))
            value, at = decoder.raw_decode(text, start)
            fields[key] = value if key == "name" else text[start:at]
            at = skip(at)
            if text[at:at + 1] == "}":
                at += 1
                break
            at = expect(at, ",")
        calls.append((fields["name"], fields["parameters"]))
        at = skip(at)
        if text[at:at + 1] == "]":
            if skip(at + 1) != len(text):
                raise ValueError("text after the list")
            return calls
        at = expect(at, ",")


def _call(name: str, arguments: str) -> dict:
    return {"id": f"chatcmpl-tool-{os.urandom(16).hex()}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


def finish_reason(forced: ForcedTools, reason: Any, calls: list | None) -> Any:
    """A "required" answer that ended on its own in calls finished "tool_calls" (OpenAI's); one
    a stop string cut short holds none, and says "stop". A named function's finishes "stop", as
    OpenAI's and vLLM's do."""
    return "tool_calls" if forced.name is None and reason == "stop" and calls else reason


class ToolCallDeltas:
    """A stream's tool calls: a named function's arguments as they are generated (its id, type
    and name with the first), a "required" list's calls whole once the answer ends."""

    def __init__(self, forced: ForcedTools):
        self.forced = forced
        self._started: set[int] = set()  # choices whose call went out (with its id, type and name)
        self._texts: dict[int, str] = {}  # choice -> a "required" answer's text so far

    def delta(self, index: int, content: str, finished: bool) -> list[dict] | None:
        """The tool_calls field of a choice's chunk carrying `content`; None when it has none."""
        if self.forced.name is None:
            self._texts[index] = self._texts.get(index, "") + content
            if not finished:
                return None
            calls = tool_calls(self.forced, self._texts.pop(index))
            return [{"index": k, **call} for k, call in enumerate(calls)] or None
        if index in self._started:
            return [{"index": 0, "function": {"arguments": content}}] if content else None
        self._started.add(index)
        return [{"index": 0, **_call(self.forced.name, content)}]

    def finish_reason(self, reason: Any, calls: list | None) -> Any:
        return finish_reason(self.forced, reason, calls)
