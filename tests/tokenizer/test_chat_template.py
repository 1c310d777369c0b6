"""Chat templates of real checkpoints render exactly what transformers' apply_chat_template does."""
from __future__ import annotations

import pytest

from prelude.tokenizer.chat import ChatTemplate, ChatTemplateError
from tests.data import hf_reference_tokenizer, tokenizer_dir

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3? 你好 😀"}],
]


@pytest.mark.parametrize("name", ["qwen3", "deepseek-v3", "phi3-mini"])
@pytest.mark.parametrize("conversation", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_renders_like_transformers(name, conversation, generation_prompt):
    ref = hf_reference_tokenizer(name)
    ours = ChatTemplate.from_dir(tokenizer_dir(name))
    messages = CONVERSATIONS[conversation]
    expected = ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    assert ours.render(messages, add_generation_prompt=generation_prompt) == expected


def test_template_kwargs_reach_the_template():
    ours = ChatTemplate.from_dir(tokenizer_dir("qwen3"))
    ref = hf_reference_tokenizer("qwen3")
    messages = CONVERSATIONS[0]
    expected = ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert ours.render(messages, enable_thinking=False) == expected
    assert expected != ours.render(messages)


def test_a_tokenizer_without_a_template_has_none():
    assert ChatTemplate.from_dir(tokenizer_dir("llama3.2-vision")) is None


def test_template_errors_are_chat_template_errors():
    template = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        template.render([{"role": "user", "content": "x"}])
