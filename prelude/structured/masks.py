"""Token masks of a step's constrained rows: filled in one batched llguidance call, in a thread
of their own while the step's forward runs, and applied to the logits as a bitmask (one bit per
vocabulary entry, 32 to an int32 word), with no per-row Python loop over the vocabulary."""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence, cast

import llguidance
import numpy as np
import torch

from prelude.contract.constraint import TokenConstraint
from prelude.structured.state import GrammarState

_filler: ThreadPoolExecutor | None = None
_executor: llguidance.LLExecutor | None = None


@dataclass(frozen=True, slots=True)
class MaskRequest:
    """A row that samples under a grammar: its state, the index of the token it samples, and
    its last input token (the one before it)."""

    seq_id: int
    grammar: TokenConstraint
    step: int
    last_token: int


@dataclass(frozen=True, slots=True)
class StepMasks:
    """The masks of a step's rows that sample under their grammar now (not those still in a
    reasoning block): `bitmask` row i is the mask of the row whose seq_id maps to i."""

    bitmask: torch.Tensor  # [rows, words] int32
    rows: dict[int, int]  # seq_id -> bitmask row


def start_filling(requests: Sequence[MaskRequest]) -> Future[StepMasks]:
    """Catches each row's state up and fills its mask in the mask thread; the future's result
    is ready once every mask is."""
    global _filler, _executor
    if _filler is None:
        _filler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prelude-masks")
        _executor = llguidance.LLExecutor()
    return _filler.submit(_fill, list(requests))


def _fill(requests: list[MaskRequest]) -> StepMasks:
    matchers: list[tuple[llguidance.LLMatcher, int]] = []
    rows: dict[int, int] = {}
    words = 0
    for request in requests:
        state = cast(GrammarState, request.grammar)
        words = state.mask_words  # every state of a server comes from its one compiler
        state.catch_up(request.step, request.last_token)
        if not state.reasoning:
            rows[request.seq_id] = len(matchers)
            matchers.append((state.matcher, len(matchers)))
    bitmask = torch.empty(len(matchers), words, dtype=torch.int32)
    if matchers:
        assert _executor is not None
        _executor.unsafe_compute_mask_ptr(matchers, bitmask.data_ptr(), words * 4, len(matchers))
    return StepMasks(bitmask, rows)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """Sets to -inf, in place, the logits of `rows` whose bit in the matching bitmask row is 0."""
    vocab = logits.shape[-1]
    if logits.device.type == "cpu":
        bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, bitorder="little")
        allowed = torch.from_numpy(bits[:, :vocab]).bool()
    else:
        allowed = unpack_bitmask(bitmask.to(logits.device, non_blocking=True), vocab)
    if rows == list(range(logits.shape[0])):
        logits.masked_fill_(~allowed, float("-inf"))
        return
    index = torch.tensor(rows, device=logits.device)
    logits[index] = logits[index].masked_fill(~allowed, float("-inf"))


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[rows, words] int32 -> [rows, vocab] bool, with tensor ops on the bitmask's device (the
    CUDA path; the CPU's unpacks with numpy, several times faster there)."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    return ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().flatten(1)[:, :vocab]
