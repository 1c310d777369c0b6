// A decoder's prompt rows' attention, a part of a row at a time (step_layers.hpp): on AMX's tiles
// where they take the part (amx_attention.hpp: 80 to 8,192 tokens, all its keys its own), its
// query heads' chunks of queries the items; else on the vector kernel (prefill_attention.hpp),
// whose items are a KV head's tile of queries. The items are what a preemptible step slices
// between its looks at the stop flag.
#pragma once
#include <algorithm>

#include "amx_attention.hpp"
#include "prefill_attention.hpp"
#include "team.hpp"

namespace prelude_cpu {

static long prompt_items(const PrefillAttention& a) {
    return amx_attention_takes(a) ? amx_attention_items(a) : prefill_items(a);
}

// An item's multiply-adds: its queries' heads against about the keys they see, K and V.
static long prompt_item_macs(const PrefillAttention& a) {
    const long per_query_head = 2 * (a.m - a.n / 2) * a.dim;
    return (amx_attention_takes(a) ? std::min(a.n, kAmxQueryChunk) : kTile * (a.heads / a.kv_heads)) * per_query_head;
}

// Items [first, last) on the team.
static void prompt_attention_items(const PrefillAttention& a, long first, long last, int threads) {
    if (!amx_attention_takes(a)) {
        prefill_attention_items(a, first, last, threads);
        return;
    }
    threads = threads_worth(prompt_item_macs(a) * (last - first) / 8, threads);
    parallel_ranges(last - first, threads < 1 ? 1 : threads, 1, [&](long begin, long end) {
        AmxAttentionScratch scratch;
        amx_attention_begin();
        amx_attention_run(a, first + begin, first + end, scratch);
        amx_attention_end();
    });
}

// A whole part (the layer-by-layer path's causal_prefill). dim must be a multiple of 8, heads a
// multiple of kv_heads, m >= n >= 1, m - context >= n (the caller checks).
static void prompt_attention(const PrefillAttention& a, int threads) {
    prompt_attention_items(a, 0, prompt_items(a), threads);
}

}  // namespace prelude_cpu
