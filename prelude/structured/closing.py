"""JSON schemas closed as vLLM's default backend compiles them (xgrammar's strict mode): an
object that lists properties, and says nothing of others, takes no others; an array of
prefixItems takes no more items.

Pydantic's schemas, which instructor, LangChain and litellm send, say nothing of
additionalProperties. Open, the answer went on past the declared keys with keys of its own, to
max_tokens, and came back unparsable. An object whose properties other schemas add to stays open:
closed apart, each would admit none of the other's properties (OpenAPI's `allOf: [{$ref: Pet},
{properties: {packSize}}]` would admit nothing at all). Such an object is "extended": a member of
an allOf, the target of a $ref beside other keywords, an object with properties beside
anyOf/oneOf/if/dependentSchemas and those members, and everything an extended schema combines or
refers to in turn. An object whose `required` names a property it does not list (hand-written
tool schemas with a stale name), or whose minProperties passes its list, is left open too: closed,
it is unsatisfiable. A schema with a reference this module cannot follow (an `$anchor`, an
`$id`-based URI) is left as it is, whole."""
from __future__ import annotations

from typing import Iterator
from urllib.parse import unquote

# A schema's keywords that describe it without constraining the answer; all those whose values
# are data, not schemas; and those whose values map names (of properties, definitions) to
# schemas, where the same words are names.
ANNOTATIONS = frozenset({"description", "title", "$comment", "examples", "default"})
DATA = ANNOTATIONS | {"enum", "const", "required"}
NAMED_SCHEMAS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
# What combines other schemas' properties with an object's own.
COMBINATORS = ("allOf", "anyOf", "oneOf", "if", "then", "else", "dependentSchemas", "$ref")
# What, beside a $ref, adds to the properties of the schema it refers to ($defs, annotations and
# the like beside it do not: a pydantic root model's `{"$ref": ..., "$defs": ...}`).
ADDS_PROPERTIES = frozenset({"properties", "patternProperties", "additionalProperties", "unevaluatedProperties",
                             "allOf", "anyOf", "oneOf", "if", "then", "else", "dependentSchemas"})
# What says how an object treats properties it does not list (or an array, items past its prefix).
SAYS_OTHER_PROPERTIES = frozenset({"additionalProperties", "unevaluatedProperties", "patternProperties"})
SAYS_OTHER_ITEMS = frozenset({"items", "additionalItems", "unevaluatedItems"})


def closed(schema: object) -> object:
    """The schema with every object that is not extended, lists properties and says nothing of
    others closed to them, and every such array of prefixItems closed to more items."""
    nodes = dict(_schemas(schema, "#"))
    if any(isinstance(node.get("$ref"), str) and _target(node["$ref"]) not in nodes for node in nodes.values()):
        return schema
    extended = _extended(nodes)
    return _close(schema, "#", extended)


def _target(ref: str) -> str:
    """A local reference as a pointer of _schemas' (percent-encoding undone)."""
    return unquote(ref)


def _schemas(node: object, pointer: str) -> Iterator[tuple[str, dict]]:
    """Every schema object inside `node` (itself included), by its JSON pointer."""
    if not isinstance(node, dict):
        return
    yield pointer, node
    for key, value in node.items():
        at = f"{pointer}/{_escaped(key)}"
        if key in DATA:
            continue
        if key in NAMED_SCHEMAS and isinstance(value, dict):
            for name, sub in value.items():
                yield from _schemas(sub, f"{at}/{_escaped(name)}")
        elif isinstance(value, list):
            for i, sub in enumerate(value):
                yield from _schemas(sub, f"{at}/{i}")
        else:
            yield from _schemas(value, at)


def _escaped(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _extended(nodes: dict[str, dict]) -> set[str]:
    """The pointers of the schemas whose properties others add to (the module's doc)."""
    extended: set[str] = set()
    for pointer, node in nodes.items():
        for i, _ in enumerate(node.get("allOf") or []):
            extended.add(f"{pointer}/allOf/{i}")
        if "$ref" in node and ADDS_PROPERTIES & node.keys():
            extended.add(pointer)
        if node.get("properties") and any(key in node for key in COMBINATORS):
            extended.add(pointer)
    work = list(extended)
    while work:  # what an extended schema combines or refers to is extended too
        pointer = work.pop()
        node = nodes.get(pointer, {})
        combined = [f"{pointer}/{key}/{i}" for key in ("allOf", "anyOf", "oneOf")
                    for i, _ in enumerate(node.get(key) or [])]
        combined += [f"{pointer}/{key}" for key in ("then", "else") if key in node]
        if isinstance(node.get("$ref"), str):
            combined.append(_target(node["$ref"]))
        for target in combined:
            if target in nodes and target not in extended:
                extended.add(target)
                work.append(target)
    return extended


def _close(node: object, pointer: str, extended: set[str]) -> object:
    if isinstance(node, list):
        return [_close(item, f"{pointer}/{i}", extended) for i, item in enumerate(node)]
    if not isinstance(node, dict):
        return node
    out: dict = {}
    for key, value in node.items():
        at = f"{pointer}/{_escaped(key)}"
        if key in DATA:
            out[key] = value
        elif key in NAMED_SCHEMAS and isinstance(value, dict):
            out[key] = {name: _close(sub, f"{at}/{_escaped(name)}", extended) for name, sub in value.items()}
        else:
            out[key] = _close(value, at, extended)
    if pointer in extended:
        return out
    if _closable(node):
        out["additionalProperties"] = False
    prefix, least = node.get("prefixItems"), node.get("minItems", 0)
    if isinstance(prefix, list) and not SAYS_OTHER_ITEMS & node.keys() and isinstance(least, int) \
            and least <= len(prefix):
        out["items"] = False  # (a minItems past the prefix asks for more items: those stay any)
    return out


def _closable(node: dict) -> bool:
    """An object that lists properties, says nothing of others, and asks for none it does not
    list (by `required` or `minProperties`)."""
    listed, required = node.get("properties"), node.get("required")
    if not listed or not isinstance(listed, dict) or SAYS_OTHER_PROPERTIES & node.keys():
        return False
    if isinstance(required, list) and any(isinstance(name, str) and name not in listed for name in required):
        return False
    least = node.get("minProperties")
    return not (isinstance(least, int) and least > len(listed))
