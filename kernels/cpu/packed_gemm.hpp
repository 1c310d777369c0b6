// out[n, N] = x[n, K] . w[N, K]^T for a prompt's many rows, where the product is compute-bound.
// The weight is packed once into panels of 16 outputs (panel p holds, for each k, outputs
// 16p..16p+15 contiguous), and a tile of up to 6 rows by one panel accumulates an outer product
// per k in twelve registers: two panel loads and six broadcasts of x feed twelve FMAs, and no
// horizontal sum is left at the end. skinny_gemm's dot-product tile (four weight rows by two x
// rows, made for few rows) falls well short of oneDNN on its own packed copy at many rows.
//
// Rows go in blocks of kBlockRows and K in slices of kSliceK: a slice of a panel (16 KB) stays
// in L1 while every row tile of the block passes over it, and the block's slice of x stays in L2
// while the thread's panels pass; without the row blocks, many rows re-read x from L3 for every
// panel. The next panel's slice is prefetched while the tiles compute, as a larger model's weights
// come from memory. A thread's outputs are a range of whole panels.
#pragma once
#include "simd.hpp"
#include "team.hpp"

namespace prelude_cpu {

constexpr long kPanel = 16;      // outputs per packed panel
constexpr long kTileRows = 6;    // rows of x per register tile (packed_panels_body names 1-6)
constexpr long kSliceK = 256;    // inputs per slice of a panel
constexpr long kBlockRows = 192;  // rows of x whose slice (192 KB) stays in L2 while the panels pass

static inline long packed_floats(long outputs, long inputs) {
    return (outputs + kPanel - 1) / kPanel * kPanel * inputs;
}

// w [outputs, inputs] into [panels, inputs, 16]; the last panel's missing outputs are zero.
static void pack_weight(const float* w, long outputs, long inputs, float* packed) {
    const long panels = (outputs + kPanel - 1) / kPanel;
    for (long p = 0; p < panels; ++p)
        for (long j = 0; j < kPanel; ++j) {
            const long o = p * kPanel + j;
            float* dst = packed + p * inputs * kPanel + j;
            for (long k = 0; k < inputs; ++k) dst[k * kPanel] = o < outputs ? w[o * inputs + k] : 0.0f;
        }
}

// R rows of x (stride `inputs`) times one panel's slice [k0, k1): out (stride `outputs`, `cols`
// valid columns) is set on the first slice and accumulated on the others.
template <int R>
__attribute__((always_inline)) static inline void panel_tile(const float* x, long inputs, const float* panel, long k0,
                                                             long k1, float* out, long outputs, long cols) {
    v8f lo[R], hi[R];
    for (int r = 0; r < R; ++r) lo[r] = hi[r] = v8f{};
    for (long k = k0; k < k1; ++k) {
        const v8f b0 = load8(panel + k * kPanel), b1 = load8(panel + k * kPanel + 8);
        for (int r = 0; r < R; ++r) {
            const v8f s = splat(x[r * inputs + k]);
            lo[r] += s * b0;
            hi[r] += s * b1;
        }
    }
    for (int r = 0; r < R; ++r) {
        float* o = out + r * outputs;
        if (cols == kPanel) {
            if (k0 != 0) { lo[r] += load8(o); hi[r] += load8(o + 8); }
            store8(o, lo[r]);
            store8(o + 8, hi[r]);
        } else {
            for (long j = 0; j < cols; ++j) o[j] = (k0 != 0 ? o[j] : 0.0f) + (j < 8 ? lo[r][j] : hi[r][j - 8]);
        }
    }
}

__attribute__((always_inline)) static inline void packed_panels_body(const float* x, long n, const float* packed,
                                                                     long inputs, float* out, long outputs,
                                                                     long p_begin, long p_end) {
    for (long r0 = 0; r0 < n; r0 += kBlockRows) {
        const long r1 = r0 + kBlockRows < n ? r0 + kBlockRows : n;
        const long tiles = (r1 - r0 + kTileRows - 1) / kTileRows;
        for (long k0 = 0; k0 < inputs; k0 += kSliceK) {
            const long k1 = k0 + kSliceK < inputs ? k0 + kSliceK : inputs;
            // The next panel's slice (a cache line per k) is fetched a share per tile, so that it
            // is on its way from memory while this one's tiles compute.
            const long lines_per_tile = (k1 - k0 + tiles - 1) / tiles;
            for (long p = p_begin; p < p_end; ++p) {
                const float* panel = packed + p * inputs * kPanel;
                const float* next = p + 1 < p_end ? panel + inputs * kPanel + k0 * kPanel : nullptr;
                const long col = p * kPanel, cols = outputs - col < kPanel ? outputs - col : kPanel;
                long line = 0;
                for (long i = r0; i < r1; i += kTileRows) {
                    if (next != nullptr)
                        for (const long end = line + lines_per_tile < k1 - k0 ? line + lines_per_tile : k1 - k0;
                             line < end; ++line)
                            __builtin_prefetch(next + line * kPanel);
                    const float* xi = x + i * inputs;
                    float* o = out + i * outputs + col;
                    switch (r1 - i < kTileRows ? r1 - i : kTileRows) {
                        case 6: panel_tile<6>(xi, inputs, panel, k0, k1, o, outputs, cols); break;
                        case 5: panel_tile<5>(xi, inputs, panel, k0, k1, o, outputs, cols); break;
                        case 4: panel_tile<4>(xi, inputs, panel, k0, k1, o, outputs, cols); break;
                        case 3: panel_tile<3>(xi, inputs, panel, k0, k1, o, outputs, cols); break;
                        case 2: panel_tile<2>(xi, inputs, panel, k0, k1, o, outputs, cols); break;
                        default: panel_tile<1>(xi, inputs, panel, k0, k1, o, outputs, cols); break;
                    }
                }
            }
        }
    }
}

PRELUDE_CPU_VARIANTS(packed_panels,
                     (const float* x, long n, const float* packed, long inputs, float* out, long outputs, long p_begin,
                      long p_end),
                     (x, n, packed, inputs, out, outputs, p_begin, p_end))

// `packed`: pack_weight's layout of a [outputs, inputs] weight. The panels are split across
// `threads` of the team.
static void packed_gemm(const float* x, long n, const float* packed, long inputs, float* out, long outputs,
                        int threads) {
    const long panels = (outputs + kPanel - 1) / kPanel;
    parallel_ranges(panels, threads_worth(n * outputs * inputs / 8, threads), 1,
                    [&](long begin, long end) { run_packed_panels(x, n, packed, inputs, out, outputs, begin, end); });
}

}  // namespace prelude_cpu
