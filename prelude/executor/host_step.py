"""A step's rows flattened on the host into the varlen layout every backend plans from."""
from __future__ import annotations

from typing import Sequence

import torch

from prelude.contract.batch import DecodeRow, PrefillRow
from prelude.contract.record import record
from prelude.executor.heads import positions_read
from prelude.model.attention import StepLayout

try:
    from kernels.cpu._native import flatten_tokens
except ImportError:  # the extension is not built (a source checkout before `pip install -e .`)
    flatten_tokens = None  # type: ignore[assignment]


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
    starts = [0]
    stored: list[bool] = []
    for row in prefills:
        end = row.start + len(row.token_ids)
        stored.append(len(row.block_table) * bs >= end)
        starts.append(starts[-1] + len(row.token_ids))
    starts += range(starts[-1] + 1, starts[-1] + 1 + len(decodes))
    n = starts[-1]
    if flatten_tokens is not None:  # the per-token work in C: about a tenth of the Python's time
        tokens = torch.empty(3, n, dtype=torch.long)
        flatten_tokens(prefills, decodes, bs, tokens.data_ptr(), n)
    else:
        tokens = torch.tensor(_flatten_tokens(prefills, decodes, bs), dtype=torch.long).view(3, n)
    ids, positions, slots = tokens.unbind()
    return HostStep(
        tokens, ids, positions, slots, starts,
        context_lens=[r.start for r in prefills] + [r.position for r in decodes],
        block_tables=[r.block_table for r in prefills] + [r.block_table for r in decodes],
        stored=stored + [True] * len(decodes),
        num_prefill_rows=len(prefills),
        item_lengths=[r.item_lengths for r in prefills] + [()] * len(decodes)
        if any(r.item_lengths for r in prefills) else None,
        read=positions_read(prefills, decodes, starts),
    )


def _flatten_tokens(prefills: Sequence[PrefillRow], decodes: Sequence[DecodeRow], bs: int) -> list[int]:
    """The token columns, ids then positions then slots, as one list: what the native
    flatten_tokens writes."""
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    for row in prefills:
        start, end, table = row.start, row.start + len(row.token_ids), row.block_table
        ids.extend(row.token_ids)
        if row.item_lengths:  # each item's positions restart where the shared part ends
            shared_end = end - sum(row.item_lengths)
            positions.extend(range(start, shared_end))
            for length in row.item_lengths:
                positions.extend(range(shared_end, shared_end + length))
        else:
            positions.extend(range(start, end))
        covered = min(end, len(table) * bs)
        # Slots of the stored tokens, one contiguous range per block.
        for block in range(start // bs, -(-covered // bs)):
            lo, hi = max(start, block * bs), min(covered, (block + 1) * bs)
            base = table[block] * bs - block * bs
            slots.extend(range(base + lo, base + hi))
        slots.extend([-1] * (end - max(covered, start)))
    for decode in decodes:
        ids.append(decode.token_id)
        positions.append(decode.position)
        slots.append(decode.block_table[decode.position // bs] * bs + decode.position % bs)
    return ids + positions + slots
