// Causal attention of one prompt row's new tokens over its keys, fp32, GQA: query i of n sees
// keys [0, m - n + i] of m (a chunk sees its cached context whole). torch's CPU flash kernel ran
// a 128-token row of the demo model's heads (8 x 32) at ~30 GFLOPS a thread, a fifth of an
// 8-row one-token step, where the step's GEMMs run at ~80: its blocks are sized for long
// sequences, and a small row pays their set-up and full causal blocks.
//
// A work item is one KV head and a tile of kTile queries: the tile's queries times the group's
// query heads share every key and value they read. Keys go in blocks of up to kKeys,
// flash-style: the block's scores (from keys transposed once per call, so that a score vector
// is 8 keys of one query), an online softmax, then P.V into the item's accumulators. Tiles are
// handed out from both ends of the row, so that the threads' shares of the causal triangle are
// about equal.
#pragma once
#include <cmath>
#include <limits>
#include <vector>

#include "simd.hpp"
#include "team.hpp"

namespace prelude_cpu {

struct PrefillAttention {
    const float* q;  // [n, heads, dim], tokens q_stride floats apart, heads dim apart
    const float* k;  // [m, kv_heads, dim], tokens k_stride floats apart
    const float* v;  // [m, kv_heads, dim], tokens v_stride floats apart
    float* out;      // [n, heads, dim] contiguous
    long n, m, heads, kv_heads, dim, q_stride, k_stride, v_stride;
    float scale;
    // Set by prefill_attention: K transposed block by block, [kv_heads, blocks, dim, block]
    // (keys past m zero), so that a score vector is 8 keys of one query and a block's keys are
    // one contiguous run: transposed whole, a block's dims lay a page apart at long prompts, and
    // heads of 128 ran out of TLB entries.
    const float* kt = nullptr;
    long block = 0, blocks = 0;
};

static constexpr long kTile = 16;  // queries per work item
static constexpr long kKeys = 64;  // most keys per block (the score rows' stride)
// A block's transposed keys stay within 16 KB (half of L1): every row group reads them all.
static constexpr long kBlockFloats = 4096;

static inline long keys_per_block(long dim) {
    const long fit = kBlockFloats / dim / 8 * 8;
    return fit < 8 ? 8 : fit > kKeys ? kKeys : fit;
}

struct PrefillScratch {
    std::vector<float> s, o, top, total;
};

// The two products run as kRows rows by V vectors of 8 (keys, or output columns): each vector
// of K or V loaded once serves all kRows rows, so loads stay below the FMAs. (Two rows by four
// vectors had the compiler fold every load into both rows' FMAs: ten loads per eight FMAs.)
static constexpr int kRows = 4;

// acc[r] += sum over i < len of a[r][i] * b[i * stride .. + 8 V): the scores (a: query rows,
// b: transposed keys) and P.V (a: weight rows, b: value rows) are both this product.
template <int V>
__attribute__((always_inline)) static inline void accumulate_rows(const float* const* a, const float* b, long stride,
                                                                  long len, v8f (&acc)[kRows][V]) {
    for (long i = 0; i < len; ++i) {
        const float* bi = b + i * stride;
        v8f bv[V];
#pragma GCC unroll 4
        for (int u = 0; u < V; ++u) bv[u] = load8(bi + 8 * u);
#pragma GCC unroll 4
        for (int r = 0; r < kRows; ++r) {
            const v8f x = splat(a[r][i]);
#pragma GCC unroll 4
            for (int u = 0; u < V; ++u) acc[r][u] += x * bv[u];
        }
    }
}

// Rows' scores against V vectors of 8 keys (kt: keys transposed, `stride` apart per dim).
template <int V>
__attribute__((always_inline)) static inline void scores_rows(const float* const* q, const float* kt, long stride,
                                                              long d, float scale, float* const* s) {
    v8f acc[kRows][V] = {};
    accumulate_rows<V>(q, kt, stride, d, acc);
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
        for (int u = 0; u < V; ++u) store8(s[r] + 8 * u, acc[r][u] * scale);
}

// Rows' outputs, V vectors of 8 columns: o += p . values (nk keys, `stride` floats apart).
template <int V>
__attribute__((always_inline)) static inline void pv_rows(const float* const* p, const float* values, long stride,
                                                          long nk, float* const* o) {
    v8f acc[kRows][V];
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
        for (int u = 0; u < V; ++u) acc[r][u] = load8(o[r] + 8 * u);
    accumulate_rows<V>(p, values, stride, nk, acc);
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
        for (int u = 0; u < V; ++u) store8(o[r] + 8 * u, acc[r][u]);
}

// One KV head g, queries [i0, i1). Rows of the item are (query, head of the group), query-major.
__attribute__((always_inline)) static inline void prefill_item_body(const PrefillAttention& a, long g, long i0, long i1,
                                                                    PrefillScratch& w) {
    const long group = a.heads / a.kv_heads, d = a.dim, rows = (i1 - i0) * group, past = a.m - a.n;
    const float neg_inf = -std::numeric_limits<float>::infinity();
    w.s.resize(rows * kKeys);
    w.o.assign(rows * d, 0.f);
    w.top.assign(rows, neg_inf);
    w.total.assign(rows, 0.f);
    float *s = w.s.data(), *o = w.o.data();
    const long block = a.block;
    const v8f iota = {0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f};  // a lane's offset, for masks
    // Row r's query vector and the last key it sees.
    auto qrow = [&](long r) { return a.q + (i0 + r / group) * a.q_stride + (g * group + r % group) * d; };
    auto limit = [&](long r) { return past + i0 + r / group; };
    const long keys_end = past + i1;  // one past the last key any row of the item sees
    for (long j0 = 0; j0 < keys_end; j0 += block) {
        const float* kt = a.kt + (g * a.blocks + j0 / block) * d * block;
        const long nk = keys_end - j0 < block ? keys_end - j0 : block;
        const long nk8 = (nk + 7) / 8 * 8;  // score columns computed (past nk: zero keys, masked)
        // Scores, kRows rows at a time (the last group repeats its last row).
        for (long r = 0; r < rows; r += kRows) {
            const float* q[kRows];
            float* sr[kRows];
            for (int t = 0; t < kRows; ++t) {
                const long row = r + t < rows ? r + t : rows - 1;
                q[t] = qrow(row);
                sr[t] = s + row * kKeys;
            }
            long c = 0;
            for (; c + 16 <= nk8; c += 16) {
                float* at[kRows] = {sr[0] + c, sr[1] + c, sr[2] + c, sr[3] + c};
                scores_rows<2>(q, kt + c, block, d, a.scale, at);
            }
            if (c < nk8) {
                float* at[kRows] = {sr[0] + c, sr[1] + c, sr[2] + c, sr[3] + c};
                scores_rows<1>(q, kt + c, block, d, a.scale, at);
            }
        }
        // Online softmax: each row's scores become weights against its running maximum.
        for (long r = 0; r < rows; ++r) {
            float* sr = s + r * kKeys;
            const long seen = limit(r) - j0 + 1;  // keys of this block row r sees
            const long valid = seen < nk ? seen : nk;
            if (valid <= 0) {
                for (long j = 0; j < nk8; ++j) sr[j] = 0.f;
                continue;
            }
            v8f top8 = splat(neg_inf);
            for (long j = 0; j < nk8; j += 8) {
                const v8f x = load8(sr + j);
                const v8i masked = splat(float(valid - j)) > iota;
                top8 = masked ? (x > top8 ? x : top8) : top8;
            }
            float block_top = top8[0];
            for (int t = 1; t < 8; ++t) block_top = top8[t] > block_top ? top8[t] : block_top;
            const float top = block_top > w.top[r] ? block_top : w.top[r];
            const float rescale = w.top[r] == neg_inf ? 0.f : std::exp(w.top[r] - top);
            v8f sum8 = {};
            for (long j = 0; j < nk8; j += 8) {
                const v8i seen8 = splat(float(valid - j)) > iota;
                const v8f e = seen8 ? exp8(load8(sr + j) - top) : v8f{};
                store8(sr + j, e);
                sum8 += e;
            }
            w.total[r] = w.total[r] * rescale + hsum(sum8);
            w.top[r] = top;
            if (rescale != 1.f) {
                float* orow = o + r * d;
                for (long x = 0; x < d; x += 8) store8(orow + x, load8(orow + x) * rescale);
            }
        }
        // O += P.V, kRows rows at a time.
        const float* values = a.v + j0 * a.v_stride + g * d;
        for (long r = 0; r < rows; r += kRows) {
            const float* p[kRows];
            float* orow[kRows];
            for (int t = 0; t < kRows; ++t) {
                const long row = r + t < rows ? r + t : rows - 1;
                p[t] = s + row * kKeys;
                orow[t] = o + row * d;
            }
            long c = 0;
            for (; c + 16 <= d; c += 16) {
                float* at[kRows] = {orow[0] + c, orow[1] + c, orow[2] + c, orow[3] + c};
                pv_rows<2>(p, values + c, a.v_stride, nk, at);
            }
            if (c < d) {
                float* at[kRows] = {orow[0] + c, orow[1] + c, orow[2] + c, orow[3] + c};
                pv_rows<1>(p, values + c, a.v_stride, nk, at);
            }
        }
    }
    for (long r = 0; r < rows; ++r) {
        const float inv = 1.f / w.total[r];
        const float* orow = o + r * d;
        float* dst = a.out + ((i0 + r / group) * a.heads + g * group + r % group) * d;
        for (long x = 0; x < d; x += 8) store8(dst + x, load8(orow + x) * inv);
    }
}

// Items [first, last) of kv_heads x tiles; item k's tile alternates from the row's two ends.
__attribute__((always_inline)) static inline void prefill_items_body(const PrefillAttention& a, long first, long last) {
    PrefillScratch w;
    const long tiles = (a.n + kTile - 1) / kTile;
    for (long item = first; item < last; ++item) {
        const long k = item / a.kv_heads, g = item % a.kv_heads;
        const long tile = k % 2 == 0 ? k / 2 : tiles - 1 - k / 2;
        const long i0 = tile * kTile, i1 = i0 + kTile < a.n ? i0 + kTile : a.n;
        prefill_item_body(a, g, i0, i1, w);
    }
}

PRELUDE_CPU_VARIANTS(prefill_items, (const PrefillAttention& a, long first, long last), (a, first, last))

// dim must be a multiple of 8, heads a multiple of kv_heads, m >= n >= 1 (the caller checks).
static void prefill_attention(const PrefillAttention& args, int threads) {
    PrefillAttention a = args;
    // Keys are transposed once here, not per work item: every query tile of a head reads them
    // (transposing per item was a fifth of a 128-token row's time).
    a.block = keys_per_block(a.dim);
    a.blocks = (a.m + a.block - 1) / a.block;
    std::vector<float> kt(a.kv_heads * a.blocks * a.dim * a.block, 0.f);
    for (long j = 0; j < a.m; ++j)
        for (long g = 0; g < a.kv_heads; ++g) {
            const float* key = a.k + j * a.k_stride + g * a.dim;
            float* col = kt.data() + ((g * a.blocks + j / a.block) * a.dim) * a.block + j % a.block;
            for (long x = 0; x < a.dim; ++x) col[x * a.block] = key[x];
        }
    a.kt = kt.data();
    const long tiles = (a.n + kTile - 1) / kTile;
    // Work ~ the keys each query sees: n queries over about (m - n) + n / 2 keys, K and V.
    threads = threads_worth(2 * a.n * (a.m - a.n / 2) * a.heads * a.dim / 8, threads);
    if (threads < 1) threads = 1;
    parallel_ranges(tiles * a.kv_heads, threads, 1, [&](long first, long last) { run_prefill_items(a, first, last); });
}

}  // namespace prelude_cpu
