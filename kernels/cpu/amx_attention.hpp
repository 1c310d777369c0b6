// A prompt row's attention on AMX's tiles, one head at a time, in fp32 to about 2^-16: an
// encoder's row (bidirectional) or a decoder's (causal, with no cached context: its keys are its
// own). q, k, v and the softmax weights are split into bf16 halves as amx_gemm.hpp's bf16x3 splits
// fp32 weights (hi their rounding, lo that of the rest), and each product is hi x hi + lo x hi +
// hi x lo in fp32 sums.
//
// A head's keys and values are split once into the tiles' right-hand layout (a tile row holds
// two consecutive k of 16 columns): keys transposed (k = the head's dims, columns = keys), values
// as they lie (k = keys, columns = dims). Then, 16 queries at a time: their scores against every
// key (16 x 16 tiles into a score row per query), a softmax over each query's row that writes its
// weights as left-hand tiles (16 queries x 32 keys), and weights x values into 16 x dim sums,
// divided by the weights' total as they leave. A causal row's 16 queries score and weigh only the
// keys up to the last of them, each query's past its own weighing nothing; a head's split keys
// and values serve every query head of its group (GQA). A row of all-MiniLM's head (dim 32) takes one
// tile of k for its scores; the vector kernel (prefill_attention.hpp) spends its time in the same
// multiply-adds, 16 lanes at a time.
#pragma once
#include <immintrin.h>

#include <cstring>
#include <limits>
#include <vector>

#include "amx_gemm.hpp"
#include "prefill_attention.hpp"
#include "simd.hpp"
#include "weights.hpp"

namespace prelude_cpu {

// Rows the tiles take: at least 80 tokens, below which splitting a head's keys and values and
// padding them to whole tiles costs more than the tiles save (6,400 tokens of all-MiniLM's heads
// in rows of 48: 5.3 ms on the vector kernel, 6.8 on the tiles; rows of 96: 9.3 and 8.4; rows of
// 200: 8.3 and 5.9), and at most a step's 8,192 tokens, whose split keys and values and 16 score
// rows a thread keeps meanwhile (under 9 MB at dims of 128; B's one 2,048-token row 414 -> 287
// ms a step, 4,000 tokens 1,175 -> 761, against the vector kernel).
constexpr long kAmxAttentionTokens = 8192;
constexpr long kAmxAttentionMinTokens = 80;
// A work item is a query head's queries this many at a time (a preemptible step looks at its
// flag between items: a head's 8,000 queries took 25 ms of the demo model at once).
constexpr long kAmxQueryChunk = 256;
constexpr long kTileElems = kAmxRows * kAmxK;  // bf16 of one tile

struct AmxAttentionScratch {
    std::vector<bf16> k_hi, k_lo, v_hi, v_lo, q_hi, q_lo, p_hi, p_lo;
    std::vector<float> s, o, total;
    std::vector<uint32_t> pairs;  // 16 keys' bf16 pairs before they are transposed
};

#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
#define PRELUDE_AMX_ATTENTION __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512bf16")))

// The tiles take the row `a`: its n tokens, heads dim wide, all its keys its own (a causal row's
// with no cached context, not an item of a multi-item row).
static inline bool amx_attention_takes(const PrefillAttention& a) {
    return a.dim % kAmxK == 0 && kAmxAttentionMinTokens <= a.n && a.n <= kAmxAttentionTokens && a.m == a.n &&
           (a.bidirectional || (a.context == 0 && a.gap == 0)) && has_amx();
}

// 32 floats (v0 then v1) as their bf16 rounding (hi) and that of the rest (lo), in order.
PRELUDE_AMX_ATTENTION __attribute__((always_inline)) static inline void split32(__m512 v0, __m512 v1, __m512i& hi,
                                                                                __m512i& lo) {
    const __m512bh h = _mm512_cvtne2ps_pbh(v1, v0);
    const __m512i hb = (__m512i)h;
    const __m512 h0 = _mm512_cvtpbh_ps((__m256bh)_mm512_castsi512_si256(hb));
    const __m512 h1 = _mm512_cvtpbh_ps((__m256bh)_mm512_extracti64x4_epi64(hb, 1));
    hi = hb;
    lo = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(v1, h1), _mm512_sub_ps(v0, h0));
}

