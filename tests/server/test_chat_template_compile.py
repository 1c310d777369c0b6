"""A chat template is compiled when a request first renders it, as transformers compiles it, not
at startup: a checkpoint whose template does not compile starts and serves everything else, and
the requests that render it (chat, a generative rerank's judge prompt) get a server error that
names the template, not a 400 that blames the client."""
from __future__ import annotations

import httpx
import pytest

from prelude.contract.config import Config
from tests.checkpoints import edited_copy
from tests.server.harness import ServerThread


@pytest.fixture(scope="module")
def broken_template_server(demo_model, tmp_path_factory):
    path = edited_copy(demo_model, tmp_path_factory.mktemp("broken-template"), "tokenizer_config.json",
                       lambda config: config.update(chat_template="{% for message in messages %}{{ message"))
    with ServerThread(Config(model=str(path), block_size=4, max_model_len=512, num_kv_blocks=256)) as srv:
        yield srv


def test_a_template_that_does_not_compile_fails_the_requests_that_render_it_with_a_server_error(broken_template_server):
    url = broken_template_server.base_url
    chat = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                           "max_tokens": 1})
    assert chat.status_code == 500, chat.text
    assert chat.json()["error"]["type"] == "server_error" and "chat template does not compile" in chat.text
    rerank = httpx.post(url + "/rerank", json={"query": "q", "documents": ["a doc"]})  # its judge prompt
    assert rerank.status_code == 500, rerank.text
    assert rerank.json()["error"]["type"] == "server_error" and "chat template does not compile" in rerank.text
    completion = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1})
    assert completion.status_code == 200, completion.text
