"""JSON schemas for structured-output benchmarks and tests: the judge schemas a grader sends,
a set written like real-world tool and extraction schemas, and a seeded generator of more.

`bounded` schemas cap every string, array and number, so that even a random-weights model (the
demo's) reaches the end of a document in a few dozen tokens; unbounded ones are as users write
them."""
from __future__ import annotations

import random
from typing import Any

Schema = dict[str, Any]

PAIRWISE = {
    "type": "object",
    "properties": {
        "winner": {"enum": ["A", "B", "tie"]},
        "confidence": {"type": "integer", "minimum": 1, "maximum": 5},
        "reason": {"type": "string", "maxLength": 48},
    },
    "required": ["winner", "confidence", "reason"],
    "additionalProperties": False,
}
SCORE = {
    "type": "object",
    "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 5},
                   "rationale": {"type": "string", "maxLength": 48}},
    "required": ["score", "rationale"],
    "additionalProperties": False,
}
LABELS = ["helpful", "harmless", "off_topic", "refusal", "hallucination"]
RUBRIC = {
    "type": "object",
    "properties": {
        "criteria": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
            "type": "object",
            "properties": {"name": {"enum": ["accuracy", "clarity", "safety"]},
                           "pass": {"type": "boolean"}},
            "required": ["name", "pass"], "additionalProperties": False}},
        "overall": {"type": "integer", "minimum": 0, "maximum": 10},
    },
    "required": ["criteria", "overall"],
    "additionalProperties": False,
}
JUDGE: dict[str, Schema] = {"pairwise": PAIRWISE, "score": SCORE, "rubric": RUBRIC,
                            "label": {"type": "object", "properties": {"label": {"enum": LABELS}},
                                      "required": ["label"], "additionalProperties": False}}

