"""The scheduler's records of admitted requests: a OneShotJob (one forward, holds KV blocks only
during its own step) or a Sequence (Decode lifecycle: keeps KV blocks across steps)."""
from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Union

from prelude.contract.batch import OutputSpec
from prelude.engine.request import Request


@dataclass(slots=True)
class Estimate:
    """A waiting request's estimated cost, and the cache state and time it was made at."""

    seconds: float
    key: float  # the ordering key the policy derived from it
    pool_version: int
    made_at: float


class WorkStatus(enum.Enum):
    WAITING = "waiting"  # queued, or preempted and waiting to recompute
    RUNNING = "running"  # a Sequence holding KV blocks, or a OneShotJob whose step is in flight
    FINISHED = "finished"  # ended, however it ended (the engine records why)


class OneShotJob:
    __slots__ = ("seq_id", "request", "status", "deferred", "first_scheduled", "num_cached_tokens", "estimate")

    def __init__(self, seq_id: int, request: Request):
        self.seq_id = seq_id
        self.request = request
        self.status = WorkStatus.WAITING
        self.deferred = False  # waited one tick behind a leader computing its prefix
        self.first_scheduled: float | None = None
        self.num_cached_tokens = 0
        self.estimate: Estimate | None = None  # cost ordering policies only

    @property
    def num_output_tokens(self) -> int:
        return 0  # a sampled token lives in the step's result, not in the job

    @property
    def open_deadline(self) -> float | None:
        return self.request.deadline  # its one result is what the deadline is for

    @property
    def tokens_to_compute(self) -> tuple[int, ...] | list[int]:
        return self.request.prompt_ids

    def __repr__(self) -> str:
        return f"OneShotJob({self.request.request_id}, {self.status.value})"


class Sequence:
    __slots__ = ("seq_id", "request", "token_ids", "num_computed", "blocks", "num_published",
                 "status", "num_cached_tokens", "first_scheduled", "deferred", "estimate")

    def __init__(self, seq_id: int, request: Request):
        self.seq_id = seq_id
        self.request = request
        self.token_ids: list[int] = list(request.prompt_ids)  # prompt, then generated tokens
        self.num_computed = 0  # tokens whose K/V are in `blocks`
        self.blocks: list[int] = []
        self.num_published = 0  # leading blocks handed to the prefix cache
        self.status = WorkStatus.WAITING
        self.num_cached_tokens = 0  # prefix-cache hit at (first) admission
        self.first_scheduled: float | None = None
        self.deferred = False  # waited one tick behind a leader computing its prefix
        self.estimate: Estimate | None = None  # cost ordering policies only

    @property
    def tokens_to_compute(self) -> list[int]:
        return self.token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.request.num_prompt_tokens

    @property
    def open_deadline(self) -> float | None:
        """The request's deadline while it is still to be met: it is for the first token, so a
        sequence that gave one and waits or recomputes after a preemption has none left (its
        past deadline got it shed mid-stream, and a future one capped other rows' step)."""
        return None if self.num_output_tokens else self.request.deadline

    @property
    def last_row_output(self) -> OutputSpec:
        """What the row ending its uncomputed tokens produces. After a preemption it recomputes
        its prompt and generated tokens: their prompt logprobs were delivered with its first
        token and are not computed again (over the generated tokens too, they would replace the
        request's with a longer list)."""
        output = self.request.output
        if self.num_output_tokens and output.prompt_logprobs is not None:
            return replace(output, prompt_logprobs=None)
        return output

    @property
    def prefilling(self) -> bool:
        """Still computing the tokens it holds (the prompt, or everything after a preemption);
        in the decode phase only the last sampled token is uncomputed."""
        return self.num_computed < self.num_tokens - (1 if self.num_output_tokens else 0)

    def __repr__(self) -> str:
        return f"Sequence({self.request.request_id}, {self.status.value}, {self.num_computed}/{self.num_tokens})"


Work = Union[OneShotJob, Sequence]
