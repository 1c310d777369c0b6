// Decode attention over a paged KV cache, reading the blocks where they lie: one query token per
// row, GQA (each KV head serves `group` query heads), fp32. K and V are each read once per
// (row, KV head): scores for the whole group come from one pass over the keys, and the output
// from one pass over the values. Work items (row, KV head) run on std::threads.
#pragma once
#include <cmath>
#include <thread>
#include <vector>

#include "simd.hpp"

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

__attribute__((always_inline)) static inline void paged_item_body(const PagedDecode& a, long row, long kvh,
                                                                   std::vector<float>& scores) {
    const long group = a.heads / a.kv_heads, len = a.context_lens[row], d = a.dim;
    const long token_stride = a.kv_heads * d, block_stride = a.block_size * token_stride;
    const long* table = a.block_tables + row * a.table_width;
    const float* q = a.q + (row * a.heads + kvh * group) * d;
    scores.resize(group * len);
    for (long j = 0; j < len; ++j) {
        const float* key = a.k_cache + table[j / a.block_size] * block_stride + (j % a.block_size) * token_stride + kvh * d;
        for (long g = 0; g < group; ++g) {
            const float* qg = q + g * d;
            v8f acc = {};
            for (long h = 0; h < d; h += 8) acc += load8(key + h) * load8(qg + h);
            scores[g * len + j] = hsum(acc) * a.scale;
        }
    }
    for (long g = 0; g < group; ++g) {
        float* s = scores.data() + g * len;
        float top = s[0];
        for (long j = 1; j < len; ++j) top = s[j] > top ? s[j] : top;
        float total = 0.f;
        for (long j = 0; j < len; ++j) { s[j] = std::exp(s[j] - top); total += s[j]; }
        const float inv = 1.f / total;
        for (long j = 0; j < len; ++j) s[j] *= inv;
    }
    float* out = a.out + (row * a.heads + kvh * group) * d;
    for (long i = 0; i < group * d; ++i) out[i] = 0.f;
    for (long j = 0; j < len; ++j) {
        const float* value = a.v_cache + table[j / a.block_size] * block_stride + (j % a.block_size) * token_stride + kvh * d;
        for (long g = 0; g < group; ++g) {
            const v8f p = v8f{} + scores[g * len + j];
            float* og = out + g * d;
            for (long h = 0; h < d; h += 8) store8(og + h, load8(og + h) + p * load8(value + h));
        }
    }
}

static void paged_items_baseline(const PagedDecode& a, long first, long last) {
    std::vector<float> scores;
    for (long item = first; item < last; ++item) paged_item_body(a, item / a.kv_heads, item % a.kv_heads, scores);
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) static void paged_items_avx2(const PagedDecode& a, long first, long last) {
    std::vector<float> scores;
    for (long item = first; item < last; ++item) paged_item_body(a, item / a.kv_heads, item % a.kv_heads, scores);
}
#endif

typedef void (*PagedItems)(const PagedDecode&, long, long);

static PagedItems pick_paged_items() {
#if defined(__x86_64__) && defined(__GNUC__)
    if (has_avx2_fma()) return paged_items_avx2;
#endif
    return paged_items_baseline;
}

// dim must be a multiple of 8 and heads a multiple of kv_heads (the caller checks).
static void paged_decode_attention(const PagedDecode& a, int threads) {
    static const PagedItems run = pick_paged_items();
    const long items = a.rows * a.kv_heads;
    if (threads > items) threads = (int)items;
    if (threads < 1) threads = 1;
    std::vector<std::thread> pool;
    const long per = (items + threads - 1) / threads;
    long begin = 0;
    for (int t = 0; t + 1 < threads && begin < items; ++t, begin += per)
        pool.emplace_back(run, std::cref(a), begin, begin + per < items ? begin + per : items);
    if (begin < items) run(a, begin, items);
    for (auto& t : pool) t.join();
}

}  // namespace prelude_cpu