_NAME = {"type": "string", "minLength": 1, "maxLength": 64}
_EMAIL = {"type": "string", "pattern": "^[a-z0-9._]+@[a-z0-9]+\\.[a-z]{2,4}$"}
REAL_WORLD: dict[str, Schema] = {
    "weather_tool": {"type": "object", "properties": {
        "location": {"type": "string", "description": "City and country"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["location"]},
    "contact": {"type": "object", "properties": {
        "name": _NAME, "email": _EMAIL, "phone": {"type": ["string", "null"]},
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
        "required": ["name", "email"], "additionalProperties": False},
    "invoice": {"type": "object", "$defs": {"line": {"type": "object", "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}, "qty": {"type": "integer", "minimum": 1},
        "price": {"type": "number", "minimum": 0}}, "required": ["sku", "qty", "price"]}},
        "properties": {"id": {"type": "string", "format": "uuid"}, "date": {"type": "string", "format": "date"},
                       "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}, "minItems": 1},
                       "total": {"type": "number"}, "paid": {"type": "boolean"}},
        "required": ["id", "lines", "total"]},
    "entities": {"type": "object", "properties": {"entities": {"type": "array", "items": {
        "type": "object", "properties": {
            "text": {"type": "string"}, "type": {"enum": ["PERSON", "ORG", "LOC", "DATE", "MISC"]},
            "start": {"type": "integer", "minimum": 0}, "end": {"type": "integer", "minimum": 0}},
        "required": ["text", "type"]}}}, "required": ["entities"]},
    "event": {"type": "object", "properties": {
        "title": {"type": "string"}, "when": {"type": "string", "format": "date-time"},
        "attendees": {"type": "array", "items": {"anyOf": [_EMAIL, {"type": "object", "properties": {
            "name": _NAME, "optional": {"type": "boolean"}}, "required": ["name"]}]}},
        "recurrence": {"oneOf": [{"type": "null"}, {"enum": ["daily", "weekly", "monthly"]}]}},
        "required": ["title", "when"]},
    "tree": {"$defs": {"node": {"type": "object", "properties": {
        "value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["value"]}}, "$ref": "#/$defs/node"},
    "sql_plan": {"type": "object", "properties": {
        "table": {"type": "string", "pattern": "^[a-z_][a-z0-9_]*$"},
        "columns": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 16},
        "where": {"type": "array", "items": {"type": "object", "properties": {
            "column": {"type": "string"}, "op": {"enum": ["=", "!=", "<", ">", "<=", ">=", "LIKE"]},
            "value": {"type": ["string", "number", "boolean", "null"]}}, "required": ["column", "op", "value"]}},
        "limit": {"type": "integer", "minimum": 1, "maximum": 1000}}, "required": ["table", "columns"]},
    "free_map": {"type": "object", "additionalProperties": {"type": "number"}},
    "product": {"type": "object", "properties": {
        "name": _NAME, "price": {"type": "number", "exclusiveMinimum": 0},
        "dimensions": {"type": "object", "properties": {"w": {"type": "number"}, "h": {"type": "number"},
                                                         "d": {"type": "number"}}, "required": ["w", "h", "d"]},
        "in_stock": {"type": "boolean"}, "rating": {"type": "number", "minimum": 0, "maximum": 5},
        "variants": {"type": "array", "items": {"type": "object", "properties": {
            "color": {"type": "string"}, "size": {"enum": ["S", "M", "L", "XL"]}}}}},
        "required": ["name", "price"]},
    "any_json": {},
}


def generated(rng: random.Random, bounded: bool = False, depth: int = 0) -> Schema:
    """A random schema of the shapes real ones have: objects of typed properties (some required,
    some closed), arrays, enums, patterns, numeric ranges, nullable unions, anyOf. With
    `bounded`, every value has a bounded length."""
    kinds = ["string", "integer", "number", "boolean", "enum", "pattern", "nullable"]
    if depth < 3:
        kinds += ["object", "array", "anyOf"] * (2 if depth == 0 else 1)
    kind = "object" if depth == 0 else rng.choice(kinds)
    if kind == "object":
        names = rng.sample(["id", "name", "value", "score", "items", "kind", "ok", "note", "meta", "tags",
                            "count", "label", "data", "when", "source"], rng.randint(1, 5))
        props = {n: generated(rng, bounded, depth + 1) for n in names}
        schema: Schema = {"type": "object", "properties": props,
                          "required": [n for n in names if bounded or rng.random() < 0.7]}
        if bounded or rng.random() < 0.5:
            schema["additionalProperties"] = False
        return schema
    if kind == "array":
        schema = {"type": "array", "items": generated(rng, bounded, depth + 1)}
        if bounded:
            schema["maxItems"] = rng.randint(1, 3)
        if rng.random() < 0.3:
            schema["minItems"] = 1
        return schema
    if kind == "anyOf":
        return {"anyOf": [generated(rng, bounded, depth + 1) for _ in range(2)]}
    if kind == "string":
        schema = {"type": "string"}
        if bounded or rng.random() < 0.3:
            schema["maxLength"] = rng.randint(1, 16)
        return schema
    if kind == "integer":
        lo = rng.randint(-100, 100)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 1000)} \
            if bounded or rng.random() < 0.5 else {"type": "integer"}
    if kind == "number":
        # A number's fraction has no bound a schema can state: bounded schemas use integers.
        return {"type": "integer", "minimum": 0, "maximum": 99} if bounded else {"type": "number"}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        return {"enum": rng.sample(["low", "mid", "high", "x", "yes", "no", "n/a", "🙂"], rng.randint(1, 4))}
    if kind == "pattern":
        repeated = "^(ab|cd){1,6}x?$" if bounded else "^(ab|cd)+x?$"
        return {"type": "string", "pattern": rng.choice(["^[a-z]{2,8}$", "^[0-9]{3}-[0-9]{4}$", repeated,
                                                          "^[A-Z][a-z]{0,6}$"])}
    nullable = rng.choice(["string", "integer", "boolean"])
    bounds = {"string": {"maxLength": 8}, "integer": {"minimum": 0, "maximum": 9}}.get(nullable, {})
    return {"type": [nullable, "null"], **(bounds if bounded else {})}


def corpus(count: int, seed: int = 0, bounded: bool = False) -> dict[str, Schema]:
    rng = random.Random(seed)
    return {f"gen{i}": generated(rng, bounded) for i in range(count)}
