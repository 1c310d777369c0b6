"""A chat request's prompt text: its messages checked and rendered with the checkpoint's chat
template (/v1/chat/completions, and /tokenize with `messages`)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial

from prelude.server.admission import Admission
from prelude.server.errors import bad_request
from prelude.server.protocol import Body
from prelude.tokenizer.chat import ChatTemplate, ChatTemplateError

# Up to this many messages and content parts a render costs well under a millisecond and runs on
# the event loop. Past it, it runs in the tokenizer pool: a template is interpreted Python, and
# real ones (Qwen3's) cost ~13 us a message, so a 4 MB conversation held the loop (every stream,
# every probe) for over a second.
INLINE_PIECES = 32
# Appended to the final message's content for continue_final_message, and found again in the
# rendered text: HF's own mark, trailing space included (whether the template kept it tells
# whether it trimmed the content).
CONTINUE_MARK = "CONTINUE_FINAL_MESSAGE_TAG "
ASSISTANT = "assistant"  # the answer's role after a generation prompt (vLLM's --response-role default)


def _pieces(messages: list) -> int:
    """Messages plus their content parts, counted only up to the inline limit."""
    count = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        count += len(content) if isinstance(content, list) else 1
        if count > INLINE_PIECES:
            break
    return count


def checked_messages(messages: list, parts: bool = False) -> list[dict]:
    """The messages as the template reads them: objects with a string role and string content
    (non-empty text parts joined by newlines; null or absent is "", as vLLM renders it: an
    assistant turn replayed with tool_calls has "content": null, and templates that concatenate
    the content, ChatML ones among them, fail on None). `parts`: for a template that reads the
    content as a list of parts, a list of {"type": "text", "text": ...} instead (a string is one
    part, null none), as vLLM hands it over (joined, such a template read the text as characters
    and rendered nothing). Other null fields are left out, as vLLM leaves them: clients send
    "tool_calls": null on plain assistant turns, and templates that test `'tool_calls' in
    message` (Llama 3.1's, DeepSeek-V3's) failed on it."""
    out = []
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad_request(f"'{param}' must be an object with a string 'role'", param)
        message = {key: value for key, value in message.items() if value is not None or key == "content"}
        content = message.get("content")
        if isinstance(content, list):
            listed = _text_parts([_part_text(part, f"{param}.content") for part in content])
            message["content"] = listed if parts else _content_text(listed)
        elif content is None:
            message["content"] = [] if parts else ""
        elif not isinstance(content, str):
            raise bad_request(f"'{param}.content' must be a string or an array of text parts", f"{param}.content")
        elif parts:
            message["content"] = _text_parts([content])
        if message["role"] == "assistant" and isinstance(message.get("tool_calls"), list):
            message = _with_parsed_tool_calls(message, param)
        out.append(message)
    return out


def _text_parts(texts: list[str]) -> list[dict]:
    return [{"type": "text", "text": text} for text in texts]


def _content_text(content: str | list[dict]) -> str:
    """A checked message's content as text: its non-empty parts' texts joined by newlines
    (vLLM's join for string-content templates: an empty part adds no newline)."""
    return content if isinstance(content, str) else "\n".join(part["text"] for part in content if part["text"])


def _part_text(part: object, param: str) -> str:
    """A content part's text, by every name vLLM reads text under: a text part, an assistant's
    refusal (the OpenAI SDK's types allow one), the Responses API's input_text and output_text,
    or a bare string."""
    if isinstance(part, str):
        return part
    kind = part.get("type") if isinstance(part, dict) else None
    text = part.get("refusal" if kind == "refusal" else "text") if isinstance(part, dict) else None
    if kind not in ("text", "refusal", "input_text", "output_text") or not isinstance(text, str):
        raise bad_request(f"'{param}' supports only text parts", param)
    return text


def _with_parsed_tool_calls(message: dict, param: str) -> dict:
    """An assistant message's tool calls as vLLM hands them to the template: each call's
    `function.arguments` parsed from the OpenAI wire format's JSON string into an object (absent
    or empty: {}), and an empty list dropped. Templates that write the arguments with `tojson`
    (Qwen2.5's, Llama 3.1's) rendered the string quoted and escaped, a prompt unlike vLLM's."""
    if not message["tool_calls"]:
        return {key: value for key, value in message.items() if key != "tool_calls"}
    calls = []
    for j, call in enumerate(message["tool_calls"]):
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and not isinstance(function.get("arguments"), (dict, list)):
            arguments = function.get("arguments") or {}
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except ValueError:
                    name = f"{param}.tool_calls[{j}].function.arguments"
                    raise bad_request(f"'{name}' must be a JSON object encoded as a string", name) from None
            call = dict(call, function=dict(function, arguments=arguments))
        calls.append(call)
    return dict(message, tool_calls=calls)


@dataclass(frozen=True, slots=True)
class RenderedChat:
    """A chat request's prompt text, and how its answer carries on from the messages."""

    text: str
    # The answer's role: the assistant's after a generation prompt; without one the model goes
    # on with the last message, so that message's role (vLLM's rule).
    role: str
    # What vLLM's chat `echo` puts before the answer: the last message's content when the answer
    # continues it (the same role), else nothing.
    echo: str
    # Whether the answer starts a turn of its own after the template's generation prompt (else it
    # goes on with the last message).
    generation_prompt: bool


class ChatPrompt:
    def __init__(self, template: ChatTemplate | None, admission: Admission):
        self.template = template
        self.admission = admission

    async def render(self, body: Body) -> RenderedChat:
        if self.template is None:
            raise bad_request("this model has no chat template; use /v1/completions")
        if body.str("chat_template") is not None:
            # vLLM refuses a request's own template unless --trust-request-chat-template (it is
            # code the server runs); this server has no such flag. Ignored, the checkpoint's
            # template rendered a prompt the client did not write.
            raise bad_request("'chat_template' in a request is not supported: the server renders with the "
                              "model's chat template (vLLM refuses it too without "
                              "--trust-request-chat-template)", "chat_template")
        messages = body.list("messages", nonempty=True)
        if messages is None:
            raise bad_request("'messages' is required", "messages")
        kwargs = body.object("chat_template_kwargs")
        # As in vLLM, chat_template_kwargs override the request's own template fields: clients
        # written for it send {"add_generation_prompt": false} there.
        options = {"add_generation_prompt": body.bool("add_generation_prompt", True), "tools": body.list("tools"),
                   **_documents(body), **(kwargs.data if kwargs else {})}
        continue_final = body.bool("continue_final_message")
        if "continue_final_message" in options:  # vLLM passes it on to the template call, where HF's reads it
            continue_final = bool(options.pop("continue_final_message"))
        if continue_final and options["add_generation_prompt"]:
            raise bad_request("'continue_final_message' and 'add_generation_prompt' cannot both be true (as in "
                              "vLLM): send \"add_generation_prompt\": false", "continue_final_message")
        render = partial(self._render, self.template, messages, options, continue_final)
        if _pieces(messages) <= INLINE_PIECES:
            return render()
        return await self.admission.offload(render)

    @staticmethod
    def _render(template: ChatTemplate, messages: list, options: dict, continue_final: bool) -> RenderedChat:
        checked = checked_messages(messages, template.reads_content_parts(options.get("tools") is not None))
        try:
            if continue_final:
                final, marked = _marked(checked[-1])
                text = _left_open(template.render([*checked[:-1], marked], **options), final)
            else:
                text = template.render(checked, **options)
        except ChatTemplateError as exc:
            raise bad_request(str(exc), "messages") from None
        except TypeError as exc:
            raise bad_request(f"invalid chat_template_kwargs: {exc}", "chat_template_kwargs") from None
        last = checked[-1]
        # Truthiness, as the template tests it (chat_template_kwargs may set any JSON value).
        generation_prompt = bool(options.get("add_generation_prompt"))
        role = ASSISTANT if generation_prompt else last["role"]
        echo = _content_text(last["content"]) if last["role"] == role else ""
        return RenderedChat(text, role, echo, generation_prompt)


def _marked(message: dict) -> tuple[str, dict]:
    """The final message's text the answer carries on from, and the message with CONTINUE_MARK
    after it (after its last text part, as transformers continues a message of parts)."""
    content = message["content"]
    if isinstance(content, str):
        return content, dict(message, content=content + CONTINUE_MARK)
    if not content:
        return "", dict(message, content=_text_parts([CONTINUE_MARK]))
    final = content[-1]["text"]
    return final, dict(message, content=[*content[:-1], *_text_parts([final + CONTINUE_MARK])])


def _documents(body: Body) -> dict:
    """vLLM's chat `documents` (objects of strings, for retrieval-augmented templates such as
    Command-R's and Granite's), handed to the template as `documents`: it was dropped, and the
    answer came without them."""
    documents = body.list("documents")
    if documents is None:
        return {}
    if not all(isinstance(d, dict) and all(isinstance(v, str) for v in d.values()) for d in documents):
        raise bad_request("'documents' must be an array of objects of strings", "documents")
    return {"documents": documents}


def _left_open(text: str, final: str) -> str:
    """The chat rendered with CONTINUE_MARK after the final message's content, cut right before
    the mark, so that the answer carries on inside that message (a prefilled "The verdict is "):
    what the template wrote after it (end of turn, next header) goes. HF's
    apply_chat_template(continue_final_message=True) cuts so, and vLLM's users get its cut: the
    content's trailing whitespace stays, unless the template trimmed the content (the mark's own
    space is gone), and then the text before the mark is trimmed too. Cut after the content
    found in the text instead, stripped, a prefill's trailing space was lost: the answer began
    with a space the prompt should have held (another token, another answer)."""
    mark = text.rfind(CONTINUE_MARK.strip())
    if mark < 0 or final.strip() not in text:
        raise bad_request("'continue_final_message' needs the final message's content in the prompt; its "
                          "content does not appear verbatim in the rendered chat template", "continue_final_message")
    return text[:mark] if text.startswith(CONTINUE_MARK, mark) else text[:mark].rstrip()

