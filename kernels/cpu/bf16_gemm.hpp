// Rows times a bf16 weight in bf16 arithmetic, on CPUs with AVX-512 BF16: each row of x is
// rounded to bf16 as it is read (what a bf16 model computes in on a GPU or in oneDNN), and
// `vdpbf16ps` adds two bf16 x bf16 products per fp32 lane, 32 multiply-adds an instruction where
// an fp32 FMA does 16, with nothing to widen. The sums stay fp32.
//
// The panel layout is packed_gemm.hpp's for bf16: output j's two consecutive k in lane j of a
// 64-byte group, the pair vdpbf16ps reads. Rows go in blocks as in packed_gemm.hpp, K in its
// slices only past 2 slices' worth (a slice boundary costs the tiles a reload of their sums); a
// tile is up to 8 rows by two neighbouring panels (one at a range's edge), an fp32 accumulator
// each.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "amx_gemm.hpp"
#include "packed_gemm.hpp"
#include "team.hpp"
#include "weights.hpp"

namespace prelude_cpu {

constexpr long kBf16Rows = 8;

// The CPU has AVX-512 BF16, and PRELUDE_CPU_BF16_PRODUCTS=0 does not ask for bf16 weights alone
// (widened, computed on fp32 rows).
static inline bool has_avx512_bf16() {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    static const bool has = has_avx512f() && __builtin_cpu_supports("avx512bf16") &&
                            !(std::getenv("PRELUDE_CPU_BF16_PRODUCTS") != nullptr &&
                              std::string(std::getenv("PRELUDE_CPU_BF16_PRODUCTS")) == "0");
    return has;
#else
    return false;
#endif
}

#if defined(__x86_64__) && defined(__GNUC__)
#define PRELUDE_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

// R rows of xb (bf16) times one panel's slice [k0, k1), into out (`cols` valid columns), set or added.
// Fewer than four rows keep C sums per row over interleaved k, so that a decode row's products
// do not wait on one chain of dependent additions (one chain ran 1.4x slower than the widening
// path at one row).
template <int R>
PRELUDE_BF16 __attribute__((always_inline)) static inline void bf16_tile(const bf16* xb, long inputs, const bf16* panel,
                                                                         long k0, long k1, bool accumulate, float* out,
                                                                         long outputs, long cols, bool stream) {
    constexpr int C = R >= 4 ? 1 : R >= 2 ? 2 : 4;
    __m512 acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    for (long k = k0; k < k1; k += 2 * C) {
        for (int c = 0; c < C && k + 2 * c < k1; ++c) {
            const bf16* group = panel + (k + 2 * c) * kPanel;
            // Streaming a large weight for few rows: a line 8 KB ahead into L2 per 64-byte group.
            if (stream) __builtin_prefetch(group + kPrefetchAheadBytes / 2, 0, 1);
            const __m512i w = _mm512_loadu_si512(group);
            for (int r = 0; r < R; ++r) {
                int32_t pair;
                std::memcpy(&pair, xb + r * inputs + k + 2 * c, sizeof(pair));
                acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)_mm512_set1_epi32(pair), (__m512bh)w);
            }
        }
    }
    const __mmask16 valid = (__mmask16)((1u << cols) - 1);
    for (int r = 0; r < R; ++r) {
        float* o = out + r * outputs;
        __m512 v = acc[r][0];
        for (int c = 1; c < C; ++c) v = _mm512_add_ps(v, acc[r][c]);
        if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(valid, o));
        _mm512_mask_storeu_ps(o, valid, v);
    }
}

