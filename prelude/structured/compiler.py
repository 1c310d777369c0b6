"""Constraints compiled into grammars for one tokenizer, cached by the constraint.

A compiled grammar is a fresh llguidance matcher that never consumes a token; each request gets
a copy of it (a copy costs a tiny fraction of a compile: `python -m bench.serving.grammar_libs`).
The tokenizer's llguidance form is built on the first compile (about a second for a 150K
vocabulary), in the thread that compiles. llguidance itself is imported there too: a server that
never sees a constraint does not load it (7 ms of every start, `python -X importtime`)."""
from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from prelude.structured.closing import ANNOTATIONS, NAMED_SCHEMAS, closed
from prelude.structured.state import GrammarState

if TYPE_CHECKING:
    import llguidance

Kind = Literal["json", "regex", "choice", "grammar"]
# Compiled grammars kept, least recently used dropped first: a server sees a few schemas again
# and again (a judge's), so a small cache serves nearly every request.
CACHE_SIZE = 256


class GrammarError(ValueError):
    """A constraint the library cannot compile (an invalid schema, regex or grammar, a keyword it
    does not support)."""


@dataclass(frozen=True, slots=True)
class Constraint:
    """One request's constraint on its answer's text, normalized: equal constraints compile to
    the same grammar (the cache key). `text`: the schema as compact JSON (its properties in
    their order, which the answer keeps), the regex, the grammar (Lark or GBNF), or the choices
    as a JSON list."""

    kind: Kind
    text: str
    whitespace_pattern: str | None = None
    lenient: bool = False  # a JSON schema's unsupported keywords are ignored rather than refused
    param: str = field(default="", compare=False)  # the request field it came from, for errors

    @classmethod
    def json_schema(cls, schema: object, param: str, lenient: bool = False,
                    whitespace_pattern: str | None = None) -> Constraint:
        return cls("json", json.dumps(closed(schema), separators=(",", ":")), whitespace_pattern,
                   lenient, param)

    def answer_texts(self) -> list[str]:
        """The texts the answer may be made of: a schema's strings (unescaped), less those that
        only describe it (a schema's description, title, $comment, examples and default: a
        description naming "<think>" was refused), the choices, the regex or grammar as written."""
        if self.kind == "choice":
            return json.loads(self.text)
        if self.kind != "json":
            return [self.text]
        texts: list[str] = []
        stack: list[tuple[object, bool]] = [(json.loads(self.text), False)]  # (node, a map of names to schemas)
        while stack:
            node, names = stack.pop()
            if isinstance(node, str):
                texts.append(node)
            elif isinstance(node, list):
                stack.extend((item, False) for item in node)
            elif isinstance(node, dict):
                for key, value in node.items():
                    if not names and key in ANNOTATIONS:
                        continue
                    texts.append(key)
                    stack.append((value, not names and key in NAMED_SCHEMAS))
        return texts

    def grammar(self) -> str:
        """The llguidance grammar text, unchecked."""
        import llguidance
        from llguidance.gbnf_to_lark import any_to_lark

        if self.kind == "json":
            _check_integer_bounds(json.loads(self.text))
            options: dict = {"whitespace_flexible": self.whitespace_pattern is not None, "lenient": self.lenient}
            if self.whitespace_pattern is not None:
                options["whitespace_pattern"] = self.whitespace_pattern
            return llguidance.LLMatcher.grammar_from_json_schema(self.text, defaults=options)  # type: ignore[arg-type]
        if self.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(self.text)
        if self.kind == "choice":
            return llguidance.LLMatcher.grammar_from_lark(_choice_lark(json.loads(self.text)))
        if LARK_START.search(self.text):  # "?start:", which the converter takes for GBNF
            return llguidance.LLMatcher.grammar_from_lark(self.text)
        try:
            lark = any_to_lark(self.text)
        except Exception as exc:  # noqa: BLE001 (the converter raises plain Exceptions for a bad grammar)
            raise ValueError(str(exc)) from None
        return llguidance.LLMatcher.grammar_from_lark(lark)


# A Lark grammar whose start rule is written "?start:" (inlined, common Lark style), which the
# library's converter reads as GBNF (it knows Lark by a line beginning "start:"): vLLM strips
# the "?", and the library's Lark reads it.
LARK_START = re.compile(r"(?m)^\s*\?start\s*:")
# A choice of more labels than this is one lexeme (a terminal: matched by the lexer's automaton)
# rather than alternatives of the parser's start rule, whose every label stays an item of the
# parser's row while a prefix matches: 2,000 labels failed after the first token ("Current row has
# 2001 items; max is 2000"), as a JSON enum of as many does not.
MAX_ALTERNATIVES = 1000


def _choice_lark(choices: list[str]) -> str:
    alternatives = " | ".join(json.dumps(c) for c in choices)
    if len(choices) <= MAX_ALTERNATIVES:
        return f"start: {alternatives}"
    return f"start: CHOICE\nCHOICE: {alternatives}"


