"""One request's place in its grammar."""
from __future__ import annotations

import llguidance


class GrammarState:
    """An llguidance matcher and how many of the request's tokens it has seen. Tokens are
    consumed lazily, when the row that follows them samples (`catch_up`): the step that sampled
    a token never changes the state, so a step that is run again (after a failure, or a
    preemption that recomputes the sequence) finds it as it was.

    With `reasoning_end`, tokens up to and including that one (the end of a reasoning block)
    are the model's own: no mask applies until it came."""

    __slots__ = ("matcher", "mask_words", "seen", "reasoning_end")

    def __init__(self, matcher: llguidance.LLMatcher, mask_words: int, reasoning_end: int | None = None):
        self.matcher = matcher
        self.mask_words = mask_words  # int32 words of its token mask (its tokenizer's vocabulary / 32)
        self.seen = 0  # tokens of the answer accounted for (consumed, or reasoning)
        self.reasoning_end = reasoning_end

    @property
    def reasoning(self) -> bool:
        """Still inside the reasoning block: the next token is unconstrained."""
        return self.reasoning_end is not None

    def catch_up(self, step: int, last_token: int) -> None:
        if self.seen >= step:
            return
        assert self.seen == step - 1, f"grammar state at token {self.seen}, row samples token {step}"
        self.seen = step
        if self.reasoning_end is not None:
            if last_token == self.reasoning_end:
                self.reasoning_end = None
            return
        # A token the mask did not allow (it cannot be sampled) leaves the matcher in its error
        # state, whose mask allows only EOS: the answer ends rather than goes on unconstrained.
        self.matcher.consume_token(last_token)
