"""vLLM's chat `echo` through the real `openai` client (extra_body) over loopback HTTP: the last
message's content goes before the answer when the answer continues that message, whole and
streamed; and the answer's role is vLLM's (the last message's, without a generation prompt)."""
from __future__ import annotations

import pytest

PREFILL = [{"role": "user", "content": "Tell me a story."}, {"role": "assistant", "content": "Once upon"}]
QUESTION = [{"role": "user", "content": "Tell me a story."}]


@pytest.fixture(scope="module")
def model(server):
    return server.served.name


def _whole_and_streamed(client, model, messages, **kw):
    """The answer's (role, content), whole and as the stream's chunks add up."""
    whole = client.chat.completions.create(model=model, messages=messages, max_tokens=4, temperature=0, **kw)
    chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=4, temperature=0,
                                                 stream=True, **kw))
    message = whole.choices[0].message
    streamed = (chunks[0].choices[0].delta.role, "".join(c.choices[0].delta.content or "" for c in chunks))
    return (message.role, message.content), streamed


def test_echo_puts_the_continued_message_before_the_answer(client, model):
    plain, plain_streamed = _whole_and_streamed(client, model, PREFILL)
    echoed, echoed_streamed = _whole_and_streamed(client, model, PREFILL, extra_body={"echo": True})
    assert plain == plain_streamed and plain[0] == "assistant"
    assert echoed == echoed_streamed == ("assistant", "Once upon" + plain[1])


def test_echo_streams_the_echoed_text_first_for_every_choice(client, model):
    chunks = list(client.chat.completions.create(model=model, messages=PREFILL, max_tokens=2, n=2, stream=True,
                                                 extra_body={"echo": True}))
    first_text = {}
    for chunk in chunks:
        for choice in chunk.choices:
            if choice.delta.content:
                first_text.setdefault(choice.index, choice.delta.content)
    assert first_text == {0: "Once upon", 1: "Once upon"}


def test_echo_adds_nothing_when_the_answer_starts_a_new_message(client, model):
    """After a user message the answer is the assistant's new message: nothing of the user's is
    echoed (vLLM's rule: only a message of the answer's own role is continued)."""
    plain, _ = _whole_and_streamed(client, model, QUESTION)
    assert _whole_and_streamed(client, model, QUESTION, extra_body={"echo": True}) == (plain, plain)


@pytest.mark.parametrize("where", ["field", "chat_template_kwargs"])
def test_without_a_generation_prompt_the_answer_continues_the_last_message(client, model, where):
    """No generation prompt: the model goes on with the user's message, so the answer has the
    user's role (it said 'assistant'), and echo puts that message's text before it."""
    off = {"add_generation_prompt": False} if where == "field" else \
        {"chat_template_kwargs": {"add_generation_prompt": False}}
    plain, plain_streamed = _whole_and_streamed(client, model, QUESTION, extra_body=off)
    echoed, echoed_streamed = _whole_and_streamed(client, model, QUESTION, extra_body={**off, "echo": True})
    assert plain == plain_streamed and plain[0] == "user"
    assert echoed == echoed_streamed == ("user", "Tell me a story." + plain[1])