// KV head h's keys as right-hand tiles: tile (key block b, dims tile t) row r holds dims 2r, 2r + 1
// of t's 32 for each of b's 16 keys (zeros past the row's n).
PRELUDE_AMX_ATTENTION static void split_keys(const PrefillAttention& a, long h, long blocks, AmxAttentionScratch& w) {
    const long dims = a.dim / kAmxK;
    w.k_hi.resize(blocks * dims * kTileElems);
    w.k_lo.resize(blocks * dims * kTileElems);
    w.pairs.resize(2 * kAmxRows * kAmxRows);
    uint32_t* hi_pairs = w.pairs.data();
    uint32_t* lo_pairs = hi_pairs + kAmxRows * kAmxRows;
    const __m512i columns = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                               _mm512_set1_epi32((int)kAmxRows));
    for (long b = 0; b < blocks; ++b)
        for (long t = 0; t < dims; ++t) {
            for (long key = 0; key < kAmxRows; ++key) {
                const long j = b * kAmxRows + key;
                __m512i hi = _mm512_setzero_si512(), lo = _mm512_setzero_si512();
                if (j < a.n) {
                    const float* row = a.k + j * a.k_stride + h * a.dim + t * kAmxK;
                    split32(_mm512_loadu_ps(row), _mm512_loadu_ps(row + 16), hi, lo);
                }
                _mm512_storeu_si512(hi_pairs + key * kAmxRows, hi);
                _mm512_storeu_si512(lo_pairs + key * kAmxRows, lo);
            }
            bf16* hi_tile = w.k_hi.data() + (b * dims + t) * kTileElems;
            bf16* lo_tile = w.k_lo.data() + (b * dims + t) * kTileElems;
            for (long r = 0; r < kAmxRows; ++r) {  // tile row r: pair r of every key
                _mm512_storeu_si512(hi_tile + r * kAmxK, _mm512_i32gather_epi32(columns, hi_pairs + r, 4));
                _mm512_storeu_si512(lo_tile + r * kAmxK, _mm512_i32gather_epi32(columns, lo_pairs + r, 4));
            }
        }
}

// KV head h's values as right-hand tiles: tile (keys tile t of 32, columns c of 16) row r holds keys
// 2r and 2r + 1 of t, interleaved, for each of c's 16 dims (zeros past the row's n).
PRELUDE_AMX_ATTENTION static void split_values(const PrefillAttention& a, long h, long key_tiles,
                                               AmxAttentionScratch& w) {
    const long columns = a.dim / kAmxRows;
    w.v_hi.resize(key_tiles * columns * kTileElems);
    w.v_lo.resize(key_tiles * columns * kTileElems);
    // (key 2r dim c) and (key 2r + 1 dim c) side by side, from the 16 dims of one then the other.
    const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                                22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (long t = 0; t < key_tiles; ++t)
        for (long c = 0; c < columns; ++c) {
            bf16* hi_tile = w.v_hi.data() + (t * columns + c) * kTileElems;
            bf16* lo_tile = w.v_lo.data() + (t * columns + c) * kTileElems;
            for (long r = 0; r < kAmxRows; ++r) {
                const long j = t * kAmxK + 2 * r;
                const float* v0 = a.v + j * a.v_stride + h * a.dim + c * kAmxRows;
                const __m512 x0 = j < a.n ? _mm512_loadu_ps(v0) : _mm512_setzero_ps();
                const __m512 x1 = j + 1 < a.n ? _mm512_loadu_ps(v0 + a.v_stride) : _mm512_setzero_ps();
                __m512i hi, lo;
                split32(x0, x1, hi, lo);
                _mm512_storeu_si512(hi_tile + r * kAmxK, _mm512_permutexvar_epi16(interleave, hi));
                _mm512_storeu_si512(lo_tile + r * kAmxK, _mm512_permutexvar_epi16(interleave, lo));
            }
        }
}

// Queries [i0, i0 + rows) of head h, scaled, as left-hand tiles (one per 32 dims; rows past
// `rows` zero).
PRELUDE_AMX_ATTENTION static void split_queries(const PrefillAttention& a, long h, long i0, long rows,
                                                AmxAttentionScratch& w) {
    const long dims = a.dim / kAmxK;
    const __m512 scale = _mm512_set1_ps(a.scale);
    for (long t = 0; t < dims; ++t)
        for (long r = 0; r < kAmxRows; ++r) {
            __m512i hi = _mm512_setzero_si512(), lo = _mm512_setzero_si512();
            if (r < rows) {
                const float* q = a.q + (i0 + r) * a.q_stride + h * a.dim + t * kAmxK;
                split32(_mm512_mul_ps(_mm512_loadu_ps(q), scale), _mm512_mul_ps(_mm512_loadu_ps(q + 16), scale), hi,
                        lo);
            }
            _mm512_storeu_si512(w.q_hi.data() + t * kTileElems + r * kAmxK, hi);
            _mm512_storeu_si512(w.q_lo.data() + t * kTileElems + r * kAmxK, lo);
        }
}

// Left-hand tiles 2 (hi) and 3 (lo) for right_products.
PRELUDE_AMX_ATTENTION __attribute__((always_inline)) static inline void load_left(const bf16* hi, const bf16* lo) {
    _tile_loadd(2, hi, 64);
    _tile_loadd(3, lo, 64);
}

