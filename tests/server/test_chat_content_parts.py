"""A chat template that reads a message's content as a list of parts (Idefics', SmolVLM's style:
`{% for part in message['content'] %}`) gets the content as parts, a string as one text part, as
vLLM detects and hands them over: joined into one string, the template iterated its characters
and rendered the user's text as nothing, and the answer came to an empty prompt."""
from __future__ import annotations

import httpx
import pytest

from tests.server.harness import rendered_chat, with_chat_template

TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def parts_server(demo_model, tmp_path_factory):
    with with_chat_template(demo_model, tmp_path_factory.mktemp("parts-template"), TEMPLATE) as srv:
        yield srv


def test_string_and_parts_content_reach_the_template_as_parts(parts_server):
    want = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert rendered_chat(parts_server, [{"role": "user", "content": "What is 2+2?"}]) == want
    parts = [{"type": "text", "text": "What is "}, {"type": "text", "text": "2+2?"}]
    assert rendered_chat(parts_server, [{"role": "user", "content": parts}]) == want  # as the template writes them
    assert rendered_chat(parts_server, [{"role": "assistant", "content": None}], add_generation_prompt=False) == \
        "<|im_start|>assistant\n<|im_end|>\n"


def test_a_final_message_of_parts_is_continued(parts_server):
    messages = [{"role": "user", "content": "Is the sky green?"},
                {"role": "assistant", "content": [{"type": "text", "text": "The answer is"}]}]
    body = {"messages": messages, "continue_final_message": True, "add_generation_prompt": False}
    assert rendered_chat(parts_server, messages, **{k: v for k, v in body.items() if k != "messages"}).endswith(
        "<|im_start|>assistant\nThe answer is")
    answer = httpx.post(parts_server.base_url + "/v1/chat/completions",
                        json={**body, "max_tokens": 2, "temperature": 0, "echo": True}).json()
    assert answer["choices"][0]["message"]["content"].startswith("The answer is")
