"""A reasoning model's constraint starts after its reasoning block, which the answer carries in
reasoning_content: on a copy of the demo model whose token 0 is `</think>` (not a special token,
as in Qwen3: its text is in the answer) and whose chat template thinks (Qwen3's shape:
enable_thinking, and an empty block before an assistant message's content), a logit bias makes
`</think>` the model's favourite token."""
from __future__ import annotations

import itertools
import json
import re
import shutil

import httpx
import pytest

from prelude.contract.config import Config
from prelude.server.reasoning import StreamedReasoning, split_reasoning
from tests.server.harness import ServerThread

END = 0
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
            "{% if m['role'] == 'assistant' %}<think>\n\n</think>\n\n{% endif %}{{ m['content'] }}<|im_end|>\n"
            "{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n"
            "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
            "{% endif %}")


def _thinking_server(demo_model, tmp_path_factory, special: bool) -> ServerThread:
    path = tmp_path_factory.mktemp("thinking") / "model"
    shutil.copytree(demo_model, path)
    tokenizer = json.loads((path / "tokenizer.json").read_text())
    tokenizer["added_tokens"][END].update(content="</think>", special=special)
    vocab = tokenizer["model"]["vocab"]
    vocab["</think>"] = vocab.pop("<|endoftext|>")
    (path / "tokenizer.json").write_text(json.dumps(tokenizer))
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.update(chat_template=TEMPLATE, pad_token=None)
    config["added_tokens_decoder"][str(END)].update(content="</think>", special=special)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2]}))
    return ServerThread(Config(model=str(path), max_model_len=512, num_kv_blocks=256))


@pytest.fixture(scope="module")
def thinking(demo_model, tmp_path_factory):
    with _thinking_server(demo_model, tmp_path_factory, special=False) as srv:
        yield srv


def test_a_special_end_token_leaves_the_answer_whole(demo_model, tmp_path_factory):
    """Where `</think>` is a special token, the answer's text (special tokens skipped) has no
    block end to split at: its content stays whole, the grammar's answer after the skipped
    token, and no reasoning_content is made up."""
    with _thinking_server(demo_model, tmp_path_factory, special=True) as srv:
        choice = chat(srv)
    assert choice["token_ids"][0] == END and "reasoning_content" not in choice["message"]
    assert re.fullmatch("[0-9]{3,10}", choice["message"]["content"]), choice


def chat(srv, **body):
    body = {"model": srv.served.name, "messages": [{"role": "user", "content": "count"}], "max_tokens": 12,
            "temperature": 0.0, "logit_bias": {str(END): 100}, "guided_regex": "[0-9]{3,10}",
            "return_token_ids": True, **body}
    response = httpx.post(srv.base_url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]


def test_grammar_applies_after_the_reasoning_block(thinking):
    choice = chat(thinking)
    assert choice["token_ids"][0] == END  # the reasoning, unconstrained: the biased token
    # The content is what the grammar made: it held '</think>123...', which no parser accepts.
    assert re.fullmatch("[0-9]{3,10}", choice["message"]["content"]), choice
    assert choice["message"]["reasoning_content"] == ""
    deltas = streamed(thinking)
    assert "".join(d.get("content", "") for d in deltas) == choice["message"]["content"]
    assert not [d for d in deltas if d.get("reasoning_content")]


def test_a_stop_string_that_holds_back_the_blocks_end_leaves_the_stream_split_as_the_answer(thinking):
    """A stop string beginning with `>` holds back the `>` of `</think>` until the next token:
    the stream found no block end in either increment, and sent the answer as reasoning."""
    choice = chat(thinking, stop=[">>"])
    assert re.fullmatch("[0-9]{3,10}", choice["message"]["content"]), choice
    deltas = streamed(thinking, stop=[">>"])
    assert "".join(d.get("content", "") for d in deltas) == choice["message"]["content"]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == choice["message"]["reasoning_content"]


@pytest.mark.parametrize("text", ["<think>\nhm</think>\n\n{}", "hm </thi", "<thi", "a</think></think>b", "", "x<"])
def test_a_stream_cut_anywhere_splits_as_the_whole_answer(text):
    for cuts in itertools.combinations(range(1, len(text)), min(2, max(len(text) - 1, 0))):
        pieces = [text[i:j] for i, j in zip((0, *cuts), (*cuts, len(text)))]
        split = StreamedReasoning()
        deltas = [split.delta(piece, finished=k == len(pieces) - 1) for k, piece in enumerate(pieces)]
        reasoning, content = split_reasoning(text)
        assert "".join(d.get("reasoning_content", "") for d in deltas) == reasoning, pieces
        assert "".join(d.get("content", "") for d in deltas) == (content or ""), pieces


def test_an_unended_reasoning_block_is_all_reasoning(thinking):
    """Cut off inside its reasoning: no content, as vLLM's parsers answer."""
    choice = chat(thinking, logit_bias={}, max_tokens=3)
    assert choice["finish_reason"] == "length" and END not in choice["token_ids"]
    assert choice["message"]["content"] is None and choice["message"]["reasoning_content"]
    deltas = streamed(thinking, logit_bias={}, max_tokens=3)
    assert "".join(d.get("reasoning_content", "") for d in deltas) == choice["message"]["reasoning_content"]
    assert not [d for d in deltas if "content" in d and d["content"]]


def test_an_answer_the_prompt_put_past_the_block_is_constrained_from_its_first_token(thinking):
    """A prefill after the template's empty block, and an answer going on with a user's message:
    the constraint waited for a `</think>` that never came, and the answer went unconstrained."""
    prefill = [{"role": "user", "content": "count"}, {"role": "assistant", "content": "The count: "}]
    for body in ({"messages": prefill, "add_generation_prompt": False, "continue_final_message": True},
                 {"add_generation_prompt": False}):
        choice = chat(thinking, **body)
        assert END not in choice["token_ids"] and "reasoning_content" not in choice["message"]
        assert re.fullmatch("[0-9]{3,10}", choice["message"]["content"]), choice
    # A prefill that opens a block and leaves it open reasons first.
    opened = [{"role": "user", "content": "count"}, {"role": "assistant", "content": "<think> hm"}]
    choice = chat(thinking, messages=opened, add_generation_prompt=False, continue_final_message=True)
    assert choice["token_ids"][0] == END


def streamed(srv, **body) -> list[dict]:
    body = {"model": srv.served.name, "messages": [{"role": "user", "content": "count"}], "max_tokens": 12,
            "temperature": 0.0, "logit_bias": {str(END): 100}, "guided_regex": "[0-9]{3,10}", "stream": True,
            **body}
    response = httpx.post(srv.base_url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return [json.loads(line[6:])["choices"][0]["delta"] for line in response.text.splitlines()
            if line.startswith("data: {")]


def test_grammar_applies_from_the_first_token_without_thinking(thinking):
    choice = chat(thinking, chat_template_kwargs={"enable_thinking": False})
    assert END not in choice["token_ids"]
    assert re.fullmatch("[0-9]{3,10}", choice["message"]["content"]), choice
    completion = httpx.post(thinking.base_url + "/v1/completions", json={
        "model": thinking.served.name, "prompt": "count", "max_tokens": 12, "temperature": 0.0,
        "logit_bias": {str(END): 100}, "guided_regex": "[0-9]{3,10}", "return_token_ids": True}, timeout=60).json()
    assert END not in completion["choices"][0]["token_ids"]
