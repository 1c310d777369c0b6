// Rows times an int8 weight in int8 arithmetic on AVX2 CPUs without AVX-512 VNNI (AMD Zen 2 and
// 3, Intel before Ice Lake; Zen 4 has VNNI): each row quantized as vnni_gemm.hpp quantizes it
// (per row, max |x| / 127), and `vpmaddubsw` multiplies u8 by s8 pairs into int16, `vpmaddwd` by
// ones sums the pairs into int32. vpmaddubsw takes one operand unsigned and saturates its int16
// sums, so a row goes in as |q| and the weight's sign is flipped where q is negative (`vpsignb`):
// two products of at most 127 x 127 never saturate, and the int32 sums are exactly VNNI's (the same
// outputs). Four instructions per 32 multiply-adds where fp32 FMAs take four per 32 too, but no
// weight is widened: on this VM's AVX2 code a 4 x 16 tile ran 81 GMAC/s against the fp32 tile's
// 61, one thread, in cache.
//
// The panels are pack_weight's int8 panels (a 64-byte group holds outputs 0-7's four consecutive
// k, then outputs 8-15's: a 256-bit vector each); rows go in blocks and K in slices as in
// vnni_gemm.hpp, a tile up to 3 or 4 rows by one panel.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "packed_gemm.hpp"
#include "team.hpp"
#include "vnni_gemm.hpp"
#include "weights.hpp"

namespace prelude_cpu {

// Rows of a tile: four while a decode step's few rows stream the panels; three in the blocked
// tiles, where GCC kept four rows' eight accumulators only by spilling half of them to the stack
// each step (B's 3072 x 512 at 2,048 rows, one thread: 67 ms with four, 54 with three).
constexpr long kMaddubsStreamRows = 4;
constexpr long kMaddubsRows = 3;
// Up to this many rows stream whole panels, four rows a tile, rather than go in K slices: a
// panel (16 outputs by the inputs) stays in L1 while the rows' tiles pass, where the slices'
// partial sums re-read the output, which an LM head's 152K columns make costly (B's head, 8 rows:
// 9.3 ms sliced, 5.5 streamed; 16 rows 14.4 and 10.8; its layers' products within 5% either way).
constexpr long kMaddubsStreamUpTo = 16;
// An LM head (this many outputs or more) streams up to kMaddubsHeadStreamUpTo rows: its partial
// sums are megabytes, re-read by every slice (B's head 17 rows 13.5 ms sliced, 10.8 streamed; 24
// rows 17.4 and 16.6; 32 rows 22.2 and 21.5), where a layer's fit in L2 and its products took
// 1.04-1.12x as long streamed at 17-48 rows.
constexpr long kMaddubsHeadOutputs = 32768;
constexpr long kMaddubsHeadStreamUpTo = 32;

// AVX2 (and FMA: the kernels' AVX2 variants' pair), no VNNI, and int8 products not turned off.
static inline bool has_avx2_int8_products() {
    static const bool has = has_avx2_fma() && !has_avx512_vnni() && int8_products_wanted();
    return has;
}

#if defined(__x86_64__) && defined(__GNUC__)
#define PRELUDE_MADDUBS __attribute__((target("avx2,fma")))

// Rows [begin, end) of x [*, inputs] quantized into xq, their magnitudes into xa, and their scales.
PRELUDE_MADDUBS static void quantize_signed_rows(const float* x, long inputs, long begin, long end, int8_t* xq,
                                                 uint8_t* xa, float* scales) {
    for (long r = begin; r < end; ++r) {
        const float* row = x + r * inputs;
        scales[r] = row_scale(row, inputs);
        int8_t* q = xq + r * inputs;
        quantize_row(row, inputs, 1.0f / scales[r], q);
        for (long k = 0; k < inputs; ++k) xa[r * inputs + k] = (uint8_t)(q[k] < 0 ? -q[k] : q[k]);
    }
}

// R rows against one panel's slice [k0, k1), into out (`cols` valid columns), set or added.
template <int R, bool kStream>
PRELUDE_MADDUBS __attribute__((always_inline)) static inline void maddubs_tile(
    const int8_t* xq, const uint8_t* xa, const float* row_scales, long inputs, const int8_t* panel,
    const float* scale, long k0, long k1, bool accumulate, float* out, long outputs, long cols) {
    __m256i lo[R], hi[R];
    for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_si256();
    const __m256i ones = _mm256_set1_epi16(1);
    for (long k = k0; k < k1; k += 4) {
        if constexpr (kStream) __builtin_prefetch(panel + k * kPanel + kPrefetchAheadBytes, 0, 1);
        const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + k * kPanel));
        const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + k * kPanel + 32));
        for (int r = 0; r < R; ++r) {
            int32_t four, size;
            std::memcpy(&four, xq + r * inputs + k, sizeof(four));
            std::memcpy(&size, xa + r * inputs + k, sizeof(size));
            const __m256i sign = _mm256_set1_epi32(four), magnitude = _mm256_set1_epi32(size);
            const __m256i pairs0 = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(w0, sign));
            const __m256i pairs1 = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(w1, sign));
            lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(pairs0, ones));
            hi[r] = _mm256_add_epi32(hi[r], _mm256_madd_epi16(pairs1, ones));
        }
    }
    const __m256 s0 = _mm256_loadu_ps(scale), s1 = _mm256_loadu_ps(scale + 8);
    for (int r = 0; r < R; ++r) {
        const __m256 row_scale = _mm256_set1_ps(row_scales[r]);
        __m256 v0 = _mm256_mul_ps(_mm256_cvtepi32_ps(lo[r]), _mm256_mul_ps(s0, row_scale));
        __m256 v1 = _mm256_mul_ps(_mm256_cvtepi32_ps(hi[r]), _mm256_mul_ps(s1, row_scale));
        float* o = out + r * outputs;
        if (cols == kPanel) {
            if (accumulate) {
                v0 = _mm256_add_ps(v0, _mm256_loadu_ps(o));
                v1 = _mm256_add_ps(v1, _mm256_loadu_ps(o + 8));
            }
            _mm256_storeu_ps(o, v0);
            _mm256_storeu_ps(o + 8, v1);
        } else {
            alignas(32) float lanes[kPanel];
            _mm256_store_ps(lanes, v0);
            _mm256_store_ps(lanes + 8, v1);
            for (long j = 0; j < cols; ++j) o[j] = (accumulate ? o[j] : 0.0f) + lanes[j];
        }
    }
}