// R rows times two whole neighbouring panels' slices (32 columns): each broadcast pair of a row
// feeds two products, half the broadcasts per product of bf16_tile (which oneDNN's larger tiles
// outran by 1.4x at thousands of rows).
template <int R, bool kFetch>
PRELUDE_BF16 __attribute__((always_inline)) static inline void bf16_tile_pair(const bf16* xb, long inputs,
                                                                              const bf16* panel, long k0, long k1,
                                                                              bool accumulate, float* out,
                                                                              long outputs, const PairFetch& fetch,
                                                                              long first, long last) {
    const bf16* next = panel + inputs * kPanel;
    __m512 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (long k = k0, line = first; k < k1; k += 2, ++line) {
        if (kFetch && line < last) __builtin_prefetch(fetch.line(line), 0, 1);
        const __m512i w0 = _mm512_loadu_si512(panel + k * kPanel), w1 = _mm512_loadu_si512(next + k * kPanel);
        for (int r = 0; r < R; ++r) {
            int32_t pair;
            std::memcpy(&pair, xb + r * inputs + k, sizeof(pair));
            const __m512bh x = (__m512bh)_mm512_set1_epi32(pair);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, (__m512bh)w0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, (__m512bh)w1);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int h = 0; h < 2; ++h) {
            float* o = out + r * outputs + h * kPanel;
            __m512 v = acc[r][h];
            if (accumulate) v = _mm512_add_ps(v, _mm512_loadu_ps(o));
            _mm512_storeu_ps(o, v);
        }
}

// Rows <= kBf16Rows of xb against a pair of panels (bf16_tile_pair), fetching ahead or not: the
// check in the products' loop alone cost 4% at 512 rows, where nothing is fetched.
template <bool kFetch>
PRELUDE_BF16 __attribute__((always_inline)) static inline void bf16_pair_tiles(long rows, const bf16* x, long inputs,
                                                                               const bf16* panel, long k0, long k1,
                                                                               bool later, float* o, long outputs,
                                                                               const PairFetch& fetch, long first,
                                                                               long last) {
    switch (rows) {
        case 8: bf16_tile_pair<8, kFetch>(x, inputs, panel, k0, k1, later, o, outputs, fetch, first, last); break;
        case 7: bf16_tile_pair<7, kFetch>(x, inputs, panel, k0, k1, later, o, outputs, fetch, first, last); break;
        case 6: bf16_tile_pair<6, kFetch>(x, inputs, panel, k0, k1, later, o, outputs, fetch, first, last); break;
        case 5: bf16_tile_pair<5, kFetch>(x, inputs, panel, k0, k1, later, o, outputs, fetch, first, last); break;
        case 4: bf16_tile_pair<4, kFetch>(x, inputs, panel, k0, k1, later, o, outputs, fetch, first, last); break;
        case 3: bf16_tile_pair<3, kFetch>(x, inputs, panel, k0, k1, later, o, outputs, fetch, first, last); break;
        case 2: bf16_tile_pair<2, kFetch>(x, inputs, panel, k0, k1, later, o, outputs, fetch, first, last); break;
        default: bf16_tile_pair<1, kFetch>(x, inputs, panel, k0, k1, later, o, outputs, fetch, first, last); break;
    }
}

