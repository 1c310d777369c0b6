"""Bad input gets a 4xx with an OpenAI-style error object; the server keeps serving and no KV
block leaks."""
from __future__ import annotations

import json
import shutil

import httpx
import pytest

from prelude.contract.config import Config
from tests.checkpoints import make_checkpoint
from tests.server.harness import ServerThread

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
TOKENIZE = "/tokenize"

CASES = [
    # (path, raw body or json, expected status, expected param)
    (COMPLETIONS, b"{not json", 400, None),
    (COMPLETIONS, b"[1, 2]", 400, None),
    (COMPLETIONS, b'{"prompt": "caf\xe9"}', 400, None),  # invalid UTF-8
    (COMPLETIONS, {"max_tokens": 3}, 400, "prompt"),
    (COMPLETIONS, {"prompt": ""}, 400, "prompt"),
    (COMPLETIONS, {"prompt": []}, 400, "prompt"),
    (COMPLETIONS, {"prompt": [[]]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": 42}, 400, "prompt"),
    (COMPLETIONS, {"prompt": [1, 2, 99999999]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": [1, -2]}, 400, "prompt"),
    # Only ints are ids: JSON's true is not token 1, nor 2.0 token 2; a huge int is out of range.
    (COMPLETIONS, {"prompt": [1, True]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": [1, 2.0]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": [[1], [1, 2**64]]}, 400, "prompt"),
    # As many prompts as decision inputs at most: a body listing millions of one-token prompts
    # made as many rows, and the server ran out of memory.
    (COMPLETIONS, {"prompt": [[5]] * 1025, "max_tokens": 1}, 400, "prompt"),
    # Nor as many choices: n multiplies the rows (1,024 prompts x n=128 queued 131,072 of them).
    (COMPLETIONS, {"prompt": [[5]] * 9, "n": 128, "max_tokens": 1}, 400, "n"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": -1}, 400, "max_tokens"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": "ten"}, 400, "max_tokens"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 100000}, 400, "max_tokens"),
    (COMPLETIONS, {"prompt": "hi", "temperature": -0.5}, 400, "temperature"),
    (COMPLETIONS, {"prompt": "hi", "top_p": 0}, 400, "top_p"),
    (COMPLETIONS, {"prompt": "hi", "top_p": "high"}, 400, "top_p"),
    (COMPLETIONS, {"prompt": "hi", "n": 0}, 400, "n"),
    (COMPLETIONS, {"prompt": "hi", "logprobs": 50}, 400, "logprobs"),
    (COMPLETIONS, {"prompt": "hi", "stop": [1, 2]}, 400, "stop"),
    # an empty stop string (vLLM refuses it; it was dropped without a word)
    (COMPLETIONS, {"prompt": "hi", "stop": ["done", ""]}, 400, "stop"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "stop": ""}, 400, "stop"),
    # stream_options without stream (OpenAI and vLLM refuse them; ignored before)
    (COMPLETIONS, {"prompt": "hi", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "stream": False,
            "stream_options": {"include_usage": True}}, 400, "stream_options"),
    (COMPLETIONS, {"prompt": "hi", "stream": "yes"}, 400, "stream"),
    (COMPLETIONS, {"prompt": "hi", "logit_bias": {"abc": 1}}, 400, "logit_bias"),
    (COMPLETIONS, {"prompt": "hi", "logit_bias": {"5": 500}}, 400, "logit_bias.5"),
    # read as absent, a null bias reached the sampler as NaN and forced its token, 200
    (COMPLETIONS, {"prompt": "hi", "logit_bias": {"5": None, "6": 2}}, 400, "logit_bias.5"),
    (COMPLETIONS, {"prompt": "hi", "frequency_penalty": 5.0}, 400, "frequency_penalty"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 4, "min_tokens": 5}, 400, "min_tokens"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 1, "allowed_token_ids": []}, 400, "allowed_token_ids"),
    # Only tokens min_tokens blocks: every logit masked, and the sampler answered some other token.
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 3, "min_tokens": 2, "allowed_token_ids": [5], "stop_token_ids": [5]},
     400, "allowed_token_ids"),
    (COMPLETIONS, {"prompt": "hi", "model": "no-such-model"}, 404, "model"),
    # Numbers the engine cannot represent are refused at validation, never inside a step.
    (COMPLETIONS, {"prompt": "hi", "top_k": 2**63}, 400, "top_k"),
    (COMPLETIONS, {"prompt": "hi", "top_k": 1e308}, 400, "top_k"),
    (COMPLETIONS, {"prompt": "hi", "seed": 2**64}, 400, "seed"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 2**63}, 400, "max_tokens"),
    (COMPLETIONS, b'{"prompt": "hi", "temperature": 1' + b"0" * 400 + b"}", 400, None),
    (COMPLETIONS, b'{"prompt": "hi", "top_p": NaN}', 400, None),
    (COMPLETIONS, b'{"prompt": "hi", "temperature": 1e400}', 400, None),
    # Lone surrogates and deep nesting: a 400 before any handler (or recursion) sees them.
    (COMPLETIONS, b'{"prompt": "\\ud800x"}', 400, None),
    (TOKENIZE, b'{"prompt": "\\udfffx"}', 400, None),
    (COMPLETIONS, b'{"prompt": "hi", "stop": ' + b"[" * 10_000 + b"]" * 10_000 + b"}", 400, None),
    (CHAT, {"messages": []}, 400, "messages"),
    (CHAT, {"messages": "hello"}, 400, "messages"),
    (CHAT, {"messages": [{"content": "no role"}]}, 400, "messages[0]"),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, 400,
     "messages[0].content"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**6}, 400, "max_tokens"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "best_of": 3}, 400, "best_of"),  # was dropped
    (COMPLETIONS, {"prompt": "hi", "best_of": 3}, 400, "best_of"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 10**6}, 400,
     "max_completion_tokens"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 99, "logprobs": True}, 400,
     "top_logprobs"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 5}, 400, "top_logprobs"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "echo": "yes"}, 400, "echo"),  # was ignored unread
    # A request's own chat template (vLLM refuses it without --trust-request-chat-template): ignored,
    # the checkpoint's template rendered a prompt the client did not write.
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "chat_template": "{{ messages[0].content }}"}, 400,
     "chat_template"),
    (TOKENIZE, {"messages": [{"role": "user", "content": "hi"}], "chat_template": "{{ 1 }}"}, 400, "chat_template"),
    # Constraints the grammar library cannot compile, or this server does not have; and known
    # fields this server cannot honour (a tool call was never parsed out of the answer).
    (COMPLETIONS, {"prompt": "hi", "response_format": {"type": "structural_tag"}}, 400, "response_format.type"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema",
            "json_schema": {"name": "v", "schema": {"type": "nope"}}}}, 400, "response_format.json_schema.schema"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "structured_outputs": {"json": "{not json"}},
     400, "structured_outputs.json"),
    (COMPLETIONS, {"prompt": "hi", "structured_outputs": {"regex": "[ab"}}, 400, "structured_outputs.regex"),
    # A constraint under a name vLLM does not have, or none: they ran unconstrained (vLLM: a 400)
    (COMPLETIONS, {"prompt": "hi", "structured_outputs": {"json_schema": {"type": "object"}}}, 400,
     "structured_outputs"),
    (COMPLETIONS, {"prompt": "hi", "structured_outputs": {}}, 400, "structured_outputs"),
    (COMPLETIONS, {"prompt": "hi", "guided_json": {"type": "object"}, "guided_regex": "a+"}, 400, "guided_regex"),
    (COMPLETIONS, {"prompt": "hi", "guided_grammar": "start: nothing_here"}, 400, "guided_grammar"),
    # GBNF the converter to Lark refuses (no root rule, an unknown rule, an unterminated string):
    # it raises plain Exceptions, which answered 500.
    (COMPLETIONS, {"prompt": "hi", "guided_grammar": 'x ::= "a"'}, 400, "guided_grammar"),
    (COMPLETIONS, {"prompt": "hi", "guided_grammar": "root ::= foo"}, 400, "guided_grammar"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "structured_outputs": {"grammar": 'root ::= "a'}},
     400, "structured_outputs.grammar"),
    (COMPLETIONS, {"prompt": "hi", "structured_outputs": {"structural_tag": "{}"}}, 400,
     "structured_outputs.structural_tag"),
    # Integer bounds past 64 bits: llguidance clamped them (a minimum of 1e19 answered
    # 9223372036854775807, "stop"), and two at -2**63 crashed the process while compiling.
    (COMPLETIONS, {"prompt": "hi", "guided_json": {"type": "object", "properties": {"n": {
        "type": "integer", "minimum": -1e20, "maximum": -1e19}}}}, 400, "guided_json"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema", "json_schema": {
        "name": "n", "strict": True, "schema": {"type": "integer", "minimum": -2**63, "maximum": -2**63}}}},
     400, "response_format.json_schema.schema"),
    (COMPLETIONS, {"prompt": "hi", "guided_json": {"type": ["integer", "null"], "minimum": 10**19}}, 400,
     "guided_json"),
    # A schema as JSON text nested past the parser's stack: RecursionError, a 500
    (COMPLETIONS, {"prompt": "hi", "guided_json": "[" * 5000 + "]" * 5000}, 400, "guided_json"),
    # A special token's text as a choice or a literal is read as that token: "" or a failed grammar
    (COMPLETIONS, {"prompt": "hi", "guided_choice": ["<|im_end|>", "ok"]}, 400, "guided_choice"),
    (COMPLETIONS, {"prompt": "hi", "guided_json": {"const": "<|im_end|>"}}, 400, "guided_json"),
    (COMPLETIONS, {"prompt": "hi", "structured_outputs": {"json": False}}, 400, "structured_outputs.json"),
    (COMPLETIONS, {"prompt": "hi", "use_beam_search": True, "n": 2}, 400, "use_beam_search"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "bad_words": ["no"]}, 400, "bad_words"),
    (COMPLETIONS, {"prompt": "hi", "logits_processors": ["x"]}, 400, "logits_processors"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "cache_salt": "tenant-a"}, 400, "cache_salt"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "tool_choice": "auto", "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}, 400, "tool_choice"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}, 400, "tool_choice"),
    ("/v1/embeddings", {"input": "hello", "truncate_prompt_tokens": 2, "truncation_side": "middle"}, 400,
     "truncation_side"),
    # vLLM's rule: continuing the final message excludes a generation prompt (on by default).
    (CHAT, {"messages": [{"role": "assistant", "content": "So"}], "continue_final_message": True}, 400,
     "continue_final_message"),
    (TOKENIZE, {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"messages": []}}, 400,
     "chat_template_kwargs"),
    # An empty item or query in label-token scoring, refused as its token-id form is: packed behind
    # the query, an empty item got the previous item's score.
    ("/v1/score", {"query": "q", "items": ["a", ""], "label_token_ids": [5]}, 400, "items"),
    ("/v1/score", {"query": "", "items": ["a"], "label_token_ids": [5]}, 400, "query"),
    ("/v1/score", {"query": [7], "items": [[8], []], "label_token_ids": [5]}, 400, "items"),
    ("/embed", {"inputs": "hi", "truncate": True, "truncation_direction": "middle"}, 400, "truncation_direction"),
]


