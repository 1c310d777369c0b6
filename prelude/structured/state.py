"""One request's place in its grammar."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from prelude.contract.constraint import GrammarFailed

if TYPE_CHECKING:
    import llguidance


class GrammarState:
    """An llguidance matcher and how many of the request's tokens it has seen. Tokens are
    consumed lazily, when the row that follows them samples (`catch_up`), or right after the
    row that sampled them when the grammar forces what comes next (`forced_after`). Either way
    a row that is run again (after a failure) finds the state as its first run did: what that
    run consumed is taken back.

    With `reasoning_end`, tokens up to and including that one (the end of a reasoning block)
    are the model's own: no mask applies until it came."""

    __slots__ = ("matcher", "mask_words", "seen", "reasoning_end", "_last", "_on_failure")

    def __init__(self, matcher: llguidance.LLMatcher, mask_words: int, reasoning_end: int | None = None,
                 on_failure: Callable[[], None] | None = None):
        """`on_failure`: called when the matcher fails (the compiled grammar it was copied from
        is not to be copied again: the copies share the library's lexer and its limits)."""
        self.matcher = matcher
        self._on_failure = on_failure
        self.mask_words = mask_words  # int32 words of its token mask (its tokenizer's vocabulary / 32)
        self.seen = 0  # tokens of the answer accounted for (consumed, or reasoning)
        self.reasoning_end = reasoning_end
        # The last forced_after: (its step, tokens the matcher consumed, reasoning_end before).
        self._last: tuple[int, int, int | None] | None = None

    @property
    def reasoning(self) -> bool:
        """Still inside the reasoning block: the next token is unconstrained."""
        return self.reasoning_end is not None

    def catch_up(self, step: int, last_token: int) -> None:
        if self.seen > step:
            self._take_back(step)
        if self.seen == step:
            return
        assert self.seen == step - 1, f"grammar state at token {self.seen}, row samples token {step}"
        self.seen = step
        if self.reasoning_end is not None:
            if last_token == self.reasoning_end:
                self.reasoning_end = None
            return
        complete = self.matcher.is_stopped()
        self.matcher.consume_token(last_token)  # other failures show in the mask's check (masks._fill)
        if complete and self.matcher.is_error():  # a token past the end (EOS, repeated, is not one)
            raise GrammarFailed(f"the answer's grammar was complete after {step - 1} token(s), and the request "
                                "asked for more (min_tokens)")

    def check(self) -> None:
        """Raises GrammarFailed when the matcher failed (consuming a token, or filling a mask),
        rather than let its error state end the answer as if it were complete."""
        if self.matcher.is_error():
            if self._on_failure is not None:
                self._on_failure()
            raise GrammarFailed(f"the answer's grammar failed after {self.seen} token(s): "
                                f"{self.matcher.get_error().splitlines()[0]}")

    def forced_after(self, step: int, token: int, limit: int) -> tuple[int, ...]:
        """Consumes `token`, sampled as the answer's token `step`, and returns the tokens the
        grammar then allows alone (at most `limit`; consumed too): the answer's next tokens,
        computed in a later step with no sampling of their own (jump-forward decoding). They
        are llguidance's tokens for the forced text, so the text is what sampling would give."""
        if self.seen > step:
            self._take_back(step)
        reasoning_end = self.reasoning_end
        self.catch_up(step + 1, token)
        forced: list[int] = []
        if reasoning_end is None and limit > 0 and not self.matcher.is_stopped():
            forced = self.matcher.compute_ff_tokens()[:limit]
            if forced:  # tokens the matcher itself forces: it accepts them
                self.matcher.consume_tokens(forced)
                self.seen += len(forced)
        self._last = (step, (reasoning_end is None) + len(forced), reasoning_end)
        return tuple(forced)

    def _take_back(self, step: int) -> None:
        """Back to the state the row sampling token `step` first found: it is run again."""
        assert self._last is not None and self._last[0] == step, \
            f"grammar state at token {self.seen}, row samples token {step}"
        _, consumed, self.reasoning_end = self._last
        if consumed:
            self.matcher.rollback(consumed)
        self.seen, self._last = step, None
