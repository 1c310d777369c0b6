"""A step's rows flattened on the host into the varlen layout every backend plans from."""
from __future__ import annotations

from typing import Sequence

import torch

from prelude.contract.batch import DecodeRow, PrefillRow
from prelude.contract.record import record
from prelude.executor.flat_step import flatten_in_python, flatten_tokens, row_fields, row_starts
from prelude.model.attention import StepLayout


@record
class HostStep:
    """A step flattened on the host: what goes to the device, and the layout around it."""

    # int64 [3, tokens]: each token's id, position and KV slot (-1: not stored), step order;
    # ids, positions and slots are its rows, taken once (indexing a tensor costs a microsecond).
    tokens: torch.Tensor
    ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    starts: list[int]
    context_lens: list[int]
    block_tables: list[Sequence[int]]
    stored: list[bool]
    num_prefill_rows: int
    item_lengths: list[tuple[int, ...]] | None = None
    # The positions whose final states the output heads read; None: all of them.
    read: list[int] | None = None

    @property
    def num_tokens(self) -> int:
        return self.starts[-1]

    @property
    def num_rows(self) -> int:
        return len(self.starts) - 1

    def layout(self, slot_mapping: torch.Tensor) -> StepLayout:
        return StepLayout(
            query_starts=self.starts,
            context_lens=self.context_lens,
            block_tables=self.block_tables,
            store_kv=self.stored,
            num_prefill_rows=self.num_prefill_rows,
            slot_mapping=slot_mapping,
            host_slots=self.slots,
            item_lengths=self.item_lengths,
        )


def host_step(prefills: Sequence[PrefillRow], decodes: Sequence[DecodeRow], bs: int) -> HostStep:
    """Rows flattened into the varlen layout: prefill rows first, then decode rows. A prefill
    token's slot is -1 where the row's block table does not cover its position."""
    starts, stored = row_starts(prefills, decodes, bs)
    n = starts[-1]
    if flatten_tokens is not None:  # the per-token work in C: about a tenth of the Python's time
        tokens = torch.empty(3, n, dtype=torch.long)
        flatten_tokens(prefills, decodes, bs, tokens.data_ptr(), n)
    else:
        tokens = torch.tensor(flatten_in_python(prefills, decodes, bs), dtype=torch.long).view(3, n)
    ids, positions, slots = tokens.unbind()
    return HostStep(tokens, ids, positions, slots, starts, *row_fields(prefills, decodes, starts, stored))
