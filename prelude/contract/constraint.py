"""What a row under a grammar constraint carries into the step: its request's grammar state.

The state lives as long as its request, is created by the server from a compiled grammar, and
is only ever advanced in the engine's step thread, one step at a time, by the executor that
fills the row's token mask (prelude.structured.masks) and samples its token."""
from __future__ import annotations

from typing import Protocol


class GrammarFailed(ValueError):
    """A request's grammar could not go on mid-answer (the library's matcher failed: a
    constraint too large for its limits, found only as the answer grows). The request's fault,
    not the server's: it ends with an error rather than with text that breaks its constraint."""


class TokenConstraint(Protocol):
    def catch_up(self, step: int, last_token: int) -> None:
        """Brings the state up to the row about to sample token `step`: the token before it,
        `last_token` (the row's last input), is consumed once, whatever re-runs the row."""
        ...

    def forced_after(self, step: int, token: int, limit: int) -> tuple[int, ...]:
        """After the row that sampled token `step`: the tokens the grammar forces next (at
        most `limit`), which the answer takes without sampling them."""
        ...