// Tile 0 (and 1) += left tiles 2 (hi), 3 (lo) by right tiles 4 (5) hi, 6 (7) lo.
template <bool kTwo>
PRELUDE_AMX_ATTENTION __attribute__((always_inline)) static inline void right_products(const bf16* b0_hi,
                                                                                      const bf16* b0_lo,
                                                                                      const bf16* b1_hi,
                                                                                      const bf16* b1_lo) {
    _tile_loadd(4, b0_hi, 64);
    _tile_loadd(6, b0_lo, 64);
    _tile_dpbf16ps(0, 2, 4);
    _tile_dpbf16ps(0, 3, 4);
    _tile_dpbf16ps(0, 2, 6);
    if (kTwo) {
        _tile_loadd(5, b1_hi, 64);
        _tile_loadd(7, b1_lo, 64);
        _tile_dpbf16ps(1, 2, 5);
        _tile_dpbf16ps(1, 3, 5);
        _tile_dpbf16ps(1, 2, 7);
    }
}

// The 16 queries' scores against key blocks [0, blocks) into w.s (a row of `stride` per query).
// A head of 32 dims keeps its queries' tiles loaded throughout.
PRELUDE_AMX_ATTENTION static void tile_scores(long dims, long blocks, long stride, AmxAttentionScratch& w) {
    const bf16 *k_hi = w.k_hi.data(), *k_lo = w.k_lo.data(), *q_hi = w.q_hi.data(), *q_lo = w.q_lo.data();
    if (dims == 1) load_left(q_hi, q_lo);
    for (long b = 0; b < blocks; b += 2) {
        const bool two = b + 1 < blocks;
        _tile_zero(0);
        _tile_zero(1);
        for (long t = 0; t < dims; ++t) {
            const long at = (b * dims + t) * kTileElems, next = at + dims * kTileElems;
            if (dims > 1) load_left(q_hi + t * kTileElems, q_lo + t * kTileElems);
            if (two) right_products<true>(k_hi + at, k_lo + at, k_hi + next, k_lo + next);
            else right_products<false>(k_hi + at, k_lo + at, nullptr, nullptr);
        }
        _tile_stored(0, w.s.data() + b * kAmxRows, stride * (long)sizeof(float));
        if (two) _tile_stored(1, w.s.data() + (b + 1) * kAmxRows, stride * (long)sizeof(float));
    }
}

// Each of the first `rows` queries' scores over its keys (all n, or with `causal` query i0 + r's
// first i0 + r + 1) into weights e^(s - max) as left-hand tiles (one per 32 keys, zeros past its
// keys) and their total; rows past `rows` weigh nothing.
PRELUDE_AMX_ATTENTION static void tile_weights(long n, long rows, long key_tiles, long stride, bool causal, long i0,
                                               AmxAttentionScratch& w) {
    for (long t = 0; t < key_tiles && rows < kAmxRows; ++t) {  // the padding rows
        std::memset(w.p_hi.data() + t * kTileElems + rows * kAmxK, 0, (kAmxRows - rows) * kAmxK * sizeof(bf16));
        std::memset(w.p_lo.data() + t * kTileElems + rows * kAmxK, 0, (kAmxRows - rows) * kAmxK * sizeof(bf16));
    }
    for (long r = 0; r < rows; ++r) {
        const float* s = w.s.data() + r * stride;
        const long seen = causal && i0 + r + 1 < n ? i0 + r + 1 : n;
        auto lanes = [&](long j) {
            return (__mmask16)(seen - j >= 16 ? 0xffff : seen - j <= 0 ? 0 : (1u << (seen - j)) - 1);
        };
        __m512 top = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
        for (long j = 0; j < seen; j += 16) top = _mm512_mask_max_ps(top, lanes(j), top, _mm512_loadu_ps(s + j));
        const __m512 max = _mm512_set1_ps(_mm512_reduce_max_ps(top));
        __m512 sum = _mm512_setzero_ps();
        for (long t = 0; t < key_tiles; ++t) {
            __m512 e[2];
            for (int u = 0; u < 2; ++u) {
                const long j = t * kAmxK + 16 * u;
                const __mmask16 m = lanes(j);
                const v16f x = (v16f)_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + (m ? j : 0)), max);
                e[u] = _mm512_maskz_mov_ps(m, (__m512)exp_lanes(x));
                sum = _mm512_add_ps(sum, e[u]);
            }
            __m512i hi, lo;
            split32(e[0], e[1], hi, lo);
            _mm512_storeu_si512(w.p_hi.data() + t * kTileElems + r * kAmxK, hi);
            _mm512_storeu_si512(w.p_lo.data() + t * kTileElems + r * kAmxK, lo);
        }
        w.total[r] = _mm512_reduce_add_ps(sum);
    }
}