// kFetch: the tiles fetch the next pair's lines (rows of one block, read once from memory); a
// separate instance, so that more rows run the very loops they ran before it (the instance with
// the fetches beside them measured 2-4% slower at 2,048 rows of B).
template <bool kFetch>
PRELUDE_BF16 static void bf16_panels(const bf16* xb, long n, const bf16* packed, long inputs, float* out, long outputs,
                                     long p_begin, long p_end, const float* bias, long activation) {
    // Rows for one tile read each panel once, whole, in order (bound by memory); more rows go in
    // K slices, so that a panel's slice stays in L1 while their tiles pass over it.
    const bool stream = n <= kBf16Rows;
    const long slice = stream || inputs <= 2 * kSliceK ? inputs : kSliceK;
    for (long r0 = 0; r0 < n; r0 += kBlockRows) {
        const long r1 = r0 + kBlockRows < n ? r0 + kBlockRows : n;
        for (long k0 = 0; k0 < inputs; k0 += slice) {
            const long k1 = k0 + slice < inputs ? k0 + slice : inputs;
            for (long p = p_begin; p < p_end; ++p) {
                const bf16* panel = packed + p * inputs * kPanel;
                const long col = p * kPanel, cols = outputs - col < kPanel ? outputs - col : kPanel;
                if (!stream && p + 1 < p_end && col + 2 * kPanel <= outputs) {
                    const long lines = (k1 - k0 + 1) / 2;
                    const bool ahead = kFetch && p + 3 < p_end;  // the pair after this one is this thread's
                    const PairFetch fetch = {
                        ahead ? (const char*)(panel + 2 * inputs * kPanel + k0 * kPanel) : nullptr,
                        ahead ? (const char*)(panel + 3 * inputs * kPanel + k0 * kPanel) : nullptr, lines};
                    const long total = ahead ? 2 * lines : 0;
                    const long tiles = (r1 - r0 + kBf16Rows - 1) / kBf16Rows;
                    const long share = (total + tiles - 1) / tiles;
                    for (long i = r0, line = 0; i < r1; i += kBf16Rows, line += share) {
                        const bf16* x = xb + i * inputs;
                        float* o = out + i * outputs + col;
                        const bool later = k0 != 0;
                        const long last = line + share < total ? line + share : total;
                        bf16_pair_tiles<kFetch>(r1 - i < kBf16Rows ? r1 - i : kBf16Rows, x, inputs, panel, k0, k1, later, o,
                                                outputs, fetch, line, last);
                    }
                    if (k1 == inputs)
                        finish_block(out + r0 * outputs, r1 - r0, outputs, col, 2 * kPanel, bias, activation);
                    ++p;
                    continue;
                }
                for (long i = r0; i < r1; i += kBf16Rows) {
                    const bf16* x = xb + i * inputs;
                    float* o = out + i * outputs + col;
                    const bool later = k0 != 0;
                    switch (r1 - i < kBf16Rows ? r1 - i : kBf16Rows) {
                        case 8: bf16_tile<8>(x, inputs, panel, k0, k1, later, o, outputs, cols, stream); break;
                        case 7: bf16_tile<7>(x, inputs, panel, k0, k1, later, o, outputs, cols, stream); break;
                        case 6: bf16_tile<6>(x, inputs, panel, k0, k1, later, o, outputs, cols, stream); break;
                        case 5: bf16_tile<5>(x, inputs, panel, k0, k1, later, o, outputs, cols, stream); break;
                        case 4: bf16_tile<4>(x, inputs, panel, k0, k1, later, o, outputs, cols, stream); break;
                        case 3: bf16_tile<3>(x, inputs, panel, k0, k1, later, o, outputs, cols, stream); break;
                        case 2: bf16_tile<2>(x, inputs, panel, k0, k1, later, o, outputs, cols, stream); break;
                        default: bf16_tile<1>(x, inputs, panel, k0, k1, later, o, outputs, cols, stream); break;
                    }
                }
                if (k1 == inputs) finish_block(out + r0 * outputs, r1 - r0, outputs, col, cols, bias, activation);
            }
        }
    }
}
// x rounded to bf16 (to nearest even, as to_bf16; vcvtneps2bf16 also flushes denormals to zero,
// which no product here can tell from them), 16 at a time.
PRELUDE_BF16 static void round_to_bf16(const float* x, bf16* out, long count) {
    long i = 0;
    for (; i + 16 <= count; i += 16)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
    for (; i < count; ++i) out[i] = to_bf16(x[i]);
}
#undef PRELUDE_BF16

// out[n, outputs] = x . w^T for a bf16 panel weight, on the thread team: rows rounded to bf16 in
// ranges, then panels in ranges; `bias` and `activation`: packed_gemm.hpp's epilogue.
static void bf16_gemm(const float* x, long n, const Weight& w, long inputs, float* out, long outputs, int threads,
                      const float* bias = nullptr, long activation = kNoActivation) {
    // Whole tiles of rows on AMX where the CPU has it (their rows in the tiles' order), the rest
    // (or all) by rows on the vector kernel.
    const long tiled = has_amx() && inputs % kAmxK == 0 ? n - n % kAmxRows : 0;
    const long rest = n - tiled;
    std::unique_ptr<bf16[]> xb(new bf16[n * inputs]);
    parallel_ranges(n, threads_worth(n * inputs, threads), 1, [&](long begin, long end) {
        if (begin < tiled) round_to_tiles(x, xb.get(), begin, end < tiled ? end : tiled, inputs);
        if (end > tiled) {
            const long from = (begin > tiled ? begin : tiled) * inputs;
            round_to_bf16(x + from, xb.get() + from, end * inputs - from);
        }
    });
    const long panels = (outputs + kPanel - 1) / kPanel;
    const bf16* packed = static_cast<const bf16*>(w.data);
    parallel_ranges(panels, threads_worth(n * outputs * inputs / 16, threads), 1, [&](long begin, long end) {
        if (tiled) amx_panels(Bf16Tiles{}, xb.get(), tiled, tiled, packed, inputs, out, outputs, outputs, begin, end, bias,
                              activation);
        const bf16* x_rest = xb.get() + tiled * inputs;
        float* o = out + tiled * outputs;
        if (rest == 0) return;
        if (rest <= kBlockRows)
            bf16_panels<true>(x_rest, rest, packed, inputs, o, outputs, begin, end, bias, activation);
        else
            bf16_panels<false>(x_rest, rest, packed, inputs, o, outputs, begin, end, bias, activation);
    });
}

