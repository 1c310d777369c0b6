# Attention: paged decode rows, causal prompt rows, encoder rows (included by _native.pyx).

cdef extern from "paged_attention.hpp" namespace "prelude_cpu" nogil:
    cdef struct PagedDecode:
        const float* q
        const float* k_cache
        const float* v_cache
        const long* block_tables
        const long* context_lens
        float* out
        long rows, heads, kv_heads, dim, block_size, table_width
        float scale
    void paged_decode_attention(const PagedDecode& a, int threads)


def paged_decode(size_t q_ptr, size_t k_ptr, size_t v_ptr, size_t tables_ptr, size_t lens_ptr, size_t out_ptr,
                 long rows, long heads, long kv_heads, long dim, long block_size, long table_width,
                 float scale, int threads) -> None:
    """out[r, h] = softmax(q[r, h] . K[r]^T * scale) V[r] over the first lens[r] keys of row r's
    blocks (tables [rows, table_width], int64); q/out [rows, heads, dim] and the caches
    [blocks, block_size, kv_heads, dim] fp32 contiguous, dim % 8 == 0."""
    cdef PagedDecode a
    a.q = <const float*>q_ptr
    a.k_cache = <const float*>k_ptr
    a.v_cache = <const float*>v_ptr
    a.block_tables = <const long*>tables_ptr
    a.context_lens = <const long*>lens_ptr
    a.out = <float*>out_ptr
    a.rows, a.heads, a.kv_heads, a.dim = rows, heads, kv_heads, dim
    a.block_size, a.table_width, a.scale = block_size, table_width, scale
    with nogil:
        paged_decode_attention(a, threads)


cdef extern from "prefill_attention.hpp" namespace "prelude_cpu" nogil:
    cdef struct PrefillAttention:
        const float* q
        const float* k
        const float* v
        float* out
        long n, m, heads, kv_heads, dim, q_stride, k_stride, v_stride
        float scale
        const float* k_cache
        const float* v_cache
        const long* block_table
        long context, block_size, cache_block_stride, cache_token_stride
        bint bidirectional


cdef extern from "prompt_attention.hpp" namespace "prelude_cpu" nogil:
    void prompt_attention(const PrefillAttention& a, int threads)


cdef extern from "encoder_attention.hpp" namespace "prelude_cpu" nogil:
    void encoder_rows_attention(const PrefillAttention& step, const long* spans, long rows, int threads)


def causal_prefill(size_t q_ptr, size_t k_ptr, size_t v_ptr, size_t out_ptr, long n, long fresh, long heads,
                   long kv_heads, long dim, long q_stride, long k_stride, long v_stride, size_t k_cache_ptr,
                   size_t v_cache_ptr, size_t table_ptr, long context, long block_size, long block_stride,
                   long token_stride, float scale, int threads) -> None:
    """out[i, h] = softmax(q[i, h] . K^T * scale) V over keys [0, context + fresh - n + i] of K/V's
    head h // (heads / kv_heads): the first `context` keys in the KV cache's blocks (table int64:
    token j in block table[j // block_size]; blocks block_stride floats apart, tokens
    token_stride), then the `fresh` rows of k/v, whose last n are q's tokens. q [n, heads, dim],
    k/v [fresh, kv_heads, dim], each with its token stride (heads contiguous within a token, in
    the cache too), out [n, heads, dim] contiguous; fp32, dim % 8 == 0. A row of its own keys
    (no context) of 80 to 8,192 tokens with dim % 32 == 0 runs on AMX's tiles where the CPU has
    them (within a few 2^-16 of fp32)."""
    cdef PrefillAttention a
    a.q, a.k, a.v, a.out = <const float*>q_ptr, <const float*>k_ptr, <const float*>v_ptr, <float*>out_ptr
    a.n, a.m, a.heads, a.kv_heads, a.dim = n, context + fresh, heads, kv_heads, dim
    a.q_stride, a.k_stride, a.v_stride, a.scale = q_stride, k_stride, v_stride, scale
    a.k_cache, a.v_cache, a.block_table = <const float*>k_cache_ptr, <const float*>v_cache_ptr, <const long*>table_ptr
    a.context, a.block_size, a.cache_block_stride, a.cache_token_stride = context, block_size, block_stride, token_stride
    with nogil:
        prompt_attention(a, threads)


def bidirectional_rows(size_t q_ptr, size_t k_ptr, size_t v_ptr, size_t out_ptr, size_t spans_ptr, long rows,
                       long heads, long dim, long q_stride, long k_stride, long v_stride, float scale,
                       int threads) -> None:
    """An encoder step's attention, every row at once: row r is tokens [spans[2r], spans[2r + 1])
    (spans int64), out[i, h] = softmax(q[i, h] . K^T * scale) V over every key of i's row in head
    h. q, k, v [tokens, heads, dim] of the step, each with its token stride; out [tokens,
    heads, dim] contiguous; fp32, dim % 8 == 0 (rows on AMX's tiles: bf16x3, within a few 2^-16)."""
    cdef PrefillAttention a
    a.q, a.k, a.v, a.out = <const float*>q_ptr, <const float*>k_ptr, <const float*>v_ptr, <float*>out_ptr
    a.n, a.m, a.heads, a.kv_heads, a.dim = 0, 0, heads, heads, dim
    a.q_stride, a.k_stride, a.v_stride, a.scale = q_stride, k_stride, v_stride, scale
    a.k_cache, a.v_cache, a.block_table = <const float*>NULL, <const float*>NULL, <const long*>NULL
    a.context, a.block_size, a.cache_block_stride, a.cache_token_stride = 0, 1, 0, 0
    a.bidirectional = True
    with nogil:
        encoder_rows_attention(a, <const long*>spans_ptr, rows, threads)
