// A linear layer's product on the CPU, out[n, outputs] = x[n, inputs] . w^T, in fp32 from a weight
// stored in fp32, bf16, int8 or bf16x3 (weights.hpp), on the kernel of the weight's layout:
// packed panels (the decoder layers' weights: a few rows stream them, more go through register
// tiles; int8 ones in int8 arithmetic where the CPU has VNNI or AVX2, bf16 ones in bf16 where it has
// AVX-512 BF16, whole 16-row tiles of either, and of bf16x3, on AMX where it has that) or rows
// (an LM head tied to its embedding, which needs the rows for its lookups; many rows of a bf16
// one go to AMX's tiles too, head_tiles.hpp).
#pragma once
#include "bf16_gemm.hpp"
#include "head_tiles.hpp"
#include "maddubs_gemm.hpp"
#include "packed_gemm.hpp"
#include "skinny_gemm.hpp"
#include "vnni_gemm.hpp"
#include "weights.hpp"

namespace prelude_cpu {

// An int8 panel weight multiplies in int8 (each row quantized per token) where the CPU has VNNI
// or AVX2 and PRELUDE_CPU_INT8_PRODUCTS=0 does not turn it off; elsewhere it is widened.
static inline bool has_int8_products() { return has_avx512_vnni() || has_avx2_int8_products(); }

// A bf16x3 weight with fewer rows than this streams its panels (bf16x3_stream) instead of going
// to AMX's tiles, which pad a step's rows to 16 (B's layers at one to four rows: 1.25-1.46x fp32's
// time on the tiles; from eight rows on the tiles are faster). So does a bf16x2 weight without
// AMX on AVX-512, where packed_gemm's widened bf16 panels took about twice as long at one to
// four rows (B's 512 x 1536 at one row 37 -> 18 us, PRELUDE_CPU_AMX=0).
constexpr long kBf16x3TileFrom = 8;

#if defined(__x86_64__) && defined(__GNUC__)
// Up to four rows against one panel of a bf16x3 weight: each k pair's hi and lo lines widened and
// added back into the fp32 weight they split (to within 2^-16 of it), sixteen outputs a vector,
// then multiplied in fp32, so a decode step reads fp32's bytes once, in two streams (a bf16x2
// weight's one: kRest false). A 32-bit lane of a bf16 panel's line holds one output's (k, k + 1)
// pair: shifted up, k's weight; masked, k + 1's.
template <int R, bool kRest>
__attribute__((target("avx512f"))) static void bf16x3_panel_rows(const float* x, long inputs, const bf16* hi,
                                                              const bf16* lo, float* out, long outputs, long cols) {
    typedef int32_t v16i __attribute__((vector_size(64)));
    // Four sums a row (k's and k + 1's of two pairs in turn; inputs % 32 == 0), so that the
    // products do not wait on one another's adds.
    v16f sums[R][4];
    for (int r = 0; r < R; ++r) sums[r][0] = sums[r][1] = sums[r][2] = sums[r][3] = v16f{};
    const v16i mask = v16i{} - 65536;
    for (long k = 0; k < inputs; k += 4) {
        __builtin_prefetch((const char*)(hi + k * kPanel) + kPrefetchAheadBytes, 0, 1);
        __builtin_prefetch((const char*)(hi + k * kPanel) + kPrefetchAheadBytes + 64, 0, 1);
        if (kRest) {
            __builtin_prefetch((const char*)(lo + k * kPanel) + kPrefetchAheadBytes, 0, 1);
            __builtin_prefetch((const char*)(lo + k * kPanel) + kPrefetchAheadBytes + 64, 0, 1);
        }
        v16f w[4];  // k, k + 1, k + 2, k + 3
        for (int pair = 0; pair < 2; ++pair) {
            v16i h;
            std::memcpy(&h, hi + (k + 2 * pair) * kPanel, sizeof(h));
            w[2 * pair] = (v16f)(h << 16);  // the casts reinterpret the bits
            w[2 * pair + 1] = (v16f)(h & mask);
            if (kRest) {
                v16i l;
                std::memcpy(&l, lo + (k + 2 * pair) * kPanel, sizeof(l));
                w[2 * pair] += (v16f)(l << 16);
                w[2 * pair + 1] += (v16f)(l & mask);
            }
        }
        for (int r = 0; r < R; ++r)
            for (int j = 0; j < 4; ++j) sums[r][j] += (v16f)_mm512_set1_ps(x[r * inputs + k + j]) * w[j];
    }
    for (int r = 0; r < R; ++r) sums[r][0] += sums[r][1] + (sums[r][2] + sums[r][3]);
    for (int r = 0; r < R; ++r) {
        if (cols == kPanel) std::memcpy(out + r * outputs, &sums[r][0], sizeof(sums[r][0]));
        else for (long j = 0; j < cols; ++j) out[r * outputs + j] = sums[r][0][j];
    }
}

// The next (up to) four of `left` rows against one panel.
template <bool kRest>
static inline void bf16x3_rows(long left, const float* x, long inputs, const bf16* hi, const bf16* lo, float* out,
                               long outputs, long cols) {
    switch (left < 4 ? left : 4) {
        case 4: bf16x3_panel_rows<4, kRest>(x, inputs, hi, lo, out, outputs, cols); break;
        case 3: bf16x3_panel_rows<3, kRest>(x, inputs, hi, lo, out, outputs, cols); break;
        case 2: bf16x3_panel_rows<2, kRest>(x, inputs, hi, lo, out, outputs, cols); break;
        default: bf16x3_panel_rows<1, kRest>(x, inputs, hi, lo, out, outputs, cols); break;
    }
}

static void bf16x3_stream(const float* x, long n, const bf16* hi, const bf16* lo, long inputs, float* out,
                          long outputs, int threads) {
    const long panels = (outputs + kPanel - 1) / kPanel;
    parallel_ranges(panels, threads_worth(panels * kPanel * inputs, threads), 1, [&](long begin, long end) {
        for (long p = begin; p < end; ++p) {
            const long at = p * inputs * kPanel, col = p * kPanel;
            const long cols = outputs - col < kPanel ? outputs - col : kPanel;
            for (long i = 0; i < n; i += 4) {
                const float* xi = x + i * inputs;
                float* o = out + i * outputs + col;
                if (lo != nullptr) bf16x3_rows<true>(n - i, xi, inputs, hi + at, lo + at, o, outputs, cols);
                else bf16x3_rows<false>(n - i, xi, inputs, hi + at, nullptr, o, outputs, cols);
            }
        }
    });
}
#else
static void bf16x3_stream(const float*, long, const bf16*, const bf16*, long, float*, long, int) {}
#endif

// An fp32 weight kept as bf16x3 (amx_gemm.hpp; only on a CPU with AMX): the bf16 panels of its
// rounding at w.data, those of the rest right after (none for bf16x2). Many rows go to the tiles
// (three bf16 products per product, two for bf16x2, within 2^-16 of fp32's), a few stream the
// panels (AVX-512 alone: a bf16x2 weight's few rows come here without AMX too).
static void bf16x3_linear(const float* x, long n, const Weight& w, long inputs, float* out, long outputs,
                          int threads, const float* bias, long activation) {
    const bf16* hi = static_cast<const bf16*>(w.data);
    const bf16* lo = w.format == kBF16x3 ? hi + packed_elements(outputs, inputs) : nullptr;
    if (n >= kBf16x3TileFrom) {
        bf16x3_gemm(x, n, hi, lo, inputs, out, outputs, threads, bias, activation);
        return;
    }
    bf16x3_stream(x, n, hi, lo, inputs, out, outputs, threads);
    finish_block(out, n, outputs, 0, outputs, bias, activation);
}

// inputs must be a multiple of 8. `bias` (or null) and `activation`: packed_gemm.hpp's epilogue,
// in the panel kernels' blocks; the by-rows and int8-product kernels apply it after the product.
static void linear_rows(const float* x, long n, const Weight& w, long inputs, float* out, long outputs, int threads,
                        const float* bias = nullptr, long activation = kNoActivation) {
    const bool bf16x2_tiles = w.format == kBF16x2 && has_amx() && inputs % kAmxK == 0;
    const bool bf16x2_stream = w.format == kBF16x2 && n < kBf16x3TileFrom && has_avx512f();
    if (w.format == kBF16x3 || bf16x2_tiles || bf16x2_stream) {
        bf16x3_linear(x, n, w, inputs, out, outputs, threads, bias, activation);
    } else if (w.format == kBF16x2) {  // no tiles for it: its bf16 panels widened into fp32 products
        packed_gemm(x, n, Weight{w.data, nullptr, kBF16, kPanels}, inputs, out, outputs, threads, bias, activation);
    } else if (w.layout == kByRows && w.format == kBF16 && n >= kRowsOnTilesFrom && has_amx() && inputs % kAmxK == 0) {
        bf16_rows_on_tiles(x, n, static_cast<const bf16*>(w.data), inputs, out, outputs, threads);
        finish_block(out, n, outputs, 0, outputs, bias, activation);
    } else if (w.layout == kByRows || (w.format == kI8 && has_int8_products())) {
        if (w.layout == kByRows) skinny_gemm(x, n, w, inputs, out, outputs, threads);
        else if (has_avx512_vnni()) vnni_gemm(x, n, w, inputs, out, outputs, threads);
        else maddubs_gemm(x, n, w, inputs, out, outputs, threads);
        finish_block(out, n, outputs, 0, outputs, bias, activation);
    } else if (w.format == kBF16 && has_avx512_bf16()) {
        bf16_gemm(x, n, w, inputs, out, outputs, threads, bias, activation);
    } else {
        packed_gemm(x, n, w, inputs, out, outputs, threads, bias, activation);
    }
}

// Rows `ids` of a weight (fp32, bf16 or int8) in fp32 out [n, inputs], in either layout: an
// embedding's lookups, or an LM head's label rows.
static void weight_rows(const Weight& w, long inputs, const int64_t* ids, long n, float* out) {
    if (w.layout == kPanels) gather_panel_rows(w, inputs, ids, n, out);
    else gather_rows(w, inputs, ids, n, out);
}

}  // namespace prelude_cpu
