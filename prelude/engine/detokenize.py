"""Incremental detokenization with stop strings, for every request that generates tokens."""
from __future__ import annotations

from typing import Sequence

from prelude.tokenizer import Tokenizer

# Prompt tokens decoded again as context, so decoders that merge across token boundaries
# (leading-space stripping, multi-byte characters) render the first output token correctly.
CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int], stop: Sequence[str],
                 skip_special_tokens: bool, include_stop: bool = False):
        self.tokenizer = tokenizer
        self.ids = list(prompt_ids[-CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.skip_special_tokens = skip_special_tokens
        self.stop = tuple(s for s in stop if s)
        self.include_stop = include_stop  # the text keeps the stop string (vLLM's include_stop_str_in_output)
        self.text = ""
        self.sent = 0  # characters of `text` already emitted

    def add(self, token_id: int) -> str | None:
        """Adds a token; returns the stop string when the text now contains one (the text is cut
        before it), else None."""
        self.ids.append(token_id)
        step = self.tokenizer.decode_step(self.ids, self.prefix_offset, self.read_offset,
                                          self.skip_special_tokens)
        self.prefix_offset, self.read_offset = step.prefix_offset, step.read_offset
        if not step.text:
            return None
        search_from = max(0, len(self.text) - max(map(len, self.stop), default=0) + 1)
        self.text += step.text
        # The earliest stop in the text ends it, whatever the order of the list: the text cut at
        # a later one would still contain the earlier (one token may hold both).
        hit = None
        for stop in self.stop:
            at = self.text.find(stop, search_from)
            if at >= 0 and (hit is None or at < hit[0]):
                hit = (at, stop)
        if hit is None:
            return None
        at, stop = hit
        self.text = self.text[:at + len(stop) if self.include_stop else at]
        return stop

    def emit(self, final: bool) -> str:
        """Text not yet emitted. Until the end, a tail that could still grow into a stop string
        is held back."""
        upto = len(self.text)
        if not final and self.stop:
            upto -= self._partial_stop_len()
        delta = self.text[self.sent:upto]
        self.sent = max(self.sent, upto)
        return delta

    def _partial_stop_len(self) -> int:
        longest = 0
        for stop in self.stop:
            for n in range(min(len(stop) - 1, len(self.text)), longest, -1):
                if self.text.endswith(stop[:n]):
                    longest = n
                    break
        return longest
