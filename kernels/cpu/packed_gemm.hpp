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
#include <type_traits>

#include "simd.hpp"
#include "team.hpp"
#include "weights.hpp"

namespace prelude_cpu {

constexpr long kPanel = 16;      // outputs per packed panel
constexpr long kTileRows = 6;    // rows of x per register tile (packed_panels_body names 1-6)
// A bf16 panel's stream tiles at most five rows: widening the weight takes the registers a tile of
// six then lacks (B's 3072 x 512 on AVX2: five rows 0.085 ms, six 0.22-0.24 in one tile, 0.15 as
// five and one, the panel still in cache for the second).
constexpr long kBf16StreamTileRows = 5;
// Where the blocked tiles are eight lanes wide (AVX2), fp32 and bf16 panels are streamed up to
// this many rows, in even tiles. B's layers in process, the blocked tiles' time over the
// stream's at 7-32 rows: bf16 1.3-1.6x at seven to ten rows (they widen each slice into fp32
// first), 1.05-1.15x at 16 to 32 (its tied head 1.08-1.25x), about 1.0x at 48; fp32 1.05-1.25x
// (q/k/v's 1024 x 512 0.9-0.95x at 7, 16 and 24 rows). Widened int8 panels stream up
// to kTileRows: from twelve rows their stream took 1.1-1.3x the blocked tiles' time.
constexpr long kStreamUpTo = 32;
constexpr long kSliceK = 256;    // inputs per slice of a panel
constexpr long kBlockRows = 192;  // rows of x whose slice (192 KB) stays in L2 while the panels pass

static inline long panel_outputs(long outputs) { return (outputs + kPanel - 1) / kPanel * kPanel; }

// Elements of pack_weight's copy of an [outputs, inputs] weight.
static inline long packed_elements(long outputs, long inputs) { return panel_outputs(outputs) * inputs; }

// How a panel's groups are widened (weights.hpp's Widen for fp32: a group is one k's sixteen
// outputs). A narrow group is 64 bytes of several k, each output's consecutive k in one 32-bit
// lane (of the first 32 bytes for outputs 0-7, of the second for 8-15), the layout a dot product
// of pairs per lane reads: four k for int8 (VNNI's u8 x s8, vnni_gemm.hpp), two for bf16
// (vdpbf16ps, bf16_gemm.hpp). Here shifts widen it, vector 2t + h holding k + t of outputs
// 8h..8h+7.
template <typename T>
struct PanelWiden : Widen<T> {};

template <>
struct PanelWiden<bf16> {
    static constexpr long kElems = 32;
    __attribute__((always_inline)) static inline void load(const bf16* p, v8f* v) {
        for (int h = 0; h < 2; ++h) {
            v8i lanes;
            std::memcpy(&lanes, p + 16 * h, sizeof(lanes));
            const v8i low = lanes << 16, high = lanes & (v8i{} - 65536);
            std::memcpy(&v[h], &low, sizeof(low));
            std::memcpy(&v[2 + h], &high, sizeof(high));
        }
    }
};

template <>
struct PanelWiden<int8_t> {
    static constexpr long kElems = 64;
    __attribute__((always_inline)) static inline void load(const int8_t* p, v8f* v) {
        for (int h = 0; h < 2; ++h) {
            v8i lanes;
            std::memcpy(&lanes, p + 32 * h, sizeof(lanes));
            v[h] = __builtin_convertvector((lanes << 24) >> 24, v8f);
            v[2 + h] = __builtin_convertvector((lanes << 16) >> 24, v8f);
            v[4 + h] = __builtin_convertvector((lanes << 8) >> 24, v8f);
            v[6 + h] = __builtin_convertvector(lanes >> 24, v8f);
        }
    }
};

// Panels [begin, end) of w [outputs, inputs] (fp32, or bf16: `source`) in `format` (pack_weight).
// Every format puts one 32-bit lane of an output's consecutive k (one fp32, two bf16, four int8)
// beside the next output's, so a panel's sixteen rows are converted in order first (loops over
// vectors) and then interleaved a lane at a time: element by element, each element's place
// computed, packing B's vocabulary took 150 ms of its startup in int8 and 76 ms in fp32.
__attribute__((always_inline)) static inline void pack_range_body(const void* w, long source, long outputs,
                                                                  long inputs, long format, void* packed,
                                                                  float* scales, long begin, long end) {
    const long lanes = inputs * format_bytes(format) / 4;  // 32-bit lanes of a row
    int32_t* sums = format == kI8 ? reinterpret_cast<int32_t*>(scales + panel_outputs(outputs)) : nullptr;
    std::vector<float> scratch(source == kF32 ? 0 : inputs);
    std::vector<uint32_t> rows(kPanel * lanes);  // the panel's rows in `format`, in order
    for (long p = begin; p < end; ++p) {
        for (long j = 0; j < kPanel; ++j) {
            const long o = p * kPanel + j;
            uint32_t* narrow = rows.data() + j * lanes;
            if (o >= outputs) {
                std::memset(narrow, 0, lanes * sizeof(uint32_t));
                if (format == kI8) scales[o] = 1.0f, sums[o] = 0;
                continue;
            }
            const float* row = source_row(w, source, o, inputs, scratch.data());
            if (format == kF32) {
                std::memcpy(narrow, row, inputs * sizeof(float));
            } else if (format == kBF16) {
                bf16* half = reinterpret_cast<bf16*>(narrow);
                for (long k = 0; k < inputs; ++k) half[k] = to_bf16(row[k]);
            } else {
                scales[o] = row_scale(row, inputs);
                sums[o] = 128 * quantize_row(row, inputs, 1.0f / scales[o], reinterpret_cast<int8_t*>(narrow));
            }
        }
        uint32_t* panel = reinterpret_cast<uint32_t*>(static_cast<char*>(packed) + p * kPanel * lanes * 4);
        for (long g = 0; g < lanes; ++g)
            for (long j = 0; j < kPanel; ++j) panel[g * kPanel + j] = rows[j * lanes + g];
    }
}
PRELUDE_CPU_VARIANTS(pack_range,
                     (const void* w, long source, long outputs, long inputs, long format, void* packed, float* scales,
                      long begin, long end),
                     (w, source, outputs, inputs, format, packed, scales, begin, end))

// Rows `ids` of a weight in panels (pack_weight's layout; fp32, bf16 or int8) widened into fp32
// out [n, inputs], int8 times each row's scale: a tied embedding's lookups, in the caller's thread.
// Output o's 32-bit lanes are lane o % 16 of each 64-byte group of its panel, in k order, each
// holding 4 / sizeof(T) consecutive k. torch's indexing of the same view took 10x the by-rows
// gather's time (B's bf16 embedding, 128 ids: 0.28 against 0.027 ms).
template <typename T>
static void gather_panel_rows_of(const void* data, const float* scales, long inputs, const int64_t* ids, long n,
                                 float* out) {
    constexpr long kPer = 4 / sizeof(T);  // k per lane
    const long lanes = inputs / kPer;
    for (long i = 0; i < n; ++i) {
        const long o = ids[i];
        const uint32_t* lane = static_cast<const uint32_t*>(data) + (o / kPanel) * kPanel * lanes + o % kPanel;
        const float scale = scales != nullptr ? scales[o] : 1.0f;
        float* row = out + i * inputs;
        for (long g = 0; g < lanes; ++g) {
            const uint32_t word = lane[g * kPanel];
            if constexpr (std::is_same<T, float>::value) {
                std::memcpy(row + g, &word, sizeof(word));
            } else if constexpr (std::is_same<T, bf16>::value) {
                const uint32_t low = word << 16, high = word & 0xFFFF0000u;
                std::memcpy(row + 2 * g, &low, sizeof(low));
                std::memcpy(row + 2 * g + 1, &high, sizeof(high));
            } else {
                for (long b = 0; b < kPer; ++b) row[kPer * g + b] = static_cast<int8_t>(word >> (8 * b)) * scale;
            }
        }
    }
}

static void gather_panel_rows(const Weight& w, long inputs, const int64_t* ids, long n, float* out) {
    if (w.format == kBF16) gather_panel_rows_of<bf16>(w.data, nullptr, inputs, ids, n, out);
    else if (w.format == kI8) gather_panel_rows_of<int8_t>(w.data, w.scales, inputs, ids, n, out);
    else gather_panel_rows_of<float>(w.data, nullptr, inputs, ids, n, out);
}

// w [outputs, inputs] (fp32, or bf16: `source`) into [panels, inputs, 16] of `format`; the last
// panel's missing outputs are zero. int8 also writes `scales` (scales_floats): a scale per output
// and, for vnni_gemm.hpp, 128 times the sum of the output's quantized weights as an int32 (1 and 0
// past the outputs).
static void pack_weight(const void* w, long source, long outputs, long inputs, long format, void* packed,
                        float* scales, int threads) {
    parallel_ranges((outputs + kPanel - 1) / kPanel, threads, 1, [&](long begin, long end) {
        run_pack_range(w, source, outputs, inputs, format, packed, scales, begin, end);
    });
}

// The lines of the next two panels' slices (a 64-byte group of each per step of the products),
// which the tiles over this pair fetch a share each, one line per step: read as the hardware
// prefetcher reads them, the weights of 8-64 rows came at a fraction of the memory's speed (a
// third for the blocked tiles below). Here and in bf16_gemm.hpp's tile pairs.
struct PairFetch {
    const char* first;   // the first next panel's slice
    const char* second;  // the second's
    long lines;          // lines per panel slice
    const char* line(long j) const { return j < lines ? first + 64 * j : second + 64 * (j - lines); }
};

// What a product may end with, applied to each finished block of a panel while it is still in
// cache: a bias per output, then an activation (an encoder's dense layers; a decoder's have
// neither). As separate passes over the output (torch's bias copy and GELU) they took a fifth
// of all-MiniLM's forward at 32 passages.
enum Activation : long { kNoActivation = 0, kGelu = 1 };

// The epilogue over rows [0, rows) x columns [col, col + cols) of out (row stride `outputs`).
__attribute__((always_inline)) static inline void finish_block(float* out, long rows, long outputs, long col,
                                                               long cols, const float* bias, long activation) {
    if (bias == nullptr && activation == kNoActivation) return;
    if (cols == kPanel) {  // a panel's block: its two vectors a row, unrolled (the loop below ran 6% slower)
        const v8f zero{};
        const v8f b0 = bias != nullptr ? load8(bias + col) : zero, b1 = bias != nullptr ? load8(bias + col + 8) : zero;
        for (long r = 0; r < rows; ++r) {
            float* o = out + r * outputs + col;
            v8f lo = load8(o) + b0, hi = load8(o + 8) + b1;
            if (activation == kGelu) lo = gelu8(lo), hi = gelu8(hi);
            store8(o, lo);
            store8(o + 8, hi);
        }
        return;
    }
    for (long r = 0; r < rows; ++r) {  // any width (a whole by-rows or int8 product's output)
        float* o = out + r * outputs + col;
        long j = 0;
        for (; j + 8 <= cols; j += 8) {  // whole vectors read and written in place
            v8f v = load8(o + j);
            if (bias != nullptr) v += load8(bias + col + j);
            if (activation == kGelu) v = gelu8(v);
            store8(o + j, v);
        }
        if (j < cols) {  // the last few columns, through a vector's worth of scratch
            const long n = cols - j;
            alignas(32) float lane[8] = {}, add[8] = {};
            std::memcpy(lane, o + j, n * sizeof(float));
            if (bias != nullptr) std::memcpy(add, bias + col + j, n * sizeof(float));
            v8f v = load8(lane) + load8(add);
            if (activation == kGelu) v = gelu8(v);
            store8(lane, v);
            std::memcpy(o + j, lane, n * sizeof(float));
        }
    }
}

// R rows of x (stride `inputs`) times one panel's slice [k0, k1): out (stride `outputs`, `cols`
// valid columns) is set, or added to when `accumulate` (a later slice). A load widens a group
// of the panel (one k, or two for int8: Widen); an int8 panel's sums are scaled by its outputs'
// scales before they are stored.
template <int R, typename T, bool kPrefetch = false>
__attribute__((always_inline)) static inline void panel_tile(const float* x, long inputs, const T* panel,
                                                             const float* scale, long k0, long k1, bool accumulate,
                                                             float* out, long outputs, long cols,
                                                             const char* fetch, long fetch_lines) {
    constexpr long kSteps = PanelWiden<T>::kElems / kPanel;  // k per group
    static_assert(kPanel * kSteps * sizeof(T) == 64, "a group is one cache line");
    v8f lo[R], hi[R];
    for (int r = 0; r < R; ++r) lo[r] = hi[r] = v8f{};
    for (long k = k0, group = 0; k < k1; k += kSteps, ++group) {
        // Streaming (few rows, bound by memory): 8 KB ahead into L2, past the panel's end into
        // the next panel, which follows it; a line per group read.
        if constexpr (kPrefetch) __builtin_prefetch((const char*)(panel + k * kPanel) + kPrefetchAheadBytes, 0, 1);
        // Blocked: this tile's share of the next panel's lines, one per group, paced by the
        // products instead of all at the tile's start.
        if (group < fetch_lines) __builtin_prefetch(fetch + group * 64, 0, 1);
        v8f b[2 * kSteps];
        PanelWiden<T>::load(panel + k * kPanel, b);
        for (long step = 0; step < kSteps; ++step)
            for (int r = 0; r < R; ++r) {
                const v8f s = splat(x[r * inputs + k + step]);
                lo[r] += s * b[2 * step];
                hi[r] += s * b[2 * step + 1];
            }
    }
    if constexpr (std::is_same<T, int8_t>::value) {
        const v8f s0 = load8(scale), s1 = load8(scale + 8);
        for (int r = 0; r < R; ++r) lo[r] *= s0, hi[r] *= s1;
    }
    for (int r = 0; r < R; ++r) {
        float* o = out + r * outputs;
        if (cols == kPanel) {
            if (accumulate) { lo[r] += load8(o); hi[r] += load8(o + 8); }
            store8(o, lo[r]);
            store8(o + 8, hi[r]);
        } else {
            for (long j = 0; j < cols; ++j) o[j] = (accumulate ? o[j] : 0.0f) + (j < 8 ? lo[r][j] : hi[r][j - 8]);
        }
    }
}

// Rows [i, i + rows) of x, rows <= kTileRows, against one panel's slice.
template <typename T, bool kPrefetch = false>
__attribute__((always_inline)) static inline void panel_tiles(const float* x, long rows, long inputs, const T* panel,
                                                              const float* scale, long k0, long k1, bool accumulate,
                                                              float* out, long outputs, long cols,
                                                              const char* fetch = nullptr, long fetch_lines = 0) {
    switch (rows) {
        case 6: panel_tile<6, T, kPrefetch>(x, inputs, panel, scale, k0, k1, accumulate, out, outputs, cols, fetch, fetch_lines); break;
        case 5: panel_tile<5, T, kPrefetch>(x, inputs, panel, scale, k0, k1, accumulate, out, outputs, cols, fetch, fetch_lines); break;
        case 4: panel_tile<4, T, kPrefetch>(x, inputs, panel, scale, k0, k1, accumulate, out, outputs, cols, fetch, fetch_lines); break;
        case 3: panel_tile<3, T, kPrefetch>(x, inputs, panel, scale, k0, k1, accumulate, out, outputs, cols, fetch, fetch_lines); break;
        case 2: panel_tile<2, T, kPrefetch>(x, inputs, panel, scale, k0, k1, accumulate, out, outputs, cols, fetch, fetch_lines); break;
        default: panel_tile<1, T, kPrefetch>(x, inputs, panel, scale, k0, k1, accumulate, out, outputs, cols, fetch, fetch_lines); break;
    }
}

// Few rows (a decode step's): each panel read once, whole, from memory in order; the rows' tiles
// pass over it while it is in L2. Bound by reading the weight.
template <typename T>
__attribute__((always_inline)) static inline void stream_panels_body(const float* x, long n, const void* weight,
                                                                     const float* scales, long inputs, float* out,
                                                                     long outputs, long p_begin, long p_end,
                                                                     const float* bias, long activation) {
    const T* packed = static_cast<const T*>(weight);
    constexpr long tile = std::is_same<T, bf16>::value ? kBf16StreamTileRows : kTileRows;
    for (long p = p_begin; p < p_end; ++p) {
        const T* panel = packed + p * inputs * kPanel;
        const long col = p * kPanel, cols = outputs - col < kPanel ? outputs - col : kPanel;
        // As even as they go (six rows as three and three): a tile of one row is two chains of
        // dependent sums, slower than the stream.
        const long tiles = (n + tile - 1) / tile;
        for (long t = 0, i = 0; t < tiles; ++t) {
            const long rows = (n - i) / (tiles - t);
            panel_tiles<T, true>(x + i * inputs, rows, inputs, panel, scales == nullptr ? nullptr : scales + col, 0,
                                 inputs, false, out + i * outputs + col, outputs, cols);
            i += rows;
        }
        finish_block(out, n, outputs, col, cols, bias, activation);
    }
}

// A slice [k0, k1) of an int8 or bf16 panel widened into fp32 at `wide` ([k1 - k0, 16]), int8
// scaled: the blocked tiles then run on fp32, widening each weight once per row block instead of
// once per row tile (twice as fast at 64 rows).
template <typename T>
__attribute__((always_inline)) static inline void widen_slice(const T* panel, const float* scale, long k0, long k1,
                                                              float* wide) {
    constexpr long kSteps = PanelWiden<T>::kElems / kPanel;
    v8f s0 = v8f{} + 1.0f, s1 = s0;
    if constexpr (std::is_same<T, int8_t>::value) s0 = load8(scale), s1 = load8(scale + 8);
    for (long k = k0; k < k1; k += kSteps) {
        v8f b[2 * kSteps];
        PanelWiden<T>::load(panel + k * kPanel, b);
        for (long step = 0; step < kSteps; ++step) {
            store8(wide + (k - k0 + step) * kPanel, b[2 * step] * s0);
            store8(wide + (k - k0 + step) * kPanel + 8, b[2 * step + 1] * s1);
        }
    }
}

template <typename T>
__attribute__((always_inline)) static inline void packed_panels_body(const float* x, long n, const void* weight,
                                                                     const float* scales, long inputs, float* out,
                                                                     long outputs, long p_begin, long p_end,
                                                                     const float* bias, long activation) {
    const T* packed = static_cast<const T*>(weight);
    alignas(32) float wide[std::is_same<T, float>::value ? 1 : kSliceK * kPanel];
    for (long r0 = 0; r0 < n; r0 += kBlockRows) {
        const long r1 = r0 + kBlockRows < n ? r0 + kBlockRows : n;
        const long tiles = (r1 - r0 + kTileRows - 1) / kTileRows;
        for (long k0 = 0; k0 < inputs; k0 += kSliceK) {
            const long k1 = k0 + kSliceK < inputs ? k0 + kSliceK : inputs;
            // The next panel's slice (a cache line per 64 bytes of it) is fetched a share per
            // tile, so that it is on its way from memory while this one's tiles compute: a burst
            // of a share at each tile's start read the weights of 8-64 rows at a third of the
            // memory's speed.
            const long lines = ((k1 - k0) * kPanel * (long)sizeof(T) + 63) / 64;
            const long lines_per_tile = (lines + tiles - 1) / tiles;
            for (long p = p_begin; p < p_end; ++p) {
                const T* panel = packed + p * inputs * kPanel;
                const char* next = p + 1 < p_end ? (const char*)(panel + inputs * kPanel + k0 * kPanel) : nullptr;
                const long col = p * kPanel, cols = outputs - col < kPanel ? outputs - col : kPanel;
                const float* slice = nullptr;  // the fp32 slice the tiles read, at its k0
                long first = k0;
                if constexpr (std::is_same<T, float>::value) {
                    slice = panel;
                } else {
                    widen_slice(panel, scales == nullptr ? nullptr : scales + col, k0, k1, wide);
                    slice = wide, first = 0;
                }
                long line = 0;
                for (long i = r0; i < r1; i += kTileRows) {
                    const long take = next == nullptr ? 0 : lines - line < lines_per_tile ? lines - line : lines_per_tile;
                    panel_tiles(x + i * inputs + k0 - first, r1 - i < kTileRows ? r1 - i : kTileRows, inputs, slice,
                                nullptr, first, first + k1 - k0, k0 != 0, out + i * outputs + col, outputs, cols,
                                take > 0 ? next + line * 64 : nullptr, take);
                    line += take;
                }
                if (k1 == inputs) finish_block(out + r0 * outputs, r1 - r0, outputs, col, cols, bias, activation);
            }
        }
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
// The blocked product on AVX-512: packed_panels_body's blocks and slices, but its tiles sixteen
// lanes wide, two panels (32 outputs, a vector each) by up to twelve rows: 24 accumulators, each
// k two loads and twelve broadcasts for 24 FMAs. On an AVX-512 CPU without AMX (fp32 and bf16x2
// panels alike) eight-lane tiles took 1.2-1.5x MKL's sgemm time for 64-256 rows of B's shapes,
// one panel by twelve rows 1.15-1.25x, these 0.83-1.09x.
constexpr long kWideTileRows = 12;

// R rows of x against P panels' fp32 slices at k in [k0, k1) (`slices[q] + k * kPanel`); out is
// set, or added to when `accumulate`; the last panel has `cols` valid columns.
template <int R, int P>
__attribute__((always_inline)) static inline void pair_tile16(const float* x, long inputs, const float* const* slices,
                                                              long k0, long k1, bool accumulate, float* out,
                                                              long outputs, long cols, const PairFetch& fetch,
                                                              long line, long last) {
    v16f sums[R][P];
    for (int r = 0; r < R; ++r)
        for (int q = 0; q < P; ++q) sums[r][q] = v16f{};
    for (long k = k0; k < k1; ++k) {
        if (line + (k - k0) < last) __builtin_prefetch(fetch.line(line + (k - k0)), 0, 1);
        v16f w[P];
        for (int q = 0; q < P; ++q) w[q] = load_lanes<v16f>(slices[q] + k * kPanel);
        for (int r = 0; r < R; ++r) {
            const float xr = x[r * inputs + k];
            for (int q = 0; q < P; ++q) sums[r][q] += xr * w[q];
        }
    }
    for (int r = 0; r < R; ++r)
        for (int q = 0; q < P; ++q) {
            float* o = out + r * outputs + q * kPanel;
            if (q + 1 < P || cols == kPanel) {
                if (accumulate) sums[r][q] += load_lanes<v16f>(o);
                store_lanes(o, sums[r][q]);
            } else {
                for (long j = 0; j < cols; ++j) o[j] = (accumulate ? o[j] : 0.0f) + sums[r][q][j];
            }
        }
}

template <int P, int R = kWideTileRows>
__attribute__((always_inline)) static inline void pair_tiles16(const float* x, long rows, long inputs,
                                                               const float* const* slices, long k0, long k1,
                                                               bool accumulate, float* out, long outputs, long cols,
                                                               const PairFetch& fetch, long line, long last) {
    if constexpr (R > 1) {
        if (rows < R) {
            pair_tiles16<P, R - 1>(x, rows, inputs, slices, k0, k1, accumulate, out, outputs, cols, fetch, line, last);
            return;
        }
    }
    pair_tile16<R, P>(x, inputs, slices, k0, k1, accumulate, out, outputs, cols, fetch, line, last);
}

template <typename T>
__attribute__((always_inline)) static inline void packed_pairs16_body(const float* x, long n, const void* weight,
                                                                      const float* scales, long inputs, float* out,
                                                                      long outputs, long p_begin, long p_end,
                                                                      const float* bias, long activation) {
    const T* packed = static_cast<const T*>(weight);
    const long stride = inputs * kPanel;  // elements per panel
    alignas(64) float wide[std::is_same<T, float>::value ? 1 : 2 * kSliceK * kPanel];
    for (long r0 = 0; r0 < n; r0 += kBlockRows) {
        const long r1 = r0 + kBlockRows < n ? r0 + kBlockRows : n;
        const long tiles = (r1 - r0 + kWideTileRows - 1) / kWideTileRows;
        for (long k0 = 0; k0 < inputs; k0 += kSliceK) {
            const long k1 = k0 + kSliceK < inputs ? k0 + kSliceK : inputs;
            const long lines = ((k1 - k0) * kPanel * (long)sizeof(T) + 63) / 64;  // of one panel's slice
            for (long p = p_begin; p < p_end; p += 2) {
                const int pair = p + 1 < p_end ? 2 : 1;
                const T* panel = packed + p * stride;
                const long col = p * kPanel, last_col = col + (pair - 1) * kPanel;
                const long cols = outputs - last_col < kPanel ? outputs - last_col : kPanel;  // of the last panel
                // The next pair's slices, fetched a share per tile while this pair's tiles compute.
                const char* next_a = p + 2 < p_end ? (const char*)(panel + 2 * stride + k0 * kPanel) : nullptr;
                const char* next_b = p + 3 < p_end ? (const char*)(panel + 3 * stride + k0 * kPanel) : nullptr;
                const PairFetch fetch = {next_a, next_b, lines};
                const long total = (next_a != nullptr ? lines : 0) + (next_b != nullptr ? lines : 0);
                const long share = (total + tiles - 1) / tiles;
                const float* slices[2];
                long first = k0;
                if constexpr (std::is_same<T, float>::value) {
                    slices[0] = panel, slices[1] = panel + stride;
                } else {
                    for (int q = 0; q < pair; ++q)
                        widen_slice(panel + q * stride, scales == nullptr ? nullptr : scales + col + q * kPanel, k0,
                                    k1, wide + q * kSliceK * kPanel);
                    slices[0] = wide, slices[1] = wide + kSliceK * kPanel, first = 0;
                }
                for (long i = r0, line = 0; i < r1; i += kWideTileRows, line += share) {
                    const long last = line + share < total ? line + share : total;
                    const long rows = r1 - i < kWideTileRows ? r1 - i : kWideTileRows;
                    const float* xi = x + i * inputs + k0 - first;
                    float* o = out + i * outputs + col;
                    if (pair == 2)
                        pair_tiles16<2>(xi, rows, inputs, slices, first, first + k1 - k0, k0 != 0, o, outputs, cols,
                                        fetch, line, last);
                    else
                        pair_tiles16<1>(xi, rows, inputs, slices, first, first + k1 - k0, k0 != 0, o, outputs, cols,
                                        fetch, line, last);
                }
                if (k1 == inputs) {
                    finish_block(out + r0 * outputs, r1 - r0, outputs, col, pair == 2 ? kPanel : cols, bias, activation);
                    if (pair == 2) finish_block(out + r0 * outputs, r1 - r0, outputs, last_col, cols, bias, activation);
                }
            }
        }
    }
}
#endif

#define PRELUDE_PANEL_PARAMS                                                                                   \
    (const float* x, long n, const void* weight, const float* scales, long inputs, float* out, long outputs, \
     long p_begin, long p_end, const float* bias, long activation)
#define PRELUDE_PANEL_ARGS (x, n, weight, scales, inputs, out, outputs, p_begin, p_end, bias, activation)
PRELUDE_FORMAT_VARIANTS(stream_panels, stream_panels_body, PRELUDE_PANEL_PARAMS, PRELUDE_PANEL_ARGS)
PRELUDE_FORMAT_VARIANTS(packed_panels, packed_panels_body, PRELUDE_PANEL_PARAMS, PRELUDE_PANEL_ARGS)
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f"))) static void packed_pairs16_f32 PRELUDE_PANEL_PARAMS {
    packed_pairs16_body<float> PRELUDE_PANEL_ARGS;
}
__attribute__((target("avx512f"))) static void packed_pairs16_bf16 PRELUDE_PANEL_PARAMS {
    packed_pairs16_body<bf16> PRELUDE_PANEL_ARGS;
}
__attribute__((target("avx512f"))) static void packed_pairs16_i8 PRELUDE_PANEL_PARAMS {
    packed_pairs16_body<int8_t> PRELUDE_PANEL_ARGS;
}
#endif

#undef PRELUDE_PANEL_PARAMS
#undef PRELUDE_PANEL_ARGS

// `w`: pack_weight's layout of a [outputs, inputs] weight. The panels are split across `threads`
// of the team; few rows stream them (bound by memory), more go through the blocked tiles. `bias`
// (or null) and `activation`: the epilogue.
static void packed_gemm(const float* x, long n, const Weight& w, long inputs, float* out, long outputs, int threads,
                        const float* bias = nullptr, long activation = kNoActivation) {
    const long panels = (outputs + kPanel - 1) / kPanel;
    long stream_up_to = w.format == kI8 ? kTileRows : kStreamUpTo;
#if defined(__x86_64__) && defined(__GNUC__)
    if (has_avx512f()) stream_up_to = kTileRows;  // its sixteen-lane tiles are not measured against it
#endif
    const bool few = n <= stream_up_to;
    const long work = few ? panels * kPanel * inputs * format_bytes(w.format) / 4 : n * outputs * inputs / 8;
    parallel_ranges(panels, threads_worth(work, threads), 1, [&](long begin, long end) {
        if (few)
            by_format(w.format, run_stream_panels_f32, run_stream_panels_bf16, run_stream_panels_i8, x, n, w.data,
                      w.scales, inputs, out, outputs, begin, end, bias, activation);
#if defined(__x86_64__) && defined(__GNUC__)
        else if (has_avx512f())
            by_format(w.format, packed_pairs16_f32, packed_pairs16_bf16, packed_pairs16_i8, x, n, w.data, w.scales,
                      inputs, out, outputs, begin, end, bias, activation);
#endif
        else
            by_format(w.format, run_packed_panels_f32, run_packed_panels_bf16, run_packed_panels_i8, x, n, w.data,
                      w.scales, inputs, out, outputs, begin, end, bias, activation);
    });
}

}  // namespace prelude_cpu
