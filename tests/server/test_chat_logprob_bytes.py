"""Chat logprobs' `bytes` over real HTTP: each token's own bytes, so that the answer's tokens'
bytes join to its text even where a token holds part of a character (its `token` text is then
U+FFFD, and the bytes of that text joined to mojibake). vLLM 0.32 gives such a token no bytes."""
from __future__ import annotations

import json

import httpx

PROMPTS = ["Tell me a story", "判断这个回答", "Is it safe?", "🙂 or 🙃", "Reply in Arabic: مرحبا"]


def _streamed_entries(server, body: dict) -> list[dict]:
    text = httpx.post(server.base_url + "/v1/chat/completions", json={**body, "stream": True}, timeout=60).text
    chunks = [json.loads(line.removeprefix("data: ")) for line in text.splitlines() if line.startswith("data: {")]
    return [e for c in chunks if c["choices"] and c["choices"][0].get("logprobs")
            for e in c["choices"][0]["logprobs"]["content"]]


def test_the_tokens_bytes_join_to_the_answer(server):
    split = 0  # tokens holding part of a character
    for prompt in PROMPTS:
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 40, "temperature": 0,
                "logprobs": True, "top_logprobs": 2, "return_token_ids": True}
        choice = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60).json()["choices"][0]
        entries = choice["logprobs"]["content"]
        joined = b"".join(bytes(e["bytes"]) for e in entries)
        assert joined.decode("utf-8", errors="replace") == server.served.tokenizer.decode(choice["token_ids"])
        assert [e["bytes"] for e in _streamed_entries(server, body)] == [e["bytes"] for e in entries]
        split += sum("\ufffd" in e["token"] for e in entries)
    assert split > 0, "no answer split a character: the case this guards was not exercised"
