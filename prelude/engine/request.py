"""The normalized request: everything the engine needs, fixed once at admission (sampling, the
outputs its last row produces, label ids), and never changed afterwards."""
from __future__ import annotations

import enum
import time
from dataclasses import field

from prelude.contract.batch import OutputSpec
from prelude.contract.constraint import TokenConstraint
from prelude.contract.record import record
from prelude.contract.sampling import GREEDY, SamplingParams


class Task(str, enum.Enum):
    """What the request returns."""

    GENERATE = "generate"  # tokens (max_tokens may be 0: prompt logprobs only)
    EMBED = "embed"  # pooled, normalized final hidden state
    CLASSIFY = "classify"  # sequence-classification head on the last token
    SCORE = "score"  # logprobs of given label tokens at the last position


class ExecutionClass(str, enum.Enum):
    ONESHOT = "oneshot"  # one forward, no state after it
    DECODE = "decode"  # paged KV, continuous batching


@record
class Request:
    request_id: str
    prompt_ids: list[int]  # read-only once admitted
    sampling: SamplingParams = GREEDY
    task: Task = Task.GENERATE
    prompt_logprobs: int | None = None
    pooling: str = "last"
    normalize: bool = True
    label_token_ids: tuple[int, ...] | None = None
    label_vocab_normalized: bool = True  # False: over the label tokens alone (compact head)
    # Multi-item scoring: the prompt ends with items of these lengths, each scored as if it
    # alone followed the shared part (see PrefillRow.item_lengths).
    item_lengths: tuple[int, ...] = ()
    priority: int = 0  # lower runs first (vLLM's semantics), under --scheduling-policy priority
    deadline: float | None = None  # time.monotonic() by which the result is wanted
    arrival_time: float = field(default_factory=time.monotonic)
    # Structured outputs: the generated tokens obey this grammar (a state of this request's own).
    grammar: TokenConstraint | None = None
    # The outputs the row carrying the last prompt token produces (derived, once).
    output: OutputSpec = field(init=False, repr=False)
    # len(prompt_ids), kept: the scheduler and the fold read it several times per token.
    num_prompt_tokens: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        generates = self.task is Task.GENERATE and self.sampling.max_tokens > 0
        object.__setattr__(self, "output", OutputSpec(
            sample=self.sampling if generates else None,
            prompt_logprobs=self.prompt_logprobs,
            pooling=self.pooling if self.task is Task.EMBED else None,
            normalize=self.normalize,
            classify=self.task is Task.CLASSIFY,
            label_token_ids=self.label_token_ids if self.task is Task.SCORE else None,
            label_vocab_normalized=self.label_vocab_normalized,
            grammar=self.grammar if generates else None,
        ))
        object.__setattr__(self, "num_prompt_tokens", len(self.prompt_ids))

    @property
    def cacheable_len(self) -> int:
        """Leading prompt tokens whose KV is a true prefix: all of them, or the shared part of a
        multi-item prompt (items after the first do not continue the tokens before them)."""
        return len(self.prompt_ids) - sum(self.item_lengths)

    @property
    def generates(self) -> bool:
        return self.output.sample is not None

    @property
    def needs_every_position(self) -> bool:
        """Outputs read every prompt position, so a cached prefix cannot stand in for them."""
        return self.prompt_logprobs is not None or (self.task is Task.EMBED and self.pooling != "last")

    def execution_class(self, disable_oneshot: bool = False) -> ExecutionClass:
        return execution_class(self.task, self.sampling.max_tokens, disable_oneshot)


def execution_class(task: Task, max_tokens: int, disable_oneshot: bool = False) -> ExecutionClass:
    """OneShot when the request returns a fixed-size artifact or at most one token; admission
    asks the same question before the request exists, to know which limits apply."""
    if not disable_oneshot and (task is not Task.GENERATE or max_tokens <= 1):
        return ExecutionClass.ONESHOT
    return ExecutionClass.DECODE
