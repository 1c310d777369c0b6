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
        # A prompt ending inside a character (ids sent back cut mid-character): its partial
        # tokens count as unread, so the output token completing the character emits it whole.
        # Read, the character took the place of the context's U+FFFD, no new text showed, and
        # it was in neither answer. Never completed, the partial's U+FFFD is not the answer's.
        while self.read_offset and tokenizer.decode(self.ids[:self.read_offset],
                                                    skip_special_tokens).endswith("\ufffd"):
            self.read_offset -= 1
        self._prompt_partial = self.read_offset < len(self.ids)
        self.skip_special_tokens = skip_special_tokens
        self.stops = [_StopString(s) for s in stop if s]
        self.include_stop = include_stop  # the text keeps the stop string (vLLM's include_stop_str_in_output)
        # Text not yet emitted: what a stop string may still end or hold back. Emitted text is
        # dropped (it was the whole answer so far, copied whole at every token).
        self.text = ""

    def add(self, token_id: int, stops_armed: bool = True) -> str | None:
        """Adds a token; returns the stop string when the text now contains one (the text is cut
        before it), else None. Unarmed (the answer is still short of min_tokens), the token's text
        cannot end a stop string, as in vLLM: one that ends in a later token's text still counts
        the characters before it."""
        self.ids.append(token_id)
        step = self.tokenizer.decode_step(self.ids, self.prefix_offset, self.read_offset,
                                          self.skip_special_tokens)
        self.prefix_offset, self.read_offset = step.prefix_offset, step.read_offset
        text = step.text
        if text and self._prompt_partial:
            text, self._prompt_partial = text.lstrip("\ufffd"), False
        return self._append(text, stops_armed) if text else None

    def finish(self) -> str | None:
        """At the answer's end (not at a stop string): the text of the ids held back while their
        decoding ended inside a character, less only that last partial character (the held ids
        were dropped whole, and with them every whole character before it), which is one U+FFFD
        a byte (SentencePiece byte fallback) or one in all (byte-level BPE). Returns the stop
        string it completes, if it does."""
        if self.read_offset == len(self.ids):
            return None
        context = self.tokenizer.decode(self.ids[self.prefix_offset:self.read_offset], self.skip_special_tokens)
        text = self.tokenizer.decode(self.ids[self.prefix_offset:], self.skip_special_tokens)[len(context):]
        self.prefix_offset = self.read_offset = len(self.ids)
        text = text.strip("\ufffd") if self._prompt_partial else text.rstrip("\ufffd")
        return self._append(text, True) if text else None

    def _append(self, text: str, stops_armed: bool) -> str | None:
        """New text onto what is not yet emitted; the stop string it completes, if any."""
        start = len(self.text)
        self.text += text
        # The first stop string the text completes ends it, as if generation had stopped right
        # there, whatever the list's order (one token may hold two): the text before it then
        # holds no other whole stop string.
        for end in range(start + 1, len(self.text) + 1) if self.stops else ():
            char = self.text[end - 1]
            for stop in self.stops:
                if stop.feed(char):
                    if not stops_armed:
                        stop.rearm()
                        continue
                    self.text = self.text[:end if self.include_stop else end - len(stop.text)]
                    return stop.text
        return None

    def emit(self, final: bool) -> str:
        """Text not yet emitted. Until the end, a tail that could still grow into a stop string
        is held back."""
        if final or not self.stops:
            delta, self.text = self.text, ""
            return delta
        # A stop string's matched prefix is never emitted: it grows by at most a character of
        # new text per character, so it lies within the text held back and what came since.
        upto = len(self.text) - max(stop.matched for stop in self.stops)
        delta, self.text = self.text[:upto], self.text[upto:]
        return delta


class _StopString:
    """One stop string, matched character by character as the text arrives (Knuth-Morris-Pratt):
    `matched` is the longest prefix of it that the text ends with. Finding it and knowing what to
    hold back cost O(1) per character, amortized, however long the stop string and the text;
    searching the text and testing its suffixes for each token grew with both, on the event loop
    (16 stop strings of 4,000 characters slowed everyone's decode steps twentyfold)."""

    __slots__ = ("text", "matched", "_borders")

    def __init__(self, text: str):
        self.text = text
        self.matched = 0
        # _borders[j]: the longest proper prefix of text[:j + 1] that is also its suffix; filled
        # only as far as `matched` has got, so a long stop string costs nothing up front.
        self._borders = [0]

    def feed(self, char: str) -> bool:
        """Advances over one character of the text; whether the stop string now ends it (it is
        not fed after that)."""
        text, k = self.text, self.matched
        while k and text[k] != char:
            k = self._border(k)
        if text[k] == char:
            k += 1
        self.matched = k
        return k == len(text)

    def rearm(self) -> None:
        """After a whole match that did not count: matching goes on from its longest border, as
        if the last character had not completed it."""
        self.matched = self._border(len(self.text))

    def _border(self, k: int) -> int:
        """_borders[k - 1], computed on first use."""
        text, borders = self.text, self._borders
        while len(borders) < k:
            j = len(borders)
            b = borders[j - 1]
            while b and text[j] != text[b]:
                b = borders[b - 1]
            borders.append(b + 1 if text[j] == text[b] else 0)
        return borders[k - 1]
