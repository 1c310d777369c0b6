"""What a row under a grammar constraint carries into the step: its request's grammar state.

The state lives as long as its request, is created by the server from a compiled grammar, and
is only ever advanced in the engine's step thread, one step at a time, by the executor that
fills the row's token mask (prelude.structured.masks)."""
from __future__ import annotations

from typing import Protocol


class TokenConstraint(Protocol):
    def catch_up(self, step: int, last_token: int) -> None:
        """Brings the state up to the row about to sample token `step`: the token before it,
        `last_token` (the row's last input), is consumed once, whatever re-runs the row."""
        ...
