"""A reasoning model's answer, split as vLLM's reasoning parsers split it: the text before the
reasoning block's end in `reasoning_content`, what follows in `content` (null while the block
never ended). Whole answers and streams split the same way."""
from __future__ import annotations

from prelude.server.chat_prompt import ASSISTANT, RenderedChat

REASONING_START, REASONING_END = "<think>", "</think>"


def opens_in_reasoning(rendered: RenderedChat) -> bool:
    """Whether the answer starts inside a reasoning block (the chat template writes them), so that
    its constraint waits for the block's end. Only an assistant reasons. After a generation
    prompt the block is open unless the prompt closed it (Qwen3's enable_thinking: false renders
    an empty one); an answer going on with the last message is inside one only where the prompt
    opened a block it did not close. A prefill after Qwen3's empty block waited for a `</think>`
    the model never writes, and its answer went unconstrained."""
    if rendered.role != ASSISTANT:
        return False
    text = rendered.text
    if rendered.generation_prompt:
        return not text.rstrip().endswith(REASONING_END)
    return text.rfind(REASONING_START) > text.rfind(REASONING_END)


def split_reasoning(text: str) -> tuple[str, str | None]:
    """A whole answer's (reasoning, content); content None while the block never ended."""
    reasoning, end, content = text.partition(REASONING_END)
    return reasoning.removeprefix(REASONING_START), content if end else None


class StreamedReasoning:
    """One streamed choice's split. A stop string's hold-back can cut the markers across
    increments (a stop `">>"` holds the `>` of `</think>` back until the next token shows it is
    no stop), so text that may begin a marker waits for the increment that completes it; the
    split found the end only when it came whole, and streamed the answer as reasoning."""

    def __init__(self) -> None:
        self.reasoning = True  # before the block's end
        self._began = False  # some text came (a leading REASONING_START is dropped once)
        self._held = ""

    def delta(self, text: str, finished: bool) -> dict[str, str]:
        if not self.reasoning:
            return {"content": text} if text else {}
        text, self._held = self._held + text, ""
        if not self._began:
            if not finished and REASONING_START.startswith(text):
                self._held = text
                return {}
            self._began = bool(text)
            text = text.removeprefix(REASONING_START)
        before, end, after = text.partition(REASONING_END)
        if end:
            self.reasoning = False
        elif not finished:
            cut = len(before) - _marker_prefix(before, REASONING_END)
            before, self._held = before[:cut], before[cut:]
        delta = {"reasoning_content": before} if before else {}
        if after:
            delta["content"] = after
        return delta


def _marker_prefix(text: str, marker: str) -> int:
    """The length of the longest tail of `text` that is a proper prefix of `marker`."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0