// A tile of `rows` (at most kMaddubsStreamRows) rows: maddubs_tile's other arguments. Streaming
// is a template argument, not a flag, so that the blocked tiles' k loop tests nothing but k (on a
// Zen 3, 128 to 2,048 rows 4-6% faster than with the flag tested every four k).
template <bool kStream>
PRELUDE_MADDUBS __attribute__((always_inline)) static inline void maddubs_rows(
    long rows, const int8_t* q, const uint8_t* a, const float* s, long inputs, const int8_t* panel,
    const float* scale, long k0, long k1, bool later, float* o, long outputs, long cols) {
    switch (rows) {
        case 4: maddubs_tile<4, kStream>(q, a, s, inputs, panel, scale, k0, k1, later, o, outputs, cols); break;
        case 3: maddubs_tile<3, kStream>(q, a, s, inputs, panel, scale, k0, k1, later, o, outputs, cols); break;
        case 2: maddubs_tile<2, kStream>(q, a, s, inputs, panel, scale, k0, k1, later, o, outputs, cols); break;
        default: maddubs_tile<1, kStream>(q, a, s, inputs, panel, scale, k0, k1, later, o, outputs, cols); break;
    }
}

PRELUDE_MADDUBS static void maddubs_panels(const int8_t* xq, const uint8_t* xa, const float* row_scales, long n,
                                           const int8_t* packed, const float* scales, long inputs, float* out,
                                           long outputs, long p_begin, long p_end) {
    // As vnni_panels: few rows read each panel once, whole; more go in K slices kept in L1.
    const bool stream = n <= kMaddubsStreamUpTo || (n <= kMaddubsHeadStreamUpTo && outputs >= kMaddubsHeadOutputs);
    const long slice = stream ? inputs : kSliceK, step = stream ? kMaddubsStreamRows : kMaddubsRows;
    for (long r0 = 0; r0 < n; r0 += kBlockRows) {
        const long r1 = r0 + kBlockRows < n ? r0 + kBlockRows : n;
        for (long k0 = 0; k0 < inputs; k0 += slice) {
            const long k1 = k0 + slice < inputs ? k0 + slice : inputs;
            for (long p = p_begin; p < p_end; ++p) {
                const int8_t* panel = packed + p * inputs * kPanel;
                const long col = p * kPanel, cols = outputs - col < kPanel ? outputs - col : kPanel;
                for (long i = r0; i < r1; i += step) {
                    const int8_t* q = xq + i * inputs;
                    const uint8_t* a = xa + i * inputs;
                    const float* s = row_scales + i;
                    float* o = out + i * outputs + col;
                    const bool later = k0 != 0;
                    const long rows = r1 - i < step ? r1 - i : step;
                    if (stream) maddubs_rows<true>(rows, q, a, s, inputs, panel, scales + col, k0, k1, later, o, outputs, cols);
                    else maddubs_rows<false>(rows, q, a, s, inputs, panel, scales + col, k0, k1, later, o, outputs, cols);
                }
            }
        }
    }
}
#undef PRELUDE_MADDUBS

// out[n, outputs] = x . w^T for an int8 panel weight (pack_weight's, with its scales), on the
// thread team: rows quantized in ranges, then panels in ranges.
static void maddubs_gemm(const float* x, long n, const Weight& w, long inputs, float* out, long outputs,
                         int threads) {
    std::unique_ptr<int8_t[]> xq(new int8_t[n * inputs]);
    std::unique_ptr<uint8_t[]> xa(new uint8_t[n * inputs]);
    std::unique_ptr<float[]> row_scales(new float[n]);
    parallel_ranges(n, threads_worth(n * inputs, threads), 1, [&](long begin, long end) {
        quantize_signed_rows(x, inputs, begin, end, xq.get(), xa.get(), row_scales.get());
    });
    const long panels = (outputs + kPanel - 1) / kPanel;
    parallel_ranges(panels, threads_worth(n * outputs * inputs / 32, threads), 1, [&](long begin, long end) {
        maddubs_panels(xq.get(), xa.get(), row_scales.get(), n, static_cast<const int8_t*>(w.data), w.scales, inputs,
                       out, outputs, begin, end);
    });
}
#else
static void maddubs_gemm(const float*, long, const Weight&, long, float*, long, int) {}
#endif

}  // namespace prelude_cpu
