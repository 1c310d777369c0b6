"""Turns a StepLayout into flashinfer's index arrays. Pure Python on host lists (and the host's
slot tensor), so that every index can be checked on a machine without a GPU.

The step is split three ways:

- every prefill row's attention over its own new tokens is one ragged causal prefill over the
  step's q/k/v tensors (no cache read, whether or not the row stores its K/V);
- prefill rows with cached context (a prefix-cache hit, or a chunk continuing an earlier chunk)
  additionally attend, non-causally, to the pages of that context; the two partial results are
  merged by their log-sum-exp. Splitting this way never needs the row's own tokens in the cache,
  which matters because a OneShot row stores only the full blocks it hands to the prefix cache
  (or nothing, when the pool is short), so its tail is not in any page;
- decode rows (one token, stored) attend through the paged decode kernel to context + 1 tokens,
  their own K/V having been written first.

flashinfer's paged format per row: `indptr` (cumulative page counts), `indices` (the pages, in
order) and `last_page_len` (tokens used in the last page, 1..page_size).
"""
from __future__ import annotations

from dataclasses import field
from typing import Sequence

import torch

from prelude.contract.record import record
from prelude.model.attention import StepLayout


@record
class PagedRows:
    """Paged KV of a group of rows, in flashinfer's CSR form."""

    indptr: list[int] = field(default_factory=lambda: [0])
    indices: list[int] = field(default_factory=list)
    last_page_len: list[int] = field(default_factory=list)

    @property
    def num_rows(self) -> int:
        return len(self.last_page_len)


@record
class FlashInferPlan:
    num_prefill_tokens: int
    ragged_indptr: list[int]  # prefill rows' token offsets: q and kv indptr of the ragged kernel
    prefix_rows: list[int]  # prefill rows with cached context
    prefix_qo_indptr: list[int]  # their token offsets after gathering them together
    prefix_kv: PagedRows  # pages holding exactly their cached context
    prefix_tokens: list[int]  # step token index of each gathered query (for the merge)
    decode_kv: PagedRows  # pages holding each decode row's context plus its own token
    store_tokens: list[int]  # tokens whose K/V is written, when not all are
    store_all: bool

    @property
    def num_decode_rows(self) -> int:
        return self.decode_kv.num_rows

    @property
    def prefix_span(self) -> tuple[int, int] | None:
        """(start, end) when the gathered prefix queries are one contiguous run of the step's
        tokens, so the merge can use slices instead of gathers."""
        tokens = self.prefix_tokens
        if tokens and tokens[-1] - tokens[0] + 1 == len(tokens):
            return tokens[0], tokens[-1] + 1
        return None


def pages_for(block_table: Sequence[int], num_tokens: int, page_size: int, out: PagedRows, row: str) -> None:
    """Appends one row covering the first `num_tokens` (>= 1) positions of block_table."""
    num_pages = -(-num_tokens // page_size)
    if num_pages > len(block_table):
        raise ValueError(f"{row}: {num_tokens} tokens need {num_pages} blocks, the table has {len(block_table)}")
    out.indices.extend(block_table[:num_pages])
    out.indptr.append(out.indptr[-1] + num_pages)
    out.last_page_len.append(num_tokens - (num_pages - 1) * page_size)


def build_plan(layout: StepLayout, page_size: int,
               slot_mapping: Sequence[int] | torch.Tensor | None = None) -> FlashInferPlan:
    """`slot_mapping` (host copy of layout.slot_mapping) is only needed to list stored tokens
    when some rows do not store; the layout's store_kv flags say whether that is the case."""
    num_prefill = layout.num_prefill_rows
    starts = layout.query_starts
    num_prefill_tokens = starts[num_prefill]
    prefix_rows: list[int] = []
    prefix_qo = [0]
    prefix_tokens: list[int] = []
    prefix_kv = PagedRows()
    for row in range(num_prefill):
        ctx = layout.context_lens[row]
        if ctx == 0:
            continue
        prefix_rows.append(row)
        prefix_qo.append(prefix_qo[-1] + layout.query_len(row))
        prefix_tokens.extend(range(starts[row], starts[row + 1]))
        pages_for(layout.block_tables[row], ctx, page_size, prefix_kv, f"prefill row {row}")
    decode_kv = PagedRows()
    for row in range(num_prefill, layout.num_rows):
        if layout.query_len(row) != 1 or not layout.store_kv[row]:
            raise ValueError(f"decode row {row} must be one stored token")
        pages_for(layout.block_tables[row], layout.context_lens[row] + 1, page_size, decode_kv, f"decode row {row}")
    store_all = all(layout.store_kv)
    store_tokens: list[int] = []
    if not store_all:
        if slot_mapping is None:
            raise ValueError("rows that do not store their K/V need the host slot mapping")
        slots = slot_mapping.tolist() if isinstance(slot_mapping, torch.Tensor) else slot_mapping
        store_tokens = [t for t, slot in enumerate(slots) if slot >= 0]
    return FlashInferPlan(
        num_prefill_tokens=num_prefill_tokens,
        ragged_indptr=list(starts[: num_prefill + 1]),
        prefix_rows=prefix_rows,
        prefix_qo_indptr=prefix_qo,
        prefix_kv=prefix_kv,
        prefix_tokens=prefix_tokens,
        decode_kv=decode_kv,
        store_tokens=store_tokens,
        store_all=store_all,
    )


def pad_decode_rows(kv: PagedRows, bucket: int, dummy_page: int) -> PagedRows:
    """Pads decode rows to a CUDA-graph bucket: each padding row attends to one token of a
    page nobody owns, so the captured kernel computes finite values that are then ignored."""
    missing = bucket - kv.num_rows
    if missing < 0:
        raise ValueError(f"{kv.num_rows} decode rows do not fit bucket {bucket}")
    last = kv.indptr[-1]
    return PagedRows(
        indptr=kv.indptr + [last + i for i in range(1, missing + 1)],
        indices=kv.indices + [dummy_page] * missing,
        last_page_len=kv.last_page_len + [1] * missing,
    )
