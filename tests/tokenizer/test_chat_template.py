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


def _with_template(tmp_path, name: str, template) -> ChatTemplate:
    """A copy of a real tokenizer's files with this chat_template in its tokenizer_config.json."""
    import json
    import shutil

    source = tokenizer_dir(name)
    shutil.copy(source / "tokenizer.json", tmp_path / "tokenizer.json")
    config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = template
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return ChatTemplate.from_dir(tmp_path)


def _transformers_tokenizer(path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(path))


def test_templates_see_every_special_token_as_in_transformers(tmp_path):
    ours = _with_template(tmp_path, "qwen3", "{{ pad_token }}|{{ eos_token }}|{{ bos_token }}|{{ unk_token }}|"
                                             "{{ bos_token is defined }}|{{ messages[0]['content'] }}")
    expected = _transformers_tokenizer(tmp_path).apply_chat_template(CONVERSATIONS[0], tokenize=False)
    assert ours.render(CONVERSATIONS[0]) == expected == "<|endoftext|>|<|im_end|>|||False|Hello!"


def test_requests_with_tools_get_the_tool_use_template_as_in_transformers(tmp_path):
    named = [{"name": "default", "template": "plain {{ messages[0]['content'] }}"},
             {"name": "tool_use", "template": "tools {{ tools | length }} {{ messages[0]['content'] }}"}]
    ours = _with_template(tmp_path, "qwen3", named)
    ref = _transformers_tokenizer(tmp_path)
    tools = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}]
    for request_tools in (None, tools):
        expected = ref.apply_chat_template(CONVERSATIONS[0], tools=request_tools, tokenize=False)
        assert ours.render(CONVERSATIONS[0], tools=request_tools) == expected
    assert ours.render(CONVERSATIONS[0], tools=tools) == "tools 1 Hello!"


def test_a_tool_use_template_saved_apart_is_read_as_in_transformers(tmp_path):
    """transformers saves named templates as additional_chat_templates/<name>.jinja beside
    chat_template.jinja: requests with tools got the default template."""
    _with_template(tmp_path, "qwen3", None)  # the tokenizer's files, no template in its config
    (tmp_path / "chat_template.jinja").write_text("plain {{ messages[0]['content'] }}", encoding="utf-8")
    (tmp_path / "additional_chat_templates").mkdir()
    (tmp_path / "additional_chat_templates" / "tool_use.jinja").write_text(
        "tools {{ tools | length }} {{ messages[0]['content'] }}", encoding="utf-8")
    ours = ChatTemplate.from_dir(tmp_path)
    ref = _transformers_tokenizer(tmp_path)
    tools = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}]
    for request_tools in (None, tools):
        expected = ref.apply_chat_template(CONVERSATIONS[0], tools=request_tools, tokenize=False)
        assert ours.render(CONVERSATIONS[0], tools=request_tools) == expected
    assert ours.render(CONVERSATIONS[0], tools=tools) == "tools 1 Hello!"


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning", "thinking"])
def test_an_assistant_turns_reasoning_reaches_the_template_by_any_name_as_in_transformers(field):
    # Qwen3's template reads `reasoning_content` only; `reasoning` (vLLM 0.32's name for it) was
    # dropped, and the turn rendered an empty think block.
    ref = hf_reference_tokenizer("qwen3")
    ours = ChatTemplate.from_dir(tokenizer_dir("qwen3"))
    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4", field: "add them"}]
    expected = ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert ours.render(messages, add_generation_prompt=False) == expected
    assert "<think>\nadd them\n</think>" in expected