// Weights x values for the 16 queries into w.o (16 x dim), two tiles of 16 dims at a time.
PRELUDE_AMX_ATTENTION static void tile_outputs(long dim, long key_tiles, AmxAttentionScratch& w) {
    const long columns = dim / kAmxRows;
    for (long c = 0; c < columns; c += 2) {
        _tile_zero(0);
        _tile_zero(1);
        for (long t = 0; t < key_tiles; ++t) {
            const long at = (t * columns + c) * kTileElems;
            load_left(w.p_hi.data() + t * kTileElems, w.p_lo.data() + t * kTileElems);
            right_products<true>(w.v_hi.data() + at, w.v_lo.data() + at, w.v_hi.data() + at + kTileElems,
                                 w.v_lo.data() + at + kTileElems);
        }
        _tile_stored(0, w.o.data() + c * kAmxRows, dim * (long)sizeof(float));
        _tile_stored(1, w.o.data() + (c + 1) * kAmxRows, dim * (long)sizeof(float));
    }
}

// The tiles' configuration for amx_attention_run, set once by each thread before its rows
// (per row, the configuration and release took 352 rows of 22 tokens from 5.2 to 7.3 ms).
PRELUDE_AMX_ATTENTION static void amx_attention_begin() { configure_tiles(); }
PRELUDE_AMX_ATTENTION static void amx_attention_end() { _tile_release(); }

// The row's work items: each query head's queries, kAmxQueryChunk at a time.
static inline long amx_attention_items(const PrefillAttention& a) {
    return a.heads * ((a.n + kAmxQueryChunk - 1) / kAmxQueryChunk);
}

// Items [first, last) of the row `a` (amx_attention_takes; item i: query head i / chunks, its
// chunk i % chunks), between amx_attention_begin and amx_attention_end.
PRELUDE_AMX_ATTENTION static void amx_attention_run(const PrefillAttention& a, long first, long last,
                                                    AmxAttentionScratch& w) {
    const long n = a.n, dims = a.dim / kAmxK;
    const long blocks = (n + kAmxRows - 1) / kAmxRows, key_tiles = (n + kAmxK - 1) / kAmxK;
    const long stride = blocks * kAmxRows;
    w.q_hi.resize(dims * kTileElems);
    w.q_lo.resize(dims * kTileElems);
    w.p_hi.resize(key_tiles * kTileElems);
    w.p_lo.resize(key_tiles * kTileElems);
    w.s.resize(kAmxRows * stride);
    w.o.resize(kAmxRows * a.dim);
    w.total.resize(kAmxRows);
    const bool causal = !a.bidirectional;
    long split_head = -1;  // the KV head whose keys and values are split in w
    const long chunks = (n + kAmxQueryChunk - 1) / kAmxQueryChunk;
    for (long item = first; item < last; ++item) {
        const long h = item / chunks, kv_head = h / (a.heads / a.kv_heads);
        const long from = item % chunks * kAmxQueryChunk, to = from + kAmxQueryChunk < n ? from + kAmxQueryChunk : n;
        if (kv_head != split_head) {
            split_keys(a, kv_head, blocks, w);
            split_values(a, kv_head, key_tiles, w);
            split_head = kv_head;
        }
        for (long i0 = from; i0 < to; i0 += kAmxRows) {
            const long rows = to - i0 < kAmxRows ? to - i0 : kAmxRows;
            // A causal block's queries see no key past its last query.
            const long seen = causal ? i0 + rows : n;
            const long seen_blocks = (seen + kAmxRows - 1) / kAmxRows, seen_tiles = (seen + kAmxK - 1) / kAmxK;
            split_queries(a, h, i0, rows, w);
            tile_scores(dims, seen_blocks, stride, w);
            tile_weights(n, rows, seen_tiles, stride, causal, i0, w);
            tile_outputs(a.dim, seen_tiles, w);
            for (long r = 0; r < rows; ++r) {
                const __m512 inv = _mm512_set1_ps(1.f / w.total[r]);
                float* dst = a.out + ((i0 + r) * a.heads + h) * a.dim;
                for (long x = 0; x < a.dim; x += 16)
                    _mm512_storeu_ps(dst + x, _mm512_mul_ps(_mm512_loadu_ps(w.o.data() + r * a.dim + x), inv));
            }
        }
    }
}
#undef PRELUDE_AMX_ATTENTION
#else
static inline bool amx_attention_takes(const PrefillAttention&) { return false; }
static inline long amx_attention_items(const PrefillAttention&) { return 0; }
static void amx_attention_run(const PrefillAttention&, long, long, AmxAttentionScratch&) {}
static void amx_attention_begin() {}
static void amx_attention_end() {}
#endif

}  // namespace prelude_cpu
