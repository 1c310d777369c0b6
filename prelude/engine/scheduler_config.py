"""The scheduler's settings, read once from the server's Config and from what the executor's
device holds (assembly passes the temporary-memory figures)."""
from __future__ import annotations

from dataclasses import dataclass

from prelude.contract.config import Config


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    disable_oneshot: bool
    policy: str
    max_queued_requests: int
    max_queued_tokens: int
    shed_late: bool
    layer_preemption: bool
    # OneShot temporaries: activation bytes per computed token, bytes per row of logits, and the
    # budget one step's rows may take together (set by what the executor's device holds).
    temp_bytes_per_token: int
    temp_bytes_per_logits_row: int
    temp_memory_budget: int

    @classmethod
    def from_config(cls, config: Config, temp_bytes_per_token: int = 0, temp_bytes_per_logits_row: int = 0,
                    temp_memory_budget: int = 1 << 62, kv_capacity_tokens: int = 1 << 40) -> SchedulerConfig:
        return cls(config.max_num_seqs, config.max_num_batched_tokens, config.disable_oneshot,
                   config.scheduling_policy, config.max_queued_requests or 4 * config.max_num_seqs,
                   config.max_queued_tokens or 4 * kv_capacity_tokens, config.shed_late_requests,
                   config.layer_preemption, temp_bytes_per_token, temp_bytes_per_logits_row, temp_memory_budget)

    def admits(self, rows: int, tokens: int, more_rows: int, more_tokens: int) -> bool:
        """Whether a waiting queue of `rows` requests and `tokens` tokens takes `more_rows` and
        `more_tokens` more without passing its limits. A request past a limit by itself is taken
        while the queue is within it (an empty queue takes anything): it never fits beside others,
        and waiting for an empty queue it was refused for as long as traffic went on."""
        if not rows:
            return True
        limit_rows, limit_tokens = self.max_queued_requests, self.max_queued_tokens
        return (rows + more_rows <= limit_rows or more_rows > limit_rows > rows) and \
            (tokens + more_tokens <= limit_tokens or more_tokens > limit_tokens > tokens)

    def at_limit(self, rows: int, tokens: int) -> bool:
        """Whether such a queue refuses any request, however small (every request has at least
        one row of at least one token), so that one may be refused unseen."""
        return bool(rows) and (rows >= self.max_queued_requests or tokens >= self.max_queued_tokens)
