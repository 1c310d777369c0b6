"""Completions' `echo` puts the prompt before the answer as the client sent it, as vLLM does: a
string prompt as is, token ids decoded. It decoded the prompt's tokens, so a tokenizer that adds
a BOS token (Llama 3's, Mistral's, Gemma's) echoed "<|begin_of_text|>Hello ..." for "Hello ...",
and `text[len(prompt):]`, the usual way to cut the answer out, cut it wrong."""
from __future__ import annotations

import json

import httpx
import pytest

from prelude.contract.config import Config
from tests.checkpoints import edited_copy
from tests.server.harness import ServerThread

BOS = "<|endoftext|>"  # the demo's id 0, added before every encoded text by this copy's tokenizer


@pytest.fixture(scope="module")
def bos_server(demo_model, tmp_path_factory):
    def add_bos(tokenizer: dict) -> None:
        bos = {"SpecialToken": {"id": BOS, "type_id": 0}}
        tokenizer["post_processor"] = {"type": "Sequence", "processors": [tokenizer["post_processor"], {
            "type": "TemplateProcessing", "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, bos, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {BOS: {"id": BOS, "ids": [0], "tokens": [BOS]}}}]}

    path = edited_copy(demo_model, tmp_path_factory.mktemp("bos-model"), "tokenizer.json", add_bos)
    with ServerThread(Config(model=str(path), block_size=4, max_model_len=256, num_kv_blocks=256)) as srv:
        yield srv


def _completion(server, **body) -> dict:
    response = httpx.post(server.base_url + "/v1/completions", json={"max_tokens": 3, "temperature": 0, **body})
    assert response.status_code == 200, response.text
    return response.json()


def _streamed_text(server, **body) -> str:
    response = httpx.post(server.base_url + "/v1/completions",
                          json={"max_tokens": 3, "temperature": 0, "stream": True, **body})
    chunks = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    return "".join(c["choices"][0]["text"] for c in chunks if c["choices"])


@pytest.mark.parametrize("logprobs", [None, 1])
def test_a_string_prompt_is_echoed_as_sent(bos_server, logprobs):
    prompt = "Hello world"
    ids = httpx.post(bos_server.base_url + "/tokenize", json={"prompt": prompt}).json()["tokens"]
    assert ids[0] == 0  # the tokenizer adds BOS
    answer = _completion(bos_server, prompt=prompt)["choices"][0]["text"]
    echoed = _completion(bos_server, prompt=prompt, echo=True, logprobs=logprobs)["choices"][0]
    assert echoed["text"] == prompt + answer
    assert _streamed_text(bos_server, prompt=prompt, echo=True, logprobs=logprobs) == prompt + answer
    if logprobs is not None:  # the echoed tokens are the prompt's, BOS first, as in vLLM
        assert echoed["logprobs"]["tokens"][0] == BOS and echoed["logprobs"]["token_logprobs"][0] is None
    # Token ids are echoed decoded: the BOS the client put there is part of them.
    by_ids = _completion(bos_server, prompt=ids, echo=True)["choices"][0]["text"]
    assert by_ids == BOS + prompt + answer
