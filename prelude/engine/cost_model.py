"""How long a step takes, learned online from the steps the engine runs: seconds ~ a + b x
tokens, fitted by exponentially weighted least squares so it follows the machine (and the model,
and what else shares the cores). The JCT-aware and deadline policies estimate a waiting
request's cost from it (PrefillOnly's continuous calibration), and deadline-aware batching
predicts a step's length with it."""
from __future__ import annotations

# Before the first measurements: a millisecond per step plus 20 µs per token, the right order
# for a small model on a CPU; a few steps replace it.
PRIOR_FIXED_S = 1e-3
PRIOR_PER_TOKEN_S = 20e-6
DECAY = 0.98  # weight of the past per observed step: about the last 50 steps count


class StepCostModel:
    def __init__(self) -> None:
        self.fixed_s = PRIOR_FIXED_S
        self.per_token_s = PRIOR_PER_TOKEN_S
        self._w = self._x = self._y = self._xx = self._xy = 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        d = DECAY
        w = self._w = d * self._w + 1.0
        x = self._x = d * self._x + tokens
        y = self._y = d * self._y + seconds
        xx = self._xx = d * self._xx + tokens * tokens
        xy = self._xy = d * self._xy + tokens * seconds
        var = w * xx - x * x
        if var <= 1e-9 * max(1.0, xx * w):  # all steps the same size: only a rate
            if x > 0:
                self.per_token_s = max(y / x, 0.0)
                self.fixed_s = 0.0
            return
        slope = (w * xy - x * y) / var
        self.per_token_s = per_token = max(slope, 1e-9)
        self.fixed_s = max((y - per_token * x) / w, 0.0)

    def estimate(self, tokens: int) -> float:
        """Seconds a step computing `tokens` is expected to take."""
        return self.fixed_s + self.per_token_s * tokens

    def tokens_within(self, seconds: float) -> int:
        """How many tokens a step may compute and still be expected to take at most `seconds`."""
        return int(max(seconds - self.fixed_s, 0.0) / max(self.per_token_s, 1e-9))
