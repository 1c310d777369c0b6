"""ForwardBatch: the typed contract between the scheduler and an executor.

The scheduler decides *what* runs in a step; the executor decides *how*. Three batch kinds carry
the execution class to the executor before it launches anything:

- OneShotBatch: prompt slices of OneShot requests; nothing they compute outlives the step except
  full prompt blocks handed to the prefix cache.
- DecodeBatch: one token and a block table per running sequence (CUDA-graph eligible).
- MixedBatch: prefill chunks admitted beside running decodes; the two lists are kept apart so
  that each is accounted against its own budget.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence, Union

from prelude.contract.constraint import TokenConstraint
from prelude.contract.record import record
from prelude.contract.sampling import SamplingParams


@record
class OutputSpec:
    """What a row's forward must produce, fixed once per request at admission. Everything unset is
    skipped (no LM head for a row that only needs a pooled state, no per-position logits unless
    prompt logprobs were asked for)."""

    sample: SamplingParams | None = None  # sample one token from the last position's logits
    prompt_logprobs: int | None = None  # logprob of each prompt token (+ this many alternatives)
    pooling: str | None = None  # "last" | "mean" | "cls": pooled final hidden state
    normalize: bool = True  # L2-normalize the pooled state
    classify: bool = False  # score head on the last token
    label_token_ids: tuple[int, ...] | None = None  # last-position logprobs of just these ids
    # False: label logprobs normalized over the label tokens alone, from just their K rows of
    # the LM head (the compact label head); True: over the whole vocabulary.
    label_vocab_normalized: bool = True
    # The sampled token obeys this grammar (structured outputs): the request's own state.
    grammar: TokenConstraint | None = None
    # Its row's one result is a token drawn from its last position's logits over the whole
    # vocabulary: no other head, no grammar, no allowed ids (plain generation's decode rows).
    only_samples: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        only = (self.sample is not None and self.sample.allowed_token_ids is None and self.grammar is None
                and self.label_token_ids is None and self.prompt_logprobs is None and self.pooling is None
                and not self.classify)
        object.__setattr__(self, "only_samples", only)  # once, past the type checker's frozen view

    @property
    def needs_last_logits(self) -> bool:
        return self.sample is not None or self.label_token_ids is not None


@record
class PrefillRow:
    """Prompt tokens computed this step. Positions start at `start`: the tokens before it are
    already in the KV blocks of `block_table` (a prefix-cache hit or an earlier chunk). A token's
    K/V is stored iff the block table covers its position; the rest dies with the step (OneShot
    rows get blocks only for the full blocks they hand to the prefix cache)."""

    seq_id: int
    token_ids: Sequence[int]
    start: int
    block_table: Sequence[int]
    output: OutputSpec | None  # None for a chunk that is not the prompt's last
    sample_step: int = 0  # index of the token sampled (seeded sampling is a function of it)
    # Multi-item rows: the row ends with items of these lengths, each scored as if it alone
    # followed the shared part before it (its positions restart there; it attends to the shared
    # part and to itself, never to other items). Label logprobs are read at each item's end.
    item_lengths: tuple[int, ...] = ()
    history: Sequence[int] = ()  # prompt + generated tokens, for penalties (else empty)


# DecodeRow.token_id of a row planned while the step that samples its input token still runs
# (engine.decode_chain.DecodeChain): the worker puts that token in before the row runs.
SAMPLED_BY_PREVIOUS_STEP = -1


@record
class DecodeRow:
    seq_id: int
    token_id: int
    position: int
    block_table: Sequence[int]
    output: OutputSpec
    sample_step: int = 0
    history: Sequence[int] = ()  # prompt + generated tokens, for penalties (else empty)


@record
class OneShotBatch:
    rows: Sequence[PrefillRow]


@record
class DecodeBatch:
    rows: Sequence[DecodeRow]


@record
class MixedBatch:
    prefills: Sequence[PrefillRow]
    decodes: Sequence[DecodeRow]


ForwardBatch = Union[OneShotBatch, DecodeBatch, MixedBatch]


def prefill_rows(batch: ForwardBatch) -> Sequence[PrefillRow]:
    if isinstance(batch, OneShotBatch):
        return batch.rows
    return batch.prefills if isinstance(batch, MixedBatch) else ()


def decode_rows(batch: ForwardBatch) -> Sequence[DecodeRow]:
    if isinstance(batch, DecodeBatch):
        return batch.rows
    return batch.decodes if isinstance(batch, MixedBatch) else ()


@dataclass(slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), best first
    # How many tokens had at least its logprob, itself included: tied tokens share the worse
    # rank, as vLLM counts.
    rank: int = 1


@dataclass(slots=True)
class RowResult:
    """What one row's forward produced, in host memory. Fields follow the row's OutputSpec."""

    seq_id: int
    token: TokenLogprob | None = None  # the sampled token (logprob filled when asked)
    # Tokens a grammar forces right after `token`: the answer takes them too, unsampled; a
    # later step computes them (with the row that samples the token after them).
    forced: tuple[int, ...] = ()
    prompt_logprobs: list[TokenLogprob] | None = None  # one per prompt position after the first
    pooled: list[float] | None = None
    scores: list[float] | None = None
    label_logprobs: list[float] | None = None
    item_label_logprobs: list[list[float]] | None = None  # multi-item rows: one list per item


@dataclass(slots=True)
class BatchResult:
    """Results for rows with an output, prefill rows first, then decode rows."""

    rows: list[RowResult]
