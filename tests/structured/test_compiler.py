"""Constraints compile once per (constraint, tokenizer), bad ones fail with the library's
reason, and a grammar state consumes each token exactly once however often its row runs."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from prelude.executor.sampler import apply_token_bitmask, unpack_bitmask
from prelude.structured.compiler import Constraint, GrammarCompiler, GrammarError
from prelude.structured.masks import MaskRequest, few_allowed, start_filling

EOS = 2


@pytest.fixture(scope="module")
def compiler(demo_model):
    return GrammarCompiler(demo_model / "tokenizer.json", 2048, (EOS,))


@pytest.fixture(scope="module")
def tokenizer(demo_model):
    from prelude.tokenizer import load

    return load(demo_model)


def allowed(state, step: int, last_token: int) -> set[int]:
    masks = start_filling([MaskRequest(7, state, step, last_token)], beside_forward=False).result()
    if 7 not in masks.rows:
        return set(range(2048))
    bits = np.unpackbits(masks.bitmask[masks.rows[7]].view(np.uint8), bitorder="little")  # bit t of word w: 32w+t
    return set(np.flatnonzero(bits[:2048]).tolist())


def test_repeated_constraint_compiles_once(compiler):
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    first = compiler.compile(Constraint.json_schema(schema, "a"))
    compiles, hits = compiler.compiles, compiler.hits
    # Equal whatever field carried it; a different schema is another grammar.
    assert compiler.compile(Constraint.json_schema(schema, "b")) is first
    assert (compiler.compiles, compiler.hits) == (compiles, hits + 1)
    compiler.compile(Constraint.json_schema({"type": "array"}, "a"))
    assert compiler.compiles == compiles + 1


@pytest.mark.parametrize("constraint, reason", [
    (Constraint.json_schema({"type": "nope"}, "p"), "Invalid type"),
    (Constraint.json_schema({"type": "array", "uniqueItems": True}, "p"), "uniqueItems"),
    (Constraint("regex", "[0-9", param="p"), "regex"),
    (Constraint("grammar", "start: undefined_rule", param="p"), "undefined_rule"),
])
def test_bad_constraints_name_the_reason(compiler, constraint, reason):
    with pytest.raises(GrammarError, match=reason):
        compiler.compile(constraint)


def test_lenient_schema_ignores_unsupported_keywords(compiler):
    compiler.compile(Constraint.json_schema({"type": "array", "uniqueItems": True}, "p", lenient=True))


def test_state_consumes_each_token_once(compiler, tokenizer):
    state = compiler.compile(Constraint("choice", json.dumps(["ab12", "cd"]), param="p")).new_state()
    first = allowed(state, 0, 99)
    ids = tokenizer.encode("ab12", add_special_tokens=False)
    assert ids[0] in first and EOS not in first
    after = allowed(state, 1, ids[0])
    assert allowed(state, 1, ids[0]) == after  # the row run again: the state did not move
    for step, token in enumerate(ids[1:], start=2):
        last = allowed(state, step, token)
    assert last == {EOS}  # the choice is whole


def test_a_choice_of_thousands_of_labels_runs_whole(compiler, tokenizer):
    """2,000 labels and more: the library's rule held at most 2,000 alternatives, and the
    answer failed after its first token."""
    labels = [f"label{i}" for i in range(2500)]
    state = compiler.compile(Constraint("choice", json.dumps(labels), param="p")).new_state()
    ids, last = tokenizer.encode("label2345", add_special_tokens=False), 99
    for step, token in enumerate(ids):
        assert token in allowed(state, step, last)
        last = token
    assert allowed(state, len(ids), last) == {EOS}


def test_a_lark_grammar_whose_start_rule_is_inlined_compiles(compiler):
    """"?start:", common Lark style (vLLM strips the "?"), was read as GBNF: "Expected name"."""
    compiler.compile(Constraint("grammar", '?start: "yes" | "no"', param="p"))


def test_a_special_tokens_text_is_refused_only_where_the_answer_could_hold_it(compiler):
    """A schema describing "<|im_end|>" (or giving it as a default) constrains nothing with it:
    it was refused as if the answer held the token's text. Where the answer could hold it (a
    const, a property's name), it still is, unescaped as the schema's JSON had it (a non-ASCII
    special token's text)."""
    described = {"type": "object", "title": "<|im_end|>", "properties": {
        "answer": {"type": "string", "description": "no <|im_end|> in it", "examples": ["<|im_end|>"],
                   "default": "<|im_end|>"},
        "description": {"type": "string", "maxLength": 3}}}
    compiler.compile(Constraint.json_schema(described, "p"))
    for schema in ({"const": "x<|im_end|>y"}, {"type": "object", "properties": {"<|im_end|>": {"type": "string"}}},
                   {"type": "object", "properties": {"description": {"const": "<|im_end|>"}}}):
        with pytest.raises(GrammarError, match="special tokens"):
            compiler.compile(Constraint.json_schema(schema, "p"))


def test_a_non_ascii_special_tokens_text_is_refused():
    from tests.data import tokenizer_dir

    path = tokenizer_dir("deepseek-v3") / "tokenizer.json"
    end = "<\uff5cend\u2581of\u2581sentence\uff5c>"
    deepseek = GrammarCompiler(path, 130_000, (1,))
    for constraint in (Constraint.json_schema({"const": f"x{end}y"}, "p"),
                       Constraint("choice", json.dumps([end, "a"]))):
        with pytest.raises(GrammarError, match="special tokens"):
            deepseek.compile(constraint)


def test_reasoning_block_is_unconstrained_until_its_end(compiler):
    end = 1234
    state = compiler.compile(Constraint("regex", "[0-9]+", param="p")).new_state(reasoning_end=end)
    assert len(allowed(state, 0, 5)) == 2048
    assert len(allowed(state, 1, 17)) == 2048
    after = allowed(state, 2, end)
    assert 0 < len(after) < 100 and EOS not in after


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["native-fp32", "tensor-ops"])
def test_bitmask_paths_agree(dtype):
    """The CPU's native masking (fp32 logits) and the device path's tensor ops (any other, and
    CUDA) forbid exactly the tokens whose bit is 0, in whole words of 0 and of 1 bits too; a row
    that allows few tokens lists them (structured.masks.few_allowed, the narrowed head's)."""
    gen = torch.Generator().manual_seed(0)
    bitmask = torch.randint(-2**31, 2**31 - 1, (3, 5), dtype=torch.int32, generator=gen)
    bitmask[0, 1], bitmask[1, 2] = 0, -1
    vocab = 150
    bits = [[(int(bitmask[r, t // 32]) >> (t % 32)) & 1 for t in range(vocab)] for r in range(3)]
    expected = torch.tensor(bits).bool()
    assert torch.equal(unpack_bitmask(bitmask, vocab), expected)
    few = torch.zeros(5, dtype=torch.int32)
    few[0], few[3] = -2**31, 0b101  # bit 31 of word 0, bits 0 and 2 of word 3
    assert few_allowed(few.numpy(), 3) == [31, 96, 98] and few_allowed(few.numpy(), 2) is None
    assert few_allowed(bitmask[0].numpy(), 32) is None and few_allowed(np.zeros(5, np.int32), 3) is None
    logits = torch.zeros(4, vocab, dtype=dtype)
    apply_token_bitmask(logits, bitmask[:2], [1, 3])
    assert torch.equal(logits[1] == 0, expected[0]) and torch.equal(logits[3] == 0, expected[1])
    assert (logits[0] == 0).all() and (logits[2] == 0).all()
    assert torch.isneginf(logits[[1, 3]][~expected[:2]]).all()
    every = torch.zeros(3, vocab, dtype=dtype)
    apply_token_bitmask(every, bitmask, [0, 1, 2])
    assert torch.equal(every == 0, expected)


def test_batched_masks_beside_a_gpu_forward_equal_the_inline_ones(compiler):
    # Beside a forward on another device the masks are filled in one batched call in the mask
    # thread; on a CPU whose cores torch's threads take, one row at a time inline. Same masks.
    grammar = compiler.compile(Constraint("regex", "[a-c]{2}x", param="p"))
    requests = [MaskRequest(i, grammar.new_state(), 0, EOS) for i in range(6)]
    inline = start_filling(requests, beside_forward=False).result()
    batched = start_filling(requests, beside_forward=True).result()
    assert inline.rows == batched.rows
    assert np.array_equal(inline.bitmask, batched.bitmask)


def _next_texts(compiler, tokenizer, schema: dict | Constraint, prefix: str) -> set[str]:
    """The first characters of every token the schema allows after `prefix`."""
    constraint = schema if isinstance(schema, Constraint) else Constraint.json_schema(schema, "p")
    state = compiler.compile(constraint).new_state()
    last = 99
    for step, token in enumerate(tokenizer.encode(prefix, add_special_tokens=False)):
        assert token in allowed(state, step, last), prefix
        last = token
    step = len(tokenizer.encode(prefix, add_special_tokens=False))
    return {tokenizer.decode([t])[:1] for t in allowed(state, step, last) if t != EOS}


def test_an_object_listing_properties_is_closed_to_others_as_vllm_compiles_it(compiler, tokenizer):
    """A pydantic model's schema says nothing of additionalProperties (instructor, LangChain and
    litellm send them so): open, the answer went on with keys of its own until max_tokens cut
    it, unparsable; vLLM's default backend closes such an object (xgrammar's strict mode)."""
    verdict = {"type": "object", "properties": {"winner": {"enum": ["A", "B"]}}, "required": ["winner"]}
    assert _next_texts(compiler, tokenizer, verdict, '{"winner":"A"') == {"}"}
    nested = {"type": "object", "properties": {"v": {"$ref": "#/$defs/V"}}, "required": ["v"], "$defs": {"V": verdict}}
    assert _next_texts(compiler, tokenizer, nested, '{"v":{"winner":"A"') == {"}"}
    # Said open, or an object listing no properties (any object), stays open.
    assert "," in _next_texts(compiler, tokenizer, {**verdict, "additionalProperties": True}, '{"winner":"A"')
    assert '"' in _next_texts(compiler, tokenizer, {"type": "object"}, "{")
    # Objects whose properties others add to stay open (closed apart, they admitted nothing):
    # allOf's members, an OpenAPI definition extended through allOf, a $ref beside properties,
    # properties beside anyOf members that list their own.
    a, b = ({"type": "object", "properties": {k: {"type": "integer"}}, "required": [k]} for k in "ab")
    for extended in ({"allOf": [a, b]},
                     {"$defs": {"A": a}, "allOf": [{"$ref": "#/$defs/A"}, b]},
                     {"$defs": {"A": a}, "$ref": "#/$defs/A", "properties": b["properties"], "required": ["b"]},
                     {**a, "$defs": {"B": b}, "anyOf": [{"$ref": "#/$defs/B"}]}):
        assert "," in _next_texts(compiler, tokenizer, extended, '{"a":1'), extended
    # A schema's objects left open where closing would refuse what it allows (a corpus of
    # real-world schemas found each): `required` naming an unlisted property (a stale tool
    # schema: unsatisfiable), references by $anchor, $id or percent-encoded pointer (not
    # followed, their targets were closed apart), a pydantic root model's $ref beside $defs
    # (closed as any other object).
    stale = {**a, "required": ["a", "b"]}
    assert "," in _next_texts(compiler, tokenizer, stale, '{"a":1')
    for ref, defs in (("#A", {"A": {**a, "$anchor": "A"}}), ("#/$defs/A%20B", {"A B": a})):
        assert "," in _next_texts(compiler, tokenizer, {"$defs": defs, "allOf": [{"$ref": ref}, b]}, '{"a":1')
    root = {"$ref": "#/$defs/A", "$defs": {"A": a}}
    assert "," not in _next_texts(compiler, tokenizer, root, '{"a":1')


def test_a_recursive_tools_calls_nest_the_tool_under_required(compiler, tokenizer):
    """A tool whose schema refers to its own root ("#", OpenAI's recursive UI example): under
    tool_choice "required" the root became the list of calls, and children came out as lists of
    calls."""
    from prelude.server.protocol import Body
    from prelude.server.tool_calls import forced_tools

    ui = {"type": "object", "properties": {"type": {"enum": ["div", "button"]},
                                           "children": {"type": "array", "items": {"$ref": "#"}}},
          "required": ["type", "children"], "additionalProperties": False}
    body = Body({"tools": [{"type": "function", "function": {"name": "ui", "parameters": ui}}],
                 "tool_choice": "required"})
    forced = forced_tools(body)
    assert forced is not None
    prefix = '[{"name":"ui","parameters":{"type":"div","children":['
    assert _next_texts(compiler, tokenizer, forced.constraint, prefix) == {"{", "]"}
    assert "," in _next_texts(compiler, tokenizer, forced.constraint, prefix + '{"type":"button","children":[]}')
