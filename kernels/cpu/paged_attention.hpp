// Decode attention over a paged KV cache, reading the blocks where they lie: one query token per
// row, GQA (each KV head serves `group` query heads), fp32. A work item is a row and a range of
// its KV heads; it walks the row's keys once, reading each token's heads as one contiguous run
// (a strided pass per head ran at a quarter of the read speed), scoring every query head of the
// range, then walks the values once the same way.
#pragma once
#include <cmath>
#include <vector>

#include "simd.hpp"
#include "team.hpp"

namespace prelude_cpu {

struct PagedDecode {
    const float* q;             // [rows, heads, dim]
    const float* k_cache;       // [blocks, block_size, kv_heads, dim]
    const float* v_cache;
    const long* block_tables;   // [rows, table_width]
    const long* context_lens;   // [rows]: keys each row attends to, its own token included
    float* out;                 // [rows, heads, dim]
    long rows, heads, kv_heads, dim, block_size, table_width;
    float scale;
};

// Softmax in place over n scores.
__attribute__((always_inline)) static inline void softmax_body(float* s, long n) {
    float top = s[0];
    for (long j = 1; j < n; ++j) top = s[j] > top ? s[j] : top;
    v8f total8 = {};
    long j = 0;
    for (; j + 8 <= n; j += 8) {
        v8f e = exp8(load8(s + j) - top);
        store8(s + j, e);
        total8 += e;
    }
    float total = hsum(total8);
    for (; j < n; ++j) { s[j] = std::exp(s[j] - top); total += s[j]; }
    const float inv = 1.f / total;
    for (j = 0; j < n; ++j) s[j] *= inv;
}

// Row `row`, KV heads [h0, h1): scores[(head - h0 * group) * len + j].
__attribute__((always_inline)) static inline void paged_item_body(const PagedDecode& a, long row, long h0, long h1,
                                                                   std::vector<float>& scores) {
    const long group = a.heads / a.kv_heads, len = a.context_lens[row], d = a.dim;
    const long token_stride = a.kv_heads * d, block_stride = a.block_size * token_stride;
    const long first_head = h0 * group, num_heads = (h1 - h0) * group;
    const long* table = a.block_tables + row * a.table_width;
    const float* q = a.q + (row * a.heads + first_head) * d;
    scores.resize(num_heads * len);
    float* s = scores.data();
    for (long j = 0; j < len; ++j) {
        const float* keys = a.k_cache + table[j / a.block_size] * block_stride + (j % a.block_size) * token_stride + h0 * d;
        for (long h = 0; h < num_heads; ++h) {
            const float* key = keys + (h / group) * d;
            const float* qh = q + h * d;
            v8f acc = {};
            for (long i = 0; i < d; i += 8) acc += load8(key + i) * load8(qh + i);
            s[h * len + j] = hsum(acc) * a.scale;
        }
    }
    for (long h = 0; h < num_heads; ++h) softmax_body(s + h * len, len);
    float* out = a.out + (row * a.heads + first_head) * d;
    for (long i = 0; i < num_heads * d; ++i) out[i] = 0.f;
    for (long j = 0; j < len; ++j) {
        const float* values = a.v_cache + table[j / a.block_size] * block_stride + (j % a.block_size) * token_stride + h0 * d;
        for (long h = 0; h < num_heads; ++h) {
            const float* value = values + (h / group) * d;
            const v8f p = splat(s[h * len + j]);
            float* oh = out + h * d;
            for (long i = 0; i < d; i += 8) store8(oh + i, load8(oh + i) + p * load8(value + i));
        }
    }
}

// Items [first, last): item i is row i / splits, KV-head range i % splits of `splits` ranges.
__attribute__((always_inline)) static inline void paged_items_body(const PagedDecode& a, long splits, long first, long last) {
    std::vector<float> scores;
    for (long item = first; item < last; ++item) {
        const long row = item / splits, part = item % splits;
        paged_item_body(a, row, a.kv_heads * part / splits, a.kv_heads * (part + 1) / splits, scores);
    }
}

PRELUDE_CPU_VARIANTS(paged_items, (const PagedDecode& a, long splits, long first, long last), (a, splits, first, last))

// dim must be a multiple of 8 and heads a multiple of kv_heads (the caller checks). Rows are
// split into KV-head ranges only when there are fewer rows than threads; few keys in all run on
// one thread.
static void paged_decode_attention(const PagedDecode& a, int threads) {
    long keys = 0;
    for (long row = 0; row < a.rows; ++row) keys += a.context_lens[row];
    threads = threads_worth(2 * keys * a.kv_heads * a.dim, threads);  // K and V
    if (threads < 1) threads = 1;
    long splits = (threads + a.rows - 1) / a.rows;
    if (splits > a.kv_heads) splits = a.kv_heads;
    const long items = a.rows * splits;
    parallel_ranges(items, threads, 1, [&](long first, long last) { run_paged_items(a, splits, first, last); });
}

}  // namespace prelude_cpu
