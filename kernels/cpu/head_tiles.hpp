// A bf16 weight by rows (an LM head: its embedding lookups need the rows) times many fp32 rows, on
// AMX's tiles (a prompt's logprobs: every prompt token's row). skinny_gemm streams the rows for a
// decode step's few; from tens of rows on it computes, and fell behind torch's fp32 sgemm on the
// head's fp32 copy (B's head at 512 rows: 1.3x its time), so a head kept in bf16 goes to the
// tiles, as bf16x3 goes (amx_gemm.hpp): each row split into bf16 halves, the weight bf16 itself,
// hi x w + lo x w in fp32 sums, within 2^-16 of fp32's products.
//
// The tiles read a weight in panels: line q of a panel holds word q (two bf16s) of each of 16
// outputs. By rows a 32-bit word of a row holds two of its elements too, in weights.hpp's
// interleave (elements j and j + 8 of a group of 16), and a product's sum over k does not care
// about k's order: so 32 rows are gathered into two panels word for word, and the rows of x are
// put into the same order before they are split.
#pragma once
#include <immintrin.h>

#include <memory>

#include "amx_gemm.hpp"
#include "team.hpp"
#include "weights.hpp"

namespace prelude_cpu {

// From this many rows a bf16 weight by rows goes to the tiles (fewer stream it: skinny_gemm). B's
// head (151,936 x 512), p25 of 15 calls: at 8-10 rows the two within noise (9-12 ms), at 12 rows
// tiles 10.1-10.3 against 11.1-11.8 ms, at 16 10.4-10.7 against 15.0-15.9, at 32 13.4-14.6
// against 25.5-27.6, at 63 29-30 against 61.
constexpr long kRowsOnTilesFrom = 12;

#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
// Words [0, 16) of 16 rows `stride` words apart as 16 lines of a panel (line j: word j of each
// row), transposed in registers: two rounds of unpacking, two of 128-bit shuffles.
__attribute__((target("avx512f"))) static inline void transpose_words(const int32_t* rows, long stride, int32_t* lines) {
    __m512i r[16], t[16], u[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(rows + i * stride);
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int g = 0; g < 16; g += 4) {  // u[g + k]: rows g..g+3, word 4L + k in 128-bit lane L
        u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
        u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
        u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
        u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
    }
    for (int k = 0; k < 4; ++k) {
        const __m512i low = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x44), high = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xEE);
        const __m512i low2 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x44);
        const __m512i high2 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xEE);
        _mm512_storeu_si512(lines + 16 * k, _mm512_shuffle_i32x4(low, low2, 0x88));
        _mm512_storeu_si512(lines + 16 * (4 + k), _mm512_shuffle_i32x4(low, low2, 0xDD));
        _mm512_storeu_si512(lines + 16 * (8 + k), _mm512_shuffle_i32x4(high, high2, 0x88));
        _mm512_storeu_si512(lines + 16 * (12 + k), _mm512_shuffle_i32x4(high, high2, 0xDD));
    }
}

// Rows [0, count) of w (count <= 32) as two panels at `panel`, word for word (rows past count:
// zero): whole panels transposed 16 words at a time (B's head at 64 rows 35.6 -> 30.5 ms, at 128
// rows 59.2 -> 52.9, against a gather per line), a part panel gathered.
__attribute__((target("avx512f"))) static void gather_panels(const bf16* w, long inputs, long count, bf16* panel) {
    const long words = inputs / 2;
    const __m512i row_at = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                              _mm512_set1_epi32((int)words));
    for (long half = 0; half < 2; ++half) {
        const long rows = count - kPanel * half;
        int32_t* line = reinterpret_cast<int32_t*>(panel + half * inputs * kPanel);
        if (rows <= 0) {
            std::memset(line, 0, inputs * kPanel * sizeof(bf16));
            continue;
        }
        const __mmask16 valid = rows >= kPanel ? (__mmask16)0xFFFF : (__mmask16)((1u << rows) - 1);
        const int32_t* word = reinterpret_cast<const int32_t*>(w + kPanel * half * inputs);
        if (rows >= kPanel) {  // words is a multiple of 16 (inputs of 32)
            for (long q = 0; q < words; q += 16) transpose_words(word + q, words, line + kPanel * q);
            continue;
        }
        for (long q = 0; q < words; ++q)
            _mm512_storeu_si512(line + kPanel * q,
                                _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, row_at, word + q, 4));
    }
}

// Panel pairs [begin, end) of w by all rows (one thread's share): a group of pairs that fits a
// share of L2 gathered at a time, then run over all the rows as any panels are (amx_panels).
static void pair_range(const Bf16x3Tiles& tiles, const bf16* xt, long tiled, long n, const bf16* w, long inputs,
                       float* out, long outputs, long begin, long end) {
    const long pair_elements = 2 * kPanel * inputs;
    const long fit = kAmxBlockBytes / (pair_elements * (long)sizeof(bf16));
    const long group = fit > 1 ? fit : 1;
    std::unique_ptr<bf16[]> panels(new bf16[group * pair_elements]);
    for (long g0 = begin; g0 < end; g0 += group) {
        const long g1 = g0 + group < end ? g0 + group : end;
        const long col = 2 * kPanel * g0;
        const long cols = outputs - col < 2 * kPanel * (g1 - g0) ? outputs - col : 2 * kPanel * (g1 - g0);
        for (long p = g0; p < g1; ++p) {
            const long count = outputs - 2 * kPanel * p < 2 * kPanel ? outputs - 2 * kPanel * p : 2 * kPanel;
            gather_panels(w + 2 * kPanel * p * inputs, inputs, count, panels.get() + (p - g0) * pair_elements);
        }
        amx_panels(tiles, xt, tiled, n, panels.get(), inputs, out + col, cols, outputs, 0, (cols + kPanel - 1) / kPanel,
                   nullptr, kNoActivation);
    }
}

// out[n, outputs] = x . w^T, w bf16 by rows (weights.hpp's interleave), inputs a multiple of 32, on
// AMX (the caller checked has_amx()): x's rows put in the weight's word order and split into
// tiles once, then the panel pairs shared out among the threads.
static void bf16_rows_on_tiles(const float* x, long n, const bf16* w, long inputs, float* out, long outputs,
                               int threads) {
    const long tiled = (n + kAmxRows - 1) / kAmxRows * kAmxRows;
    std::unique_ptr<float[]> ordered(new float[n * inputs]);  // x's rows in the weight's word order
    for (long i = 0; i < n; ++i)
        for (long g = 0; g < inputs; g += 16)
            for (long e = 0; e < 16; ++e) ordered[i * inputs + g + 2 * (e % 8) + e / 8] = x[i * inputs + g + e];
    std::unique_ptr<bf16[]> xt(new bf16[2 * tiled * inputs]);  // hi tiles, then lo tiles
    parallel_ranges(tiled, threads_worth(tiled * inputs, threads), kAmxRows, [&](long begin, long end) {
        split_to_tiles(ordered.get(), n, xt.get(), xt.get() + tiled * inputs, begin, end, inputs);
    });
    const Bf16x3Tiles tiles{{}, tiled * inputs, 0};  // no lo panels: w is bf16 itself
    const long pairs = (outputs + 2 * kPanel - 1) / (2 * kPanel);
    parallel_ranges(pairs, threads, 1, [&](long begin, long end) {
        pair_range(tiles, xt.get(), tiled, n, w, inputs, out, outputs, begin, end);
    });
}
#else
static void bf16_rows_on_tiles(const float*, long, const bf16*, long, float*, long, int) {}
#endif

}  // namespace prelude_cpu
