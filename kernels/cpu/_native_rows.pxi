# A step's rows flattened into its token columns on the host (included by _native.pyx).
from cpython cimport array
from libc.stdint cimport int64_t
from libcpp.vector cimport vector

import array

cdef array.array _INT64_ARRAY = array.array("q")


def flatten_tokens(prefills, decodes, long block_size, size_t out_ptr, long n) -> None:
    """Writes a step's token columns into out (int64, three rows of n: token ids, positions, KV
    slots), prefill rows first, then decode rows, as prelude/executor/host_step.py lays a step
    out (its Python fallback, `_flatten_tokens`, says it in Python). A prefill token's slot is -1
    where its row's block table does not cover its position. n must be the step's token count."""
    cdef int64_t* ids = <int64_t*>out_ptr
    cdef int64_t* positions = ids + n
    cdef int64_t* slots = ids + 2 * n
    cdef long k = 0, p, start, end, shared_end, item_start, length, covered, block, base, position
    cdef list token_ids
    for row in prefills:
        token_ids = row.token_ids if type(row.token_ids) is list else list(row.token_ids)
        start = row.start
        if start < 0:
            raise ValueError(f"a prefill row starts at {start}")
        end = start + len(token_ids)
        if k + (end - start) > n:
            raise ValueError("the rows hold more tokens than the columns")
        for p in range(end - start):
            ids[k + p] = token_ids[p]
        items = row.item_lengths
        if items:  # each item's positions restart where the shared part ends
            shared_end = end - sum(items)
            if shared_end < start or min(items) < 0:
                raise ValueError(f"items of {items} tokens do not fit a row of {end - start}")
            for p in range(start, shared_end):
                positions[k + p - start] = p
            item_start = k + shared_end - start
            for length in items:
                for p in range(length):
                    positions[item_start + p] = shared_end + p
                item_start += length
        else:
            for p in range(start, end):
                positions[k + p - start] = p
        table = row.block_table
        covered = min(end, len(table) * block_size)
        p = start
        while p < covered:  # one block's slots at a time
            block = p // block_size
            base = <long>table[block] * block_size
            while p < covered and p // block_size == block:
                slots[k + p - start] = base + p % block_size
                p += 1
        while p < end:
            slots[k + p - start] = -1
            p += 1
        k += end - start
    for decode in decodes:
        if k >= n:
            raise ValueError("the rows hold more tokens than the columns")
        position = decode.position
        table = decode.block_table
        block = position // block_size
        if position < 0 or block >= len(table):  # (the module indexes without bounds checks)
            raise IndexError(f"decode position {position} is outside its block table of {len(table)} blocks")
        ids[k] = decode.token_id
        positions[k] = position
        slots[k] = <long>table[block] * block_size + position % block_size
        k += 1
    if k != n:
        raise ValueError(f"the rows hold {k} tokens, the columns {n}")


def paged_tables(query_starts, context_lens, block_tables, store_kv, long block_size):
    """A step's rows over the paged cache as prelude/executor/flat_step.py's paged_rows lays them
    out: (decode_from, tables, width). Rows from decode_from on are its trailing rows of one
    stored token each; tables (int64, rows x width) holds each row's block table cut to the
    blocks its context and new tokens fill, zero-padded to the widest (width at least 1)."""
    cdef long rows = len(context_lens), row, need, width = 1, j, decode_from = rows
    cdef vector[long] needs
    while decode_from and <long>query_starts[decode_from] - <long>query_starts[decode_from - 1] == 1 \
            and store_kv[decode_from - 1]:
        decode_from -= 1
    needs.resize(rows)
    for row in range(rows):
        need = (<long>context_lens[row] + <long>query_starts[row + 1] - <long>query_starts[row] + block_size - 1) \
            // block_size  # a ceiling (the module divides as C does)
        need = min(need, <long>len(block_tables[row]))
        needs[row] = need
        width = max(width, need)
    cdef array.array tables = array.clone(_INT64_ARRAY, rows * width, zero=True)
    cdef int64_t* out = <int64_t*>tables.data.as_longlongs
    for row in range(rows):
        table = block_tables[row]
        for j in range(needs[row]):
            out[row * width + j] = table[j]
    return decode_from, tables, width
