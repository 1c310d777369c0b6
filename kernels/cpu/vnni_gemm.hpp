// Rows times an int8 weight in int8 arithmetic, on CPUs with AVX-512 VNNI: each row of x is
// quantized on the fly to int8 with its own scale (max |x| / 127, the dynamic per-token scheme
// of W8A8 serving), and `vpdpbusd` adds four u8 x s8 products per int32 lane, 64 multiply-adds
// an instruction where an fp32 FMA does 8. A prompt's rows ran 2-3.5x faster than on the fp32
// tiles of packed_gemm.hpp, and a decode step's few rows 3-4x faster than its widening stream
// while the weights were in cache (checkpoint B's layer shapes, one thread).
//
// vpdpbusd takes one operand unsigned, so a row is stored as q + 128 and the product corrected
// by 128 times the output's weight sum, which pack_weight keeps beside the scales. The panel
// layout is packed_gemm.hpp's for int8: output j's four consecutive k in lane j of a 64-byte
// group, what vpdpbusd reads. Rows go in blocks and K in slices as in packed_gemm.hpp; a tile is
// up to 8 rows by one panel, an int32 accumulator each, converted and scaled once per slice.
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

constexpr long kVnniRows = 8;

// PRELUDE_CPU_INT8_PRODUCTS=0 asks for int8 weights alone (widened, computed in fp32: weight-only
// int8's accuracy at fp32's compute speed), whatever int8 products the CPU has.
static inline bool int8_products_wanted() {
    const char* set = std::getenv("PRELUDE_CPU_INT8_PRODUCTS");
    return set == nullptr || std::string(set) != "0";
}

// The CPU has AVX-512 VNNI, and int8 products are wanted.
static inline bool has_avx512_vnni() {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    static const bool has = has_avx512f() && __builtin_cpu_supports("avx512bw") &&
                            __builtin_cpu_supports("avx512vnni") && int8_products_wanted();
    return has;
#else
    return false;
#endif
}

#if defined(__x86_64__) && defined(__GNUC__)
#define PRELUDE_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))

// Rows [begin, end) of x [*, inputs] as q + 128 into xq, and their scales.
PRELUDE_VNNI static void quantize_rows(const float* x, long inputs, long begin, long end, uint8_t* xq, float* scales) {
    for (long r = begin; r < end; ++r) {
        const float* row = x + r * inputs;
        const float scale = row_scale(row, inputs);
        scales[r] = scale;
        quantize_row(row, inputs, 1.0f / scale, reinterpret_cast<int8_t*>(xq + r * inputs), 128);
    }
}

// R rows of xq times one panel's slice [k0, k1), into out (`cols` valid columns), set or added.
template <int R>
PRELUDE_VNNI __attribute__((always_inline)) static inline void vnni_tile(const uint8_t* xq, const float* row_scales,
                                                                         long inputs, const int8_t* panel,
                                                                         const float* scale, const int32_t* sums,
                                                                         long k0, long k1, bool accumulate, float* out,
                                                                         long outputs, long cols, bool stream) {
    __m512i acc[R];
    const __m512i start = k0 == 0 ? _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_loadu_si512(sums))
                                  : _mm512_setzero_si512();
    for (int r = 0; r < R; ++r) acc[r] = start;
    for (long k = k0; k < k1; k += 4) {
        // Streaming a large weight for few rows: a line 8 KB ahead into L2 per 64-byte group.
        if (stream) __builtin_prefetch(panel + k * kPanel + kPrefetchAheadBytes, 0, 1);
        const __m512i w = _mm512_loadu_si512(panel + k * kPanel);
        for (int r = 0; r < R; ++r) {
            int32_t four;
            std::memcpy(&four, xq + r * inputs + k, sizeof(four));
            acc[r] = _mm512_dpbusd_epi32(acc[r], _mm512_set1_epi32(four), w);
        }
    }
    const __m512 weight_scales = _mm512_loadu_ps(scale);
    const __mmask16 valid = (__mmask16)((1u << cols) - 1);
    for (int r = 0; r < R; ++r) {
        __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[r]), _mm512_mul_ps(weight_scales, _mm512_set1_ps(row_scales[r])));
        float* o = out + r * outputs;
        if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(valid, o));
        _mm512_mask_storeu_ps(o, valid, v);
    }
}

