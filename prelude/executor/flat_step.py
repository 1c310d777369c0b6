"""A step's rows flattened on the host into the varlen layout every backend plans from, without
torch: what executor.host_step puts in tensors and executor.host_runner runs from."""
from __future__ import annotations

import itertools
from array import array
from typing import Sequence

import numpy as np

from kernels.cpu.addresses import address_of
from prelude.contract.batch import DecodeRow, PrefillRow
from prelude.contract.record import record

try:
    from kernels.cpu._native import flatten_tokens, paged_tables
except ImportError:  # the extension is not built (a source checkout before `pip install -e .`)
    flatten_tokens = paged_tables = None  # type: ignore[assignment]


@record
class FlatStep:
    """HostStep without torch (executor.host_runner's): `tokens` int64 [3, tokens], each token's
    id, position and KV slot, in step order, from `address`."""

    tokens: np.ndarray
    address: int
    starts: list[int]
    context_lens: list[int]
    block_tables: list[Sequence[int]]
    stored: list[bool]
    num_prefill_rows: int
    item_lengths: list[tuple[int, ...]] | None
    read: list[int] | None


def flat_step(prefills: Sequence[PrefillRow], decodes: Sequence[DecodeRow], bs: int) -> FlatStep:
    """host_step's flattening into numpy."""
    starts, stored = row_starts(prefills, decodes, bs)
    n = starts[-1]
    if flatten_tokens is not None:
        tokens = np.empty((3, n), np.int64)
        address = address_of(tokens)
        flatten_tokens(prefills, decodes, bs, address, n)
    else:
        tokens = np.array(flatten_in_python(prefills, decodes, bs), np.int64).reshape(3, n)
        address = address_of(tokens)
    return FlatStep(tokens, address, starts, *row_fields(prefills, decodes, starts, stored))


def row_starts(prefills: Sequence[PrefillRow], decodes: Sequence[DecodeRow], bs: int) -> tuple[list[int], list[bool]]:
    """Each row's first token in the step (and the step's end), and whether each prefill row's
    tokens are stored (its block table covers them)."""
    starts = [0]
    stored: list[bool] = []
    for row in prefills:
        end = row.start + len(row.token_ids)
        stored.append(len(row.block_table) * bs >= end)
        starts.append(starts[-1] + len(row.token_ids))
    starts += range(starts[-1] + 1, starts[-1] + 1 + len(decodes))
    return starts, stored


def row_fields(prefills: Sequence[PrefillRow], decodes: Sequence[DecodeRow], starts: list[int],
                stored: list[bool]) -> tuple:
    """HostStep's and FlatStep's fields after the starts: context_lens through read."""
    return ([r.start for r in prefills] + [r.position for r in decodes],
            [r.block_table for r in prefills] + [r.block_table for r in decodes],
            stored + [True] * len(decodes), len(prefills),
            [r.item_lengths for r in prefills] + [()] * len(decodes) if any(r.item_lengths for r in prefills)
            else None,
            positions_read(prefills, decodes, starts))


def flatten_in_python(prefills: Sequence[PrefillRow], decodes: Sequence[DecodeRow], bs: int) -> list[int]:
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


def positions_read(prefills: Sequence[PrefillRow], decodes: Sequence[DecodeRow],
                   starts: Sequence[int]) -> list[int] | None:
    """The step's token positions whose final hidden states `row_results` reads, ascending, given
    the rows' query starts; None when it reads every position. The model may skip the rest."""
    read: list[int] = []
    for i, row in enumerate(prefills):
        spec, start, end = row.output, starts[i], starts[i + 1]
        if spec is None:
            continue
        if spec.prompt_logprobs is not None or spec.pooling not in (None, "last"):
            read.extend(range(start, end))
        elif row.item_lengths and spec.label_token_ids is not None:
            read.extend(item_ends(end, row.item_lengths))
        else:
            read.append(end - 1)
    if len(read) + len(decodes) == starts[-1]:
        return None
    return read + list(range(starts[len(prefills)], starts[-1]))  # a decode row's one token


def item_ends(end: int, items: Sequence[int]) -> list[int]:
    """Positions whose states a row's label heads read: each item's last token, or the row's
    last token when it has no items. `end` is the row's end in the step."""
    if not items:
        return [end - 1]
    return [end - sum(items[j:]) + items[j] - 1 for j in range(len(items))]


@record
class PagedRows:
    """A step's rows as the native step reads them over the paged cache (the lists of
    model.attention.PagedStepInputs): rows before `decode_from` are prompt rows, the rest decode
    rows of one stored token each; `tables` is [rows, width] flattened, each row's blocks of its
    context and stored tokens (none for a row that stores nothing), zero-padded; multi-item rows'
    item lengths as PagedStepInputs has them (None: no row has items)."""

    decode_from: int
    tables: array  # int64
    width: int
    item_starts: list[int] | None
    item_lengths: list[int] | None


def paged_rows(query_starts: Sequence[int], context_lens: Sequence[int], block_tables: Sequence[Sequence[int]],
               store_kv: Sequence[bool], item_lengths: Sequence[tuple[int, ...]] | None,
               block_size: int) -> PagedRows:
    if paged_tables is not None:
        decode_from, tables, width = paged_tables(query_starts, context_lens, block_tables, store_kv, block_size)
    else:
        decode_from, tables, width = paged_tables_in_python(query_starts, context_lens, block_tables, store_kv,
                                                            block_size)
    if item_lengths is None or not any(item_lengths):
        return PagedRows(decode_from, tables, width, None, None)
    return PagedRows(decode_from, tables, width, [0, *itertools.accumulate(map(len, item_lengths))],
                     [n for items in item_lengths for n in items] or [0])


def paged_tables_in_python(query_starts: Sequence[int], context_lens: Sequence[int],
                           block_tables: Sequence[Sequence[int]], store_kv: Sequence[bool],
                           block_size: int) -> tuple[int, array, int]:
    """The native paged_tables' (decode_from, tables, width), in Python."""
    rows = len(context_lens)
    decode_from = rows  # the trailing rows of one stored token each
    while decode_from and query_starts[decode_from] - query_starts[decode_from - 1] == 1 and store_kv[
            decode_from - 1]:
        decode_from -= 1
    tables = [block_tables[row][:-(-(context_lens[row] + query_starts[row + 1] - query_starts[row]) // block_size)]
              for row in range(rows)]
    width = max([1, *map(len, tables)])
    flat = array("q")
    for table in tables:
        flat.extend(table)
        flat.extend([0] * (width - len(table)))
    return decode_from, flat, width
