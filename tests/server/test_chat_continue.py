"""vLLM's chat `continue_final_message` through the real `openai` client over loopback HTTP: the
prompt stops right after the final message's content, so the answer carries on inside that
message (a judge's prefilled "The verdict is"), instead of the template closing it and opening
a new one. The cut is transformers' (a prefill's trailing space stays, unless the template trims
the content). And non-empty text parts join with newlines, and null content is "", as vLLM
renders them."""
from __future__ import annotations

import httpx
import pytest
from transformers import AutoTokenizer

from prelude.contract.config import Config
from tests.checkpoints import edited_copy
from tests.server.harness import ServerThread

PREFILL = [{"role": "user", "content": "Is the sky green?"}, {"role": "assistant", "content": "The answer is"}]
CONTINUE = {"continue_final_message": True, "add_generation_prompt": False}


@pytest.fixture(scope="module")
def model(server):
    return server.served.name


def _ids(server, body: dict) -> list[int]:
    response = httpx.post(server.base_url + "/tokenize", json=body)
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


def _text(server, ids: list[int]) -> str:
    return httpx.post(server.base_url + "/detokenize", json={"tokens": ids}).json()["prompt"]


def test_the_prompt_ends_with_the_final_message_content(server):
    closed = _text(server, _ids(server, {"messages": PREFILL, "add_generation_prompt": False}))
    # What the template writes after the content (end of turn) is there without the flag only.
    assert not closed.endswith("The answer is")
    expected = closed[:closed.rindex("The answer is") + len("The answer is")]
    continued = _ids(server, {"messages": PREFILL, **CONTINUE})
    assert continued == _ids(server, {"prompt": expected, "add_special_tokens": False})


def test_chat_template_kwargs_carry_the_flags_too(server):
    """vLLM merges chat_template_kwargs over the request's own fields into the template call;
    continue_final_message given there was dropped (the prefill closed, another answer)."""
    continued = _ids(server, {"messages": PREFILL, **CONTINUE})
    assert _ids(server, {"messages": PREFILL, "chat_template_kwargs": CONTINUE}) == continued
    assert _ids(server, {"messages": PREFILL, "add_generation_prompt": False,
                         "chat_template_kwargs": {"continue_final_message": True}}) == continued
    closed = {"messages": PREFILL, **CONTINUE, "chat_template_kwargs": {"continue_final_message": False}}
    assert _ids(server, closed) == _ids(server, {"messages": PREFILL, "add_generation_prompt": False})


def test_the_answer_carries_on_the_final_message(server, client, model):
    continued = _ids(server, {"messages": PREFILL, **CONTINUE})
    want = client.completions.create(model=model, prompt=continued, max_tokens=5, temperature=0).choices[0].text
    answer = client.chat.completions.create(model=model, messages=PREFILL, max_tokens=5, temperature=0,
                                            extra_body=CONTINUE)
    assert (answer.choices[0].message.role, answer.choices[0].message.content) == ("assistant", want)
    echoed = client.chat.completions.create(model=model, messages=PREFILL, max_tokens=5, temperature=0,
                                            extra_body={**CONTINUE, "echo": True})
    assert echoed.choices[0].message.content == "The answer is" + want


def test_text_parts_join_with_newlines(server):
    # Empty parts add no newline, as in vLLM (one between every part made another prompt).
    parts = [{"type": "text", "text": t} for t in ("", "first", "", "second", "")]
    assert _ids(server, {"messages": [{"role": "user", "content": parts}]}) == \
        _ids(server, {"messages": [{"role": "user", "content": "first\nsecond"}]})


def test_every_kind_of_text_part_reads_as_text(server):
    """An assistant's refusal part (the OpenAI SDK types allow one), the Responses API's
    input_text and output_text, a bare string: text to vLLM, 400s here before."""
    parts = ["first", {"type": "input_text", "text": "second"}, {"type": "refusal", "refusal": "third"},
             {"type": "output_text", "text": "fourth"}]
    assert _ids(server, {"messages": [{"role": "user", "content": parts}]}) == \
        _ids(server, {"messages": [{"role": "user", "content": "first\nsecond\nthird\nfourth"}]})
    image = {"type": "image_url", "image_url": {"url": "http://x/y.png"}}
    response = httpx.post(server.base_url + "/tokenize", json={"messages": [{"role": "user", "content": [image]}]})
    assert response.status_code == 400, response.text


def test_null_or_absent_content_renders_as_empty(server, client, model):
    """An assistant turn replayed with tool_calls has "content": null (the openai SDK's own
    message dump); vLLM renders it, and a missing content, as "". The demo's ChatML template
    concatenates the content, as many checkpoints' do, and failed on None (a 400)."""
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    replay = [{"role": "user", "content": "Look it up"}, {"role": "assistant", "content": None, "tool_calls": [call]},
              {"role": "tool", "content": "42", "tool_call_id": "call_1"}]
    empty = [replay[0], {**replay[1], "content": ""}, replay[2]]
    assert _ids(server, {"messages": replay}) == _ids(server, {"messages": empty})
    answer = client.chat.completions.create(model=model, messages=replay, max_tokens=2, temperature=0)
    assert answer.choices[0].finish_reason == "length"
    empty = {"messages": [{"role": "user", "content": ""}]}
    assert _ids(server, {"messages": [{"role": "user"}]}) == _ids(server, empty)


# A template that trims each message's content, as some checkpoints' do.
TRIMMING = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module", params=["checkpoint", "trimming"])
def template_server(request, demo_model, tmp_path_factory):
    path = demo_model if request.param == "checkpoint" else edited_copy(
        demo_model, tmp_path_factory.mktemp("trimming-template"), "tokenizer_config.json",
        lambda config: config.update(chat_template=TRIMMING))
    with ServerThread(Config(model=str(path), block_size=4, max_model_len=512, num_kv_blocks=256)) as srv:
        yield srv, AutoTokenizer.from_pretrained(path)


@pytest.mark.parametrize("prefill", ["The verdict is ", "Answer:\n", "  padded  ", "", "is is"])
def test_the_prompt_is_cut_where_transformers_cuts(template_server, prefill):
    # Cut after the stripped content, "The verdict is " lost its space: the answer then began
    # with one the prompt should have held, another token and so another answer than vLLM's.
    server, reference = template_server
    messages = [{"role": "user", "content": "Is it green?"}, {"role": "assistant", "content": prefill}]
    expected = reference.apply_chat_template(messages, tokenize=False, continue_final_message=True,
                                             add_generation_prompt=False)
    assert _text(server, _ids(server, {"messages": messages, **CONTINUE})) == expected