PRELUDE_VNNI static void vnni_panels(const uint8_t* xq, const float* row_scales, long n, const int8_t* packed,
                                     const float* scales, long inputs, float* out, long outputs, long p_begin,
                                     long p_end) {
    const int32_t* sums = reinterpret_cast<const int32_t*>(scales + panel_outputs(outputs));
    // Rows for one tile read each panel once, whole, in order (bound by memory); more rows go in
    // K slices, so that a panel's slice stays in L1 while their tiles pass over it.
    const bool stream = n <= kVnniRows;
    const long slice = stream ? inputs : kSliceK;
    for (long r0 = 0; r0 < n; r0 += kBlockRows) {
        const long r1 = r0 + kBlockRows < n ? r0 + kBlockRows : n;
        for (long k0 = 0; k0 < inputs; k0 += slice) {
            const long k1 = k0 + slice < inputs ? k0 + slice : inputs;
            for (long p = p_begin; p < p_end; ++p) {
                const int8_t* panel = packed + p * inputs * kPanel;
                const long col = p * kPanel, cols = outputs - col < kPanel ? outputs - col : kPanel;
                for (long i = r0; i < r1; i += kVnniRows) {
                    const uint8_t* x = xq + i * inputs;
                    const float* s = row_scales + i;
                    float* o = out + i * outputs + col;
                    const bool later = k0 != 0;
                    switch (r1 - i < kVnniRows ? r1 - i : kVnniRows) {
                        case 8: vnni_tile<8>(x, s, inputs, panel, scales + col, sums + col, k0, k1, later, o, outputs, cols, stream); break;
                        case 7: vnni_tile<7>(x, s, inputs, panel, scales + col, sums + col, k0, k1, later, o, outputs, cols, stream); break;
                        case 6: vnni_tile<6>(x, s, inputs, panel, scales + col, sums + col, k0, k1, later, o, outputs, cols, stream); break;
                        case 5: vnni_tile<5>(x, s, inputs, panel, scales + col, sums + col, k0, k1, later, o, outputs, cols, stream); break;
                        case 4: vnni_tile<4>(x, s, inputs, panel, scales + col, sums + col, k0, k1, later, o, outputs, cols, stream); break;
                        case 3: vnni_tile<3>(x, s, inputs, panel, scales + col, sums + col, k0, k1, later, o, outputs, cols, stream); break;
                        case 2: vnni_tile<2>(x, s, inputs, panel, scales + col, sums + col, k0, k1, later, o, outputs, cols, stream); break;
                        default: vnni_tile<1>(x, s, inputs, panel, scales + col, sums + col, k0, k1, later, o, outputs, cols, stream); break;
                    }
                }
            }
        }
    }
}
// Rows [begin, end) of x as quantize_rows quantizes them (the same scale and rounding, 16 at a
// time), into xt in AMX's tiles' order (amx_gemm.hpp's tile_at). One at a time, they took most
// of a product's time on the tiles.
PRELUDE_VNNI static void quantize_to_tiles(const float* x, long inputs, long begin, long end, uint8_t* xt,
                                           float* scales) {
    const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
    for (long r = begin; r < end; ++r) {
        const float* row = x + r * inputs;
        __m512 most = _mm512_setzero_ps();
        for (long k = 0; k < inputs; k += 16)
            most = _mm512_max_ps(most, _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(_mm512_loadu_ps(row + k)),
                                                                           magnitude)));
        const float largest = _mm512_reduce_max_ps(most);
        const float scale = largest > 0.0f ? largest / 127.0f : 1.0f;
        const __m512 inverse = _mm512_set1_ps(1.0f / scale);
        scales[r] = scale;
        for (long k = 0; k < inputs; k += 16) {
            __m512 q = _mm512_mul_ps(_mm512_loadu_ps(row + k), inverse);
            q = _mm512_min_ps(_mm512_set1_ps(127.0f), _mm512_max_ps(_mm512_set1_ps(-127.0f), q));
            const __m512i sign = _mm512_andnot_si512(magnitude, _mm512_castps_si512(q));
            const __m512 half = _mm512_castsi512_ps(_mm512_or_si512(sign, _mm512_castps_si512(_mm512_set1_ps(0.5f))));
            const __m512i shifted = _mm512_add_epi32(_mm512_cvttps_epi32(_mm512_add_ps(q, half)), _mm512_set1_epi32(128));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(xt + tile_at<kAmxK8>(r, k, inputs)),
                             _mm512_cvtepi32_epi8(shifted));
        }
    }
}
#undef PRELUDE_VNNI

// out[n, outputs] = x . w^T for an int8 panel weight (pack_weight's, with its scales and sums),
// on the thread team: rows quantized in ranges, then panels in ranges; whole tiles of rows on
// AMX where the CPU has it (the same int32 sums: the same results), the rest on VNNI.
static void vnni_gemm(const float* x, long n, const Weight& w, long inputs, float* out, long outputs, int threads) {
    const long tiled = has_amx() && inputs % kAmxK8 == 0 ? n - n % kAmxRows : 0;
    const long rest = n - tiled;
    std::unique_ptr<uint8_t[]> xq(new uint8_t[n * inputs]);
    std::unique_ptr<float[]> row_scales(new float[n]);
    parallel_ranges(n, threads_worth(n * inputs, threads), 1, [&](long begin, long end) {
        if (begin < tiled) quantize_to_tiles(x, inputs, begin, end < tiled ? end : tiled, xq.get(), row_scales.get());
        if (end > tiled) quantize_rows(x, inputs, begin > tiled ? begin : tiled, end, xq.get(), row_scales.get());
    });
    const long panels = (outputs + kPanel - 1) / kPanel;
    const int8_t* packed = static_cast<const int8_t*>(w.data);
    const Int8Tiles tiles{reinterpret_cast<const int32_t*>(w.scales + panel_outputs(outputs)), w.scales,
                          row_scales.get()};
    parallel_ranges(panels, threads_worth(n * outputs * inputs / 32, threads), 1, [&](long begin, long end) {
        if (tiled) amx_panels(tiles, xq.get(), tiled, tiled, packed, inputs, out, outputs, outputs, begin, end, nullptr,
                              kNoActivation);
        if (rest)
            vnni_panels(xq.get() + tiled * inputs, row_scales.get() + tiled, rest, packed, w.scales, inputs,
                        out + tiled * outputs, outputs, begin, end);
    });
}
#else
static void vnni_gemm(const float*, long, const Weight&, long, float*, long, int) {}
#endif

}  // namespace prelude_cpu