# llguidance holds integer bounds in 64 bits: past them it clamps (a minimum of 1e19 answered
# 9223372036854775807, below it, with finish "stop"), and two bounds both at -2**63 crashed the
# process while compiling (SIGSEGV in its library), every request in flight with it.
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def _check_integer_bounds(schema: object) -> None:
    """Raises ValueError for an integer schema bounded beyond 64 bits, anywhere in `schema`."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            kind = node.get("type")
            if kind == "integer" or (isinstance(kind, list) and "integer" in kind):
                for key in BOUNDS:
                    bound = node.get(key)
                    if isinstance(bound, (int, float)) and not INT64_MIN < bound < INT64_MAX:
                        raise ValueError(f"integer '{key}' {bound} lies beyond 64-bit integers, which the "
                                         "grammar library holds bounds in")
            stack.extend(node.values())


def _reason(message: str) -> str:
    """The library's error on one line, every line of it kept (its first is often only the
    kind of error, "regex parse error:", and the reason follows)."""
    return " ".join(line.strip() for line in message.splitlines() if line.strip())


class CompiledGrammar:
    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int):
        self._matcher = matcher
        self._words = (vocab_size + 31) // 32
        self.failed = False  # a copy's matcher failed: the cache compiles it afresh

    def new_state(self, reasoning_end: int | None = None) -> GrammarState:
        """A request's own state, at the grammar's start. With `reasoning_end`, the grammar
        applies only after the answer produced that token (the end of a reasoning block)."""
        return GrammarState(self._matcher.deep_copy(), self._words, reasoning_end, self._fail)

    def _fail(self) -> None:
        self.failed = True


class GrammarCompiler:
    def __init__(self, tokenizer_json: Path, vocab_size: int, eos_token_ids: tuple[int, ...]):
        """`vocab_size`: at least the model's logits width (masks cover it; ids past the
        tokenizer's are never allowed)."""
        self._tokenizer_json = tokenizer_json
        self.vocab_size = vocab_size
        self._eos = list(eos_token_ids)
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._added: list[str] | None = None
        self._cache: OrderedDict[Constraint, CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()  # the cache's
        self._tokenizer_lock = threading.Lock()  # held while the tokenizer's tables are built
        self.compiles = 0
        self.hits = 0

    def cached(self, constraint: Constraint) -> CompiledGrammar | None:
        """The compiled grammar when the cache holds it (cheap: callers ask before offloading)."""
        with self._lock:
            compiled = self._cache.get(constraint)
            if compiled is not None and compiled.failed:
                del self._cache[constraint]
                compiled = None
            if compiled is not None:
                self._cache.move_to_end(constraint)
                self.hits += 1
            return compiled

    def compile(self, constraint: Constraint) -> CompiledGrammar:
        """Compiles (or finds) the constraint's grammar; raises GrammarError when it cannot.
        Blocking: llguidance drops the GIL while it builds."""
        compiled = self.cached(constraint)
        if compiled is not None:
            return compiled
        texts = constraint.answer_texts()
        held = next((added for added in self._added_texts() if any(added in text for text in texts)), None)
        if held is not None:
            # llguidance reads such text as the added token itself: "<|im_end|>" as a choice
            # answered "" (EOS ended it), "<think>" failed the grammar mid-answer.
            raise GrammarError(f"it holds {held!r}, the text of one of the tokenizer's special tokens, which the "
                               "grammar reads as that token, not as text")
        try:
            grammar = constraint.grammar()
        except ValueError as exc:
            raise GrammarError(_reason(str(exc))) from None
        import llguidance

        matcher = llguidance.LLMatcher(self._llg_tokenizer(), grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(_reason(matcher.get_error()))
        compiled = CompiledGrammar(matcher, self.vocab_size)
        with self._lock:
            self.compiles += 1
            self._cache[constraint] = compiled
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def _added_texts(self) -> list[str]:
        """The texts of the added tokens the grammar reads as tokens, not as text (read with its
        tables)."""
        self._llg_tokenizer()
        assert self._added is not None
        return self._added

    def _llg_tokenizer(self) -> llguidance.LLTokenizer:
        import llguidance

        with self._tokenizer_lock:
            if self._tokenizer is None:
                text = self._tokenizer_json.read_text()  # once for both (Qwen3's: 11 MB)
                tokenizer = llguidance.LLTokenizer(text, n_vocab=self.vocab_size, eos_token=self._eos or None)
                # Only the added tokens the library holds apart from text (the special ones, and
                # markup-like ones such as Qwen3's <think>): Phi-2's runs of spaces are text to it.
                self._added = [token["content"] for token in json.loads(text).get("added_tokens", [])
                               if token.get("content") and tokenizer.is_special_token(token["id"])]
                self._tokenizer = tokenizer
            return self._tokenizer
