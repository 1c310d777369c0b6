"""Sampling parameters: fixed at admission, read by the scheduler and the executor's sampler."""
from __future__ import annotations

from dataclasses import field

from prelude.contract.record import record

MIN_TEMPERATURE = 1e-5
_MASK64 = (1 << 64) - 1
_PRIME64 = (1 << 64) - 59  # the largest prime below 2^64: any integer seed folds into 64 bits by it


@record
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k cut
    min_p: float = 0.0  # vLLM's: drop tokens less likely than min_p x the most likely one (0 = no cut)
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # top-k alternatives reported for each generated token
    logit_bias: tuple[tuple[int, float], ...] = ()
    allowed_token_ids: tuple[int, ...] | None = None
    skip_special_tokens: bool = True
    # vLLM's penalties: presence / frequency on generated tokens, repetition on prompt and
    # generated tokens (logit / p where positive, x p where negative).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0  # before this many tokens, the ids in min_tokens_blocked cannot be sampled
    min_tokens_blocked: tuple[int, ...] = ()  # EOS and stop token ids, filled at admission
    include_stop_str_in_output: bool = False
    # The answer is whole once it has a token (a choice whose strings are each one token): it ends
    # "stop", as an answer its grammar completes does, not "length".
    one_token_answer: bool = False

    # What the sampler and the planners ask of every row each step, fixed with the fields (as
    # properties they were three calls a decode token on each thread).
    greedy: bool = field(init=False, repr=False, compare=False)  # argmax: the limit below MIN_TEMPERATURE
    penalizes: bool = field(init=False, repr=False, compare=False)  # rows carry the tokens before them
    restricts_logits: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Below MIN_TEMPERATURE, logits / temperature overflow float32: the limit is argmax.
        greedy = self.temperature < MIN_TEMPERATURE or self.top_k == 1
        penalizes = self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0
        restricts = (bool(self.logit_bias) or self.allowed_token_ids is not None or penalizes
                     or (self.min_tokens > 0 and bool(self.min_tokens_blocked)))
        # Stored past the type checker's frozen view, once, as the constructor stores the fields.
        object.__setattr__(self, "greedy", greedy)
        object.__setattr__(self, "penalizes", penalizes)
        object.__setattr__(self, "restricts_logits", restricts)

    def ends_at(self, token_id: int, eos_token_ids: frozenset[int]) -> bool:
        """Whether sampling this token ends the sequence: a stop token, or EOS unless ignored (the
        sampler never draws either before min_tokens)."""
        return token_id in self.stop_token_ids or (not self.ignore_eos and token_id in eos_token_ids)


GREEDY = SamplingParams(temperature=0.0)


def seeded_uniform(seed: int, step: int) -> float:
    """The U[0, 1) a seeded request draws its `step`-th token at: a function of (seed, step)
    alone, so the request samples the same tokens whatever it is batched with and on either
    runner (splitmix64's mixing of the pair; 53 bits, a float64's mantissa)."""
    x = ((seed % _PRIME64) * 0x9E3779B97F4A7C15 + step + 1) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return ((x ^ (x >> 31)) >> 11) * 2.0 ** -53
