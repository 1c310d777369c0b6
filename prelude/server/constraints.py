"""Structured outputs at the edge: the request fields that constrain an answer's text, read into
one Constraint, and its grammar compiled (cached, off the event loop, within a time limit).

The fields, every client's: OpenAI's response_format (json_schema, json_object), vLLM's
structured_outputs (json, regex, choice, grammar, json_object, whitespace_pattern) and its older
guided_json / guided_regex / guided_choice / guided_grammar / guided_whitespace_pattern. One
constraint per request. A choice of single tokens stays what it was before grammars: the
allowed tokens of a one-token answer."""
from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from prelude.contract.constraint import TokenConstraint
from prelude.contract.record import record
from prelude.server.errors import bad_request
from prelude.server.protocol import Body
from prelude.structured.compiler import CompiledGrammar, Constraint, GrammarCompiler, GrammarError

# A grammar that takes longer than this to compile is refused (400) rather than waited for. The
# first compile also builds the tokenizer's tables (about a second for a 150K vocabulary).
COMPILE_TIMEOUT_S = 10.0
_KINDS = ("json", "regex", "choice", "grammar", "json_object")


@record
class AnswerConstraint:
    """What constrains a request's answer: the tokens of a one-token choice, or a grammar (each
    choice's request gets a state of its own from `new_state`)."""

    token_ids: tuple[int, ...] | None = None
    new_state: Callable[[], TokenConstraint] | None = None


def requested(body: Body) -> Constraint | list[str] | None:
    """The request's constraint, or its choices (strings, to be tokenized), or None."""
    found: list[tuple[str, Any]] = []
    whitespace: str | None = None
    structured = body.object("structured_outputs")
    if structured is not None:
        if structured.has("structural_tag"):
            raise bad_request("'structured_outputs.structural_tag' is not supported",
                              "structured_outputs.structural_tag")
        found += [(f"structured_outputs.{k}", structured.data[k]) for k in _KINDS
                  if structured.has(k) and not (k == "json_object" and structured.data[k] is False)]
        whitespace = structured.str("whitespace_pattern")
    found += [(f"guided_{k}", body.data[f"guided_{k}"]) for k in ("json", "regex", "choice", "grammar")
              if body.has(f"guided_{k}")]
    whitespace = body.str("guided_whitespace_pattern") or whitespace
    lenient = False
    response_format = body.object("response_format")
    if response_format is not None:
        kind = response_format.str("type", "text")
        if kind == "json_object":
            found.append(("response_format", True))
        elif kind == "json_schema":
            spec = response_format.object("json_schema")
            if spec is None:
                raise bad_request("'response_format.json_schema' is required with type 'json_schema'",
                                  "response_format.json_schema")
            schema = spec.object("schema")
            found.append(("response_format.json_schema.schema", {} if schema is None else schema.data))
            # OpenAI's strict: the schema is followed exactly, and a keyword the library cannot
            # enforce is refused; without it, such a keyword is ignored.
            lenient = not spec.bool("strict")
        elif kind != "text":
            raise bad_request(f"'response_format.type' {kind!r} is not supported (text, json_object, json_schema)",
                              "response_format.type")
    # As vLLM: one naming no constraint ({}, {"json_schema": ...}) is no request to run free (its
    # other keys are ignored, as unknown fields are).
    if not found and structured is not None:
        raise bad_request("'structured_outputs' names no constraint (json, regex, choice, grammar or "
                          "json_object)", "structured_outputs")
    if not found:
        return None
    if len(found) > 1:
        raise bad_request(f"only one constraint per request: '{found[0][0]}' and '{found[1][0]}' were given",
                          found[1][0])
    return _constraint(*found[0], whitespace, lenient)


def _constraint(param: str, value: Any, whitespace: str | None, lenient: bool) -> Constraint | list[str]:
    kind = param.rsplit(".", 1)[-1].removeprefix("guided_")
    if param == "response_format" or kind == "json_object":
        return Constraint.json_schema({"type": "object"}, param, whitespace_pattern=whitespace)
    if kind in ("json", "schema"):
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except (ValueError, RecursionError):  # nested past the parser's stack: a 500 it was
                raise bad_request(f"'{param}' is not valid JSON (or nests too deep)", param) from None
        if not isinstance(value, (dict, bool)):
            raise bad_request(f"'{param}' must be a JSON schema (an object)", param)
        return Constraint.json_schema(value, param, lenient, whitespace)
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise bad_request(f"'{param}' must be a non-empty array of non-empty strings", param)
        return value
    if not isinstance(value, str) or not value:
        raise bad_request(f"'{param}' must be a non-empty string", param)
    return Constraint("regex" if kind == "regex" else "grammar", value, param=param)


class Grammars:
    """Compiles constraints for the served tokenizer: a cached grammar on the loop at once,
    others in a thread of their own, each within COMPILE_TIMEOUT_S."""

    def __init__(self, compiler: GrammarCompiler):
        self.compiler = compiler
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prelude-grammar")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def compile(self, constraint: Constraint) -> CompiledGrammar:
        compiled = self.compiler.cached(constraint)
        if compiled is not None:
            return compiled
        work = asyncio.get_running_loop().run_in_executor(self._pool, self.compiler.compile, constraint)
        param = constraint.param
        try:
            return await asyncio.wait_for(work, COMPILE_TIMEOUT_S)
        except GrammarError as exc:
            raise bad_request(f"'{param}' cannot be compiled: {exc}", param) from None
        except asyncio.TimeoutError:
            raise bad_request(f"'{param}' took more than {COMPILE_TIMEOUT_S:.0f} s to compile", param) from None