def _post(server, path: str, body: bytes | dict) -> httpx.Response:
    """Posts raw bytes as they are, anything else as JSON; always labelled application/json."""
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    return httpx.post(server.base_url + path, headers={"content-type": "application/json"}, **kwargs)


@pytest.mark.parametrize("path,body,status,param", CASES, ids=[f"{i}" for i in range(len(CASES))])
def test_bad_request_gets_openai_error(server, path, body, status, param):
    response = _post(server, path, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and error["type"]
    if param is not None:
        assert error["param"] == param


def test_a_token_list_past_the_context_is_refused_before_its_ids_are_walked(server):
    """Checking 5M ids (a 32 MiB body) held the event loop 0.6 s before the 400 for its length;
    the length is known from the list alone, so it is said first."""
    ids = [5] * (server.config.max_model_len + 1) + ["not an id"]
    error = _post(server, COMPLETIONS, {"prompt": ids, "max_tokens": 1}).json()["error"]
    assert error["param"] == "prompt" and "maximum context length" in error["message"]


def test_a_huge_number_is_quoted_short(server):
    """1e308 sent as max_tokens passed the integer check as a 309-digit int, and the 400 quoted it whole."""
    error = _post(server, COMPLETIONS, {"prompt": "hi", "max_tokens": 1e308}).json()["error"]
    assert error["param"] == "max_tokens" and "1e+308" in error["message"] and len(error["message"]) < 120


def test_oversized_body_is_413(server):
    big = {"prompt": "x" * (server.config.max_request_bytes + 10)}
    response = httpx.post(server.base_url + COMPLETIONS, json=big)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_oversized_chunked_body_is_413(server):
    def chunks():
        for _ in range(server.config.max_request_bytes // 1024 + 2):
            yield b" " * 1024

    response = httpx.post(server.base_url + COMPLETIONS, content=chunks(),
                          headers={"content-type": "application/json"})
    assert response.status_code == 413


def test_unknown_route_and_wrong_method(server):
    missing = httpx.get(server.base_url + "/v1/nothing")
    assert missing.status_code == 404 and "error" in missing.json()
    wrong = httpx.get(server.base_url + COMPLETIONS)
    assert wrong.status_code == 405 and "error" in wrong.json()
    assert wrong.headers["allow"] == "POST"  # a 405 names the methods the route takes (it did not)
    options = httpx.options(server.base_url + "/v1/models")
    assert options.status_code == 405 and set(options.headers["allow"].split(", ")) == {"GET", "HEAD"}
    health = httpx.post(server.base_url + "/health")  # answered before routing: it said 404
    assert health.status_code == 405 and health.headers["allow"] == "GET, HEAD" and "error" in health.json()
    slash = httpx.post(server.base_url + COMPLETIONS + "/", json={"prompt": "hi", "max_tokens": 1})
    assert slash.status_code == 307 and slash.headers["location"] == server.base_url + COMPLETIONS


def test_server_keeps_serving_and_leaks_nothing_after_bad_input(server, client):
    for path, body, _, _ in CASES[:8]:
        _post(server, path, body)
    out = client.completions.create(model=server.served.name, prompt="still alive", max_tokens=3, temperature=0)
    assert out.usage.completion_tokens == 3
    server.wait_idle()


def test_failed_step_fails_only_its_requests(server, client):
    """An executor exception mid-step answers that request with a 500 and leaves the engine serving."""
    executors = server.engine.executors

    class FailsOnce:
        failed = False

        def execute(self, batch, on_launch=None):
            if not self.failed:
                self.failed = True
                raise RuntimeError("injected device failure")
            return executors.execute(batch, on_launch)

    server.on_loop(lambda: setattr(server.engine, "executors", FailsOnce()))
    try:
        response = httpx.post(server.base_url + COMPLETIONS, json={"prompt": "boom", "max_tokens": 4})
        assert response.status_code == 500
        assert "injected device failure" in response.json()["error"]["message"]
    finally:
        server.on_loop(lambda: setattr(server.engine, "executors", executors))
    ok = client.completions.create(model=server.served.name, prompt="fine", max_tokens=2, temperature=0)
    assert ok.usage.completion_tokens == 2
    server.wait_idle()


def test_ids_the_model_cannot_embed_are_400(demo_model, tmp_path):
    """A tokenizer that knows more ids than the checkpoint embeds (the demo tokenizer's 2,048 on
    a 1,024-row embedding): naming one, in a prompt, a sampling field or a text that encodes to
    it, is a 400 naming the field, not a step that fails (500) and is retried beside others."""
    path = make_checkpoint(tmp_path / "small-vocab", "qwen3", vocab_size=1024)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(demo_model / name, path / name)
    with ServerThread(Config(model=str(path), num_kv_blocks=64, max_model_len=256)) as srv:
        tokenizer = srv.served.tokenizer
        text = next(t for t in (tokenizer.decode([i]) for i in range(1500, 2000))
                    if max(tokenizer.encode(t, False)) >= 1024)
        cases = [
            (COMPLETIONS, {"prompt": [1500, 3], "max_tokens": 1}, "prompt"),
            ("/v1/embeddings", {"input": [[5], [1500]]}, "input"),
            (COMPLETIONS, {"prompt": "hi", "max_tokens": 2, "logit_bias": {"1500": 5}}, "logit_bias"),
            (COMPLETIONS, {"prompt": "hi", "max_tokens": 1, "allowed_token_ids": [1500]}, "allowed_token_ids"),
            (COMPLETIONS, {"prompt": "hi", "max_tokens": 2, "min_tokens": 1, "stop_token_ids": [1500]},
             "stop_token_ids"),
            ("/v1/score", {"query": "q", "items": ["a"], "label_token_ids": [1500]}, "label_token_ids"),
            (COMPLETIONS, {"prompt": "hi" + text, "max_tokens": 1}, None),
        ]
        for route, body, param in cases:
            response = _post(srv, route, body)
            assert response.status_code == 400, (body, response.text)
            assert response.json()["error"]["param"] == param
        # A top_k past the model's vocabulary cuts nothing, like one past the tokenizer's.
        response = _post(srv, COMPLETIONS, {"prompt": "hi", "max_tokens": 2, "top_k": 1500})
        assert response.status_code == 200, response.text
        srv.wait_idle()


def test_depth_check_sees_brackets_in_strings_and_escaped_quotes_for_what_they_are():
    """The depth check masks strings with whole-array passes (a regex match per string had cost
    2-3x orjson's own parse on a body of many short strings, on the event loop; its speed is
    measured, not asserted here): brackets inside strings never count, and a quote escaped by
    an odd run of backslashes does not end its string."""
    import orjson

    from prelude.server.protocol import MAX_JSON_DEPTH, json_depth_exceeds

    assert not json_depth_exceeds(orjson.dumps({"prompt": "hi", "junk": [["x", "[[", "]"] * 8] * 1_000}))
    deep = b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1)
    for text in (b'["\\\\", ' + deep + b"]", b'{"a": "\\"' + b"]" * 70 + b'", "b": ' + deep + b"}"):
        assert json_depth_exceeds(text)
    assert not json_depth_exceeds(b'["\\"' + b"[" * 70 + b'", 1]')


def test_a_body_with_a_utf8_byte_order_mark_is_read(server):
    """A JSON file saved as "UTF-8 with BOM" (Windows PowerShell's utf8) and posted as is: read as
    vLLM's server reads it (Python's json skips the mark), not a 400. Only a leading mark."""
    body = b"\xef\xbb\xbf" + json.dumps({"prompt": "hi", "max_tokens": 1}).encode()
    response = httpx.post(server.base_url + COMPLETIONS, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    inner = b'{"prompt": "hi",\xef\xbb\xbf "max_tokens": 1}'
    response = httpx.post(server.base_url + COMPLETIONS, content=inner, headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"


def test_a_compressed_body_is_refused_for_its_encoding(server):
    """A gzip body (Content-Encoding: gzip) was a 400 "not valid JSON: ... not valid UTF-8", which
    sent its client looking for a bad character: a 415 names the encoding (RFC 9110)."""
    import gzip

    body = gzip.compress(json.dumps({"prompt": "hi", "max_tokens": 1}).encode())
    response = httpx.post(server.base_url + COMPLETIONS, content=body,
                          headers={"content-type": "application/json", "content-encoding": "gzip"})
    assert response.status_code == 415 and "gzip" in response.json()["error"]["message"]