// out[n, outputs] = x . w^T for an fp32 weight split into bf16 halves (amx_gemm.hpp's bf16x3):
// `hi` and `lo` bf16 panels of it (pack_weight's; lo null for bf16x2, a weight hi holds exactly),
// inputs a multiple of 32, on AMX (the caller checked has_amx()). Every row goes to the tiles,
// the last tile padded with zero rows.
static void bf16x3_gemm(const float* x, long n, const bf16* hi, const bf16* lo, long inputs, float* out,
                        long outputs, int threads, const float* bias = nullptr, long activation = kNoActivation) {
    const long tiled = (n + kAmxRows - 1) / kAmxRows * kAmxRows;
    const long panels = (outputs + kPanel - 1) / kPanel;
    const long lo_panels = lo == nullptr ? 0 : lo - hi;
    threads = threads_worth((lo == nullptr ? 2 : 3) * tiled * outputs * inputs / 16, threads);
    const long block = amx_block_rows(inputs * (long)sizeof(bf16));
    if (tiled >= threads * block) {
        // Rows enough for whole blocks on every thread: each thread splits a block of its own
        // rows into a buffer of its own (its hi tiles, then its lo), which stays in L2, and runs
        // every panel over it, instead of all rows split first and the panels shared out
        // (all-MiniLM's forward over 16 passages 210-212 -> 176-183 ms, over 352 short texts
        // 427-430 -> 351-354). The buffers come from the caller's heap, which keeps freed
        // memory: allocated by each thread in each call, they faulted their pages in.
        std::unique_ptr<bf16[]> buffers(new bf16[threads * 2 * block * inputs]);
        parallel_numbered_ranges(tiled, threads, 2 * kAmxRows, [&](int t, long begin, long end) {
            bf16* split = buffers.get() + t * 2 * block * inputs;
            for (long r0 = begin; r0 < end; r0 += block) {
                const long rows = end - r0 < block ? end - r0 : block, real = n - r0 < rows ? n - r0 : rows;
                split_to_tiles(x + r0 * inputs, real, split, split + rows * inputs, 0, rows, inputs);
                const Bf16x3Tiles tiles{{}, rows * inputs, lo_panels};
                amx_panels(tiles, split, rows, real, hi, inputs, out + r0 * outputs, outputs, outputs, 0, panels, bias,
                           activation);
            }
        });
        return;
    }
    std::unique_ptr<bf16[]> xt(new bf16[2 * tiled * inputs]);  // the rows' hi tiles, then their lo tiles
    parallel_ranges(tiled, threads_worth(tiled * inputs, threads), 1, [&](long begin, long end) {
        split_to_tiles(x, n, xt.get(), xt.get() + tiled * inputs, begin, end, inputs);
    });
    const Bf16x3Tiles tiles{{}, tiled * inputs, lo_panels};
    parallel_ranges(panels, threads, 1, [&](long begin, long end) {
        amx_panels(tiles, xt.get(), tiled, n, hi, inputs, out, outputs, outputs, begin, end, bias, activation);
    });
}
#else
static void bf16_gemm(const float*, long, const Weight&, long, float*, long, int, const float* = nullptr,
                      long = kNoActivation) {}
static void bf16x3_gemm(const float*, long, const bf16*, const bf16*, long, float*, long, int,
                        const float* = nullptr, long = kNoActivation) {}
#endif

}  // namespace prelude_cpu
