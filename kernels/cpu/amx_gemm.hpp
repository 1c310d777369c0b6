// Rows times a bf16 or int8 panel weight on AMX (Intel's tile unit: Sapphire Rapids and later),
// where the CPU has it: one `tdpbf16ps` multiplies a 16 x 32 tile of bf16 rows by a 32 x 16 tile
// of bf16 weights into 16 x 16 fp32 sums, 16 times the multiply-adds of a `vdpbf16ps`, and one
// `tdpbusd` a 16 x 64 tile of u8 rows by a 64 x 16 int8 tile into int32 sums (oneDNN's bf16
// GEMM ran 1.6 TFLOP/s on two such cores, the AVX-512 BF16 kernel 0.2).
//
// The panels (bf16_gemm.hpp's, vnni_gemm.hpp's) are already the layout the tile unit reads its
// right-hand tile in: a panel's 64-byte group holds output j's two (bf16) or four (int8)
// consecutive k in lane j, so 16 consecutive groups are one tile, rows 64 bytes apart. The rows
// are rounded or quantized as the vector kernels do it, into the tiles' order; the products are
// the vector kernels' (int8's exactly; bf16's summed in another order).
//
// fp32 weights of an encoder go to the tiles as well, split (bf16x3, torch's "high" fp32 matmul
// precision): a weight is its bf16 rounding plus that of the rest, a row likewise, and the product
// is hi x hi + lo x hi + hi x lo, three tile products in fp32 sums, which agree with fp32's to
// about 2^-16 of each term (all-MiniLM's embeddings: 1 - cos ~1e-7 against sentence-transformers').
//
// Linux hands out the tile registers only to a process that asks (arch_prctl), once; without
// the permission (an older kernel), the vector kernels run. PRELUDE_CPU_AMX=0 turns AMX off.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "packed_gemm.hpp"
#include "simd.hpp"
#include "weights.hpp"

namespace prelude_cpu {

constexpr long kAmxRows = 16;  // rows of a tile
constexpr long kAmxK = 32;     // bf16 k of a tile (64 bytes a row)
constexpr long kAmxK8 = 64;    // int8 k of a tile
constexpr long kAmxBlockBytes = 256 * 1024;  // bytes of rows a block holds (a share of L2)

// Where element k of row i lies among rows in the tiles' order, for tiles of kK elements a row:
// a tile's 16 rows by kK are 64 bytes a row, 1 KB in all, the tile of rows 16t and k kK s at
// (16 t inputs + 16 kK s). Loaded from rows hundreds of bytes apart, the tiles' products took
// 1.2-1.35x as long (all-MiniLM's shapes at 2,048 rows).
template <long kK>
static inline long tile_at(long i, long k, long inputs) {
    return (i / kAmxRows) * kAmxRows * inputs + (i % kAmxRows) * kK + (k / kK) * kAmxRows * kK + k % kK;
}

// Rows of `row_bytes` each that amx_panels keeps in L2 at a time (a multiple of 32, at least 32).
static inline long amx_block_rows(long row_bytes) {
    const long block = kAmxBlockBytes / row_bytes / (2 * kAmxRows) * (2 * kAmxRows);
    return block > 2 * kAmxRows ? block : 2 * kAmxRows;
}

#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
// The CPU has AMX-TILE, AMX-BF16 and AMX-INT8, the kernel let this process use the tiles, and
// neither PRELUDE_CPU_AMX=0 nor a PRELUDE_CPU_MAX_ISA below AVX-512 turns them off.
static inline bool has_amx() {
    static const bool has = [] {
        const char* off = std::getenv("PRELUDE_CPU_AMX");
        if ((off != nullptr && std::string(off) == "0") || !has_avx512f()) return false;
        unsigned a, b, c, d;
        if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
        const bool tile = (d >> 24) & 1, bf16 = (d >> 22) & 1, int8 = (d >> 25) & 1;
        constexpr long kReqXcompPerm = 0x1023, kXfeatureTileData = 18;
        return tile && bf16 && int8 && syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureTileData) == 0;
    }();
    return has;
}

#define PRELUDE_AMX __attribute__((target("amx-tile,amx-bf16,amx-int8,avx512f")))

// Rows [begin, end) of x (all below the tiled rows' end) rounded to bf16 into xt in the tiles'
// order (tile_at).
__attribute__((target("avx512f,avx512bf16"))) static void round_to_tiles(const float* x, bf16* xt, long begin,
                                                                        long end, long inputs) {
    for (long i = begin; i < end; ++i) {
        const float* row = x + i * inputs;
        for (long k = 0; k < inputs; k += 16)
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(xt + tile_at<kAmxK>(i, k, inputs)),
                                (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(row + k)));
    }
}

// Rows [begin, end) of x, `rows` of which are real (the rest are zeros), split into bf16 halves
// in the tiles' order as round_to_tiles lays them out: hi their rounding, lo that of the rest.
__attribute__((target("avx512f,avx512bf16"))) static void split_to_tiles(const float* x, long rows, bf16* hi,
                                                                        bf16* lo, long begin, long end, long inputs) {
    for (long i = begin; i < end; ++i) {
        const float* row = x + i * inputs;
        for (long k = 0; k < inputs; k += 16) {
            const long at = tile_at<kAmxK>(i, k, inputs);
            const __m512 v = i < rows ? _mm512_loadu_ps(row + k) : _mm512_setzero_ps();
            const __m256bh h = _mm512_cvtneps_pbh(v);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + at), (__m256i)h);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + at),
                                (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, _mm512_cvtpbh_ps(h))));
        }
    }
}

// Tiles 0-3: sums (two row tiles by two panels); 4-5: rows; 6-7: panels. All 16 x 64 bytes.
struct alignas(64) TileConfig {
    uint8_t palette = 1;
    uint8_t start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

PRELUDE_AMX static inline void configure_tiles() {
    TileConfig config;
    for (int t = 0; t < 8; ++t) config.colsb[t] = 64, config.rows[t] = kAmxRows;
    // The whole struct as the instruction's operand: GCC 12's _tile_loadconfig names only its
    // first 8 bytes, and where this function was not inlined the widths and rows stored after
    // them were dropped as dead (tiles unconfigured: SIGILL at the first tile instruction).
    __asm__ volatile("ldtilecfg %0" ::"m"(config));
}

// Sums tile C (0-3) to p: GCC's tile intrinsics take their tile numbers as literals.
template <int C>
PRELUDE_AMX __attribute__((always_inline)) static inline void store_tile(void* p, long stride) {
    if constexpr (C == 0) _tile_stored(0, p, stride);
    else if constexpr (C == 1) _tile_stored(1, p, stride);
    else if constexpr (C == 2) _tile_stored(2, p, stride);
    else _tile_stored(3, p, stride);
}

// One tile's sums into out (`rows` <= 16 valid rows `ld` floats apart, `cols` <= 16 valid columns).
PRELUDE_AMX __attribute__((always_inline)) static inline void store_sums(const float* sums, float* out, long ld,
                                                                         long rows, long cols) {
    for (long r = 0; r < rows; ++r) std::memcpy(out + r * ld, sums + r * kPanel, cols * sizeof(float));
}

// Row tiles a0 (and a1) into tiles 4 (5), panels b0 (and b1) into 6 (7).
template <int kRowTiles, int kPanels, typename Row, typename Panel>
PRELUDE_AMX __attribute__((always_inline)) static inline void load_tiles(const Row* a0, const Row* a1,
                                                                         const Panel* b0, const Panel* b1) {
    _tile_loadd(4, a0, 64);
    if (kRowTiles == 2) _tile_loadd(5, a1, 64);
    _tile_loadd(6, b0, 64);
    if (kPanels == 2) _tile_loadd(7, b1, 64);
}

// What differs between the two kinds of products: bf16 rows by bf16 panels into fp32 sums, and
// int8 rows (q + 128, vnni_gemm.hpp's) by int8 panels into int32 sums, scaled as they leave.
struct Bf16Tiles {
    using Row = bf16;
    using Panel = bf16;
    static constexpr long kK = kAmxK;
    // Sums 0-3 += rows 4-5 by panels 6-7, as many as the block has.
    template <int kRowTiles, int kPanels>
    PRELUDE_AMX __attribute__((always_inline)) static inline void products() {
        _tile_dpbf16ps(0, 4, 6);
        if (kPanels == 2) _tile_dpbf16ps(1, 4, 7);
        if (kRowTiles == 2) _tile_dpbf16ps(2, 5, 6);
        if (kRowTiles == 2 && kPanels == 2) _tile_dpbf16ps(3, 5, 7);
    }
    // Tile C's sums for rows [row, row + valid) and columns [col, col + cols) at out.
    template <int C>
    PRELUDE_AMX __attribute__((always_inline)) inline void emit(float* out, long outputs, long, long, long cols,
                                                                long valid) const {
        if (cols == kPanel && valid == kAmxRows) {
            store_tile<C>(out, outputs * (long)sizeof(float));
            return;
        }
        alignas(64) float sums[kAmxRows * kPanel];  // a partial tile: a tile store writes all of it
        store_tile<C>(sums, kPanel * sizeof(float));
        store_sums(sums, out, outputs, valid, cols);
    }
};

// An fp32 weight and rows split into bf16 halves (hi, then lo `lo_panels` / `lo_rows` elements
// further): tile_step adds hi x hi, lo x hi, hi x lo into the same sums. lo_panels 0: a weight
// bf16 holds exactly (bf16x2: a bf16 checkpoint served in fp32), whose rest is zero; its product
// is not run.
struct Bf16x3Tiles : Bf16Tiles {
    long lo_rows;
    long lo_panels;
};

struct Int8Tiles {
    using Row = uint8_t;
    using Panel = int8_t;
    static constexpr long kK = kAmxK8;
    const int32_t* weight_sums;  // 128 times each output's weight sum (the rows' offset)
    const float* weight_scales;
    const float* row_scales;
    template <int kRowTiles, int kPanels>
    PRELUDE_AMX __attribute__((always_inline)) static inline void products() {
        _tile_dpbusd(0, 4, 6);
        if (kPanels == 2) _tile_dpbusd(1, 4, 7);
        if (kRowTiles == 2) _tile_dpbusd(2, 5, 6);
        if (kRowTiles == 2 && kPanels == 2) _tile_dpbusd(3, 5, 7);
    }
    template <int C>
    PRELUDE_AMX __attribute__((always_inline)) inline void emit(float* out, long outputs, long row, long col,
                                                                long cols, long valid) const {
        alignas(64) int32_t sums[kAmxRows * kPanel];
        store_tile<C>(sums, kPanel * sizeof(int32_t));
        const __mmask16 lanes = (__mmask16)((1u << cols) - 1);
        const __m512i offset = _mm512_maskz_loadu_epi32(lanes, weight_sums + col);
        const __m512 scales = _mm512_maskz_loadu_ps(lanes, weight_scales + col);
        for (long r = 0; r < valid; ++r) {
            const __m512 v = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_load_si512(sums + r * kPanel), offset));
            _mm512_mask_storeu_ps(out + r * outputs, lanes,
                                  _mm512_mul_ps(v, _mm512_mul_ps(scales, _mm512_set1_ps(row_scales[row + r]))));
        }
    }
};

// The sums of one tile of k: row tiles a0 (a1) by panels b0 (b1), of each kind's one product,
// or of bf16x3's three.
template <int kRowTiles, int kPanels, typename Tiles>
PRELUDE_AMX __attribute__((always_inline)) static inline void tile_step(const Tiles& tiles,
                                                                        const typename Tiles::Row* a0,
                                                                        const typename Tiles::Row* a1,
                                                                        const typename Tiles::Panel* b0,
                                                                        const typename Tiles::Panel* b1) {
    load_tiles<kRowTiles, kPanels>(a0, a1, b0, b1);
    Tiles::template products<kRowTiles, kPanels>();
    if constexpr (std::is_same_v<Tiles, Bf16x3Tiles>) {
        _tile_loadd(4, a0 + tiles.lo_rows, 64);  // the panels' hi stay in 6-7
        if (kRowTiles == 2) _tile_loadd(5, a1 + tiles.lo_rows, 64);
        Tiles::template products<kRowTiles, kPanels>();
        if (tiles.lo_panels != 0) {
            load_tiles<kRowTiles, kPanels>(a0, a1, b0 + tiles.lo_panels, b1 + tiles.lo_panels);
            Tiles::template products<kRowTiles, kPanels>();
        }
    }
}

// kRowTiles x kPanels tiles of sums over the whole of k: 16 or 32 rows of xt (in the tiles'
// order) by one or two panels, written to out. Rows [row, rows) (the last tile's rows past
// `rows` are padding, not written) and columns [col, col + cols) (cols: of the last panel;
// pairs are whole).
template <typename Tiles, int kRowTiles, int kPanels>
PRELUDE_AMX static inline void amx_block(const Tiles& tiles, const typename Tiles::Row* xt, long inputs,
                                         const typename Tiles::Panel* panel, float* out, long outputs, long row,
                                         long rows, long col, long cols) {
    const typename Tiles::Panel* next = panel + inputs * kPanel;
    const typename Tiles::Row* below_rows = xt + kAmxRows * inputs;
    _tile_zero(0);
    if (kPanels == 2) _tile_zero(1);
    if (kRowTiles == 2) _tile_zero(2);
    if (kRowTiles == 2 && kPanels == 2) _tile_zero(3);
    for (long k = 0; k < inputs; k += Tiles::kK)
        tile_step<kRowTiles, kPanels>(tiles, xt + k * kAmxRows, below_rows + k * kAmxRows, panel + k * kPanel,
                                      next + k * kPanel);
    const long valid = rows - row < kAmxRows ? rows - row : kAmxRows;
    tiles.template emit<0>(out, outputs, row, col, cols, valid);
    if (kPanels == 2) tiles.template emit<1>(out + kPanel, outputs, row, col + kPanel, kPanel, valid);
    if (kRowTiles == 2) {
        float* below = out + kAmxRows * outputs;
        const long below_valid = rows - row - kAmxRows < kAmxRows ? rows - row - kAmxRows : kAmxRows;
        tiles.template emit<2>(below, outputs, row + kAmxRows, col, cols, below_valid);
        if (kPanels == 2) tiles.template emit<3>(below + kPanel, outputs, row + kAmxRows, col + kPanel, kPanel, below_valid);
    }
}

// packed_gemm's epilogue (bias, then the activation) on the tiles' sums, 16 lanes at a time:
// at eight, BERT's GELU took as long as its layer's product on the tiles.
__attribute__((target("avx512f"))) static void amx_finish(float* out, long rows, long outputs, long col, long cols,
                                                         const float* bias, long activation) {
    if (cols % 16 != 0 || (bias == nullptr && activation == kNoActivation)) {
        finish_block(out, rows, outputs, col, cols, bias, activation);
        return;
    }
    for (long r = 0; r < rows; ++r)
        for (long j = col; j < col + cols; j += 16) {
            v16f v, b{};
            std::memcpy(&v, out + r * outputs + j, sizeof(v));
            if (bias != nullptr) std::memcpy(&b, bias + j, sizeof(b));
            v += b;
            if (activation == kGelu) v = gelu_lanes(v);
            std::memcpy(out + r * outputs + j, &v, sizeof(v));
        }
}

// Rows [0, tiled) of xt (in the tiles' order; tiled a multiple of 16; those from `rows` on are
// padding, not written) by panels [p_begin, p_end) of `outputs` columns, into out's rows `ld`
// floats apart (outputs, or more where the panels are a block of a wider weight's), with
// packed_gemm's epilogue. Rows go in blocks that stay in L2 while every panel pair
// passes over them: one pass of all the rows per pair, the sums' stores evicting them, took
// 1.1-1.2x as long at 2,048 rows (three of all-MiniLM's four shapes; the fourth alike).
template <typename Tiles>
PRELUDE_AMX static void amx_panels(const Tiles& tiles, const typename Tiles::Row* xt, long tiled, long rows,
                                   const typename Tiles::Panel* packed, long inputs, float* out, long outputs, long ld,
                                   long p_begin, long p_end, const float* bias, long activation) {
    configure_tiles();
    const long step = amx_block_rows(inputs * (long)sizeof(typename Tiles::Row));
    for (long r0 = 0; r0 < tiled; r0 += step) {
        const long r1 = r0 + step < tiled ? r0 + step : tiled;
        for (long p = p_begin; p < p_end;) {
            const typename Tiles::Panel* panel = packed + p * inputs * kPanel;
            const long col = p * kPanel;
            const bool pair = p + 1 < p_end && col + 2 * kPanel <= outputs;
            const long cols = pair ? 2 * kPanel : (outputs - col < kPanel ? outputs - col : kPanel);
            for (long r = r0; r < r1; r += 2 * kAmxRows) {
                const typename Tiles::Row* x = xt + r * inputs;
                float* o = out + r * ld + col;
                const bool two = r + 2 * kAmxRows <= r1;
                if (pair && two) amx_block<Tiles, 2, 2>(tiles, x, inputs, panel, o, ld, r, rows, col, kPanel);
                else if (pair) amx_block<Tiles, 1, 2>(tiles, x, inputs, panel, o, ld, r, rows, col, kPanel);
                else if (two) amx_block<Tiles, 2, 1>(tiles, x, inputs, panel, o, ld, r, rows, col, cols);
                else amx_block<Tiles, 1, 1>(tiles, x, inputs, panel, o, ld, r, rows, col, cols);
            }
            amx_finish(out + r0 * ld, (r1 < rows ? r1 : rows) - r0, ld, col, cols, bias, activation);
            p += pair ? 2 : 1;
        }
    }
    _tile_release();
}
#undef PRELUDE_AMX
#else
static inline bool has_amx() { return false; }
struct Bf16Tiles {
    using Row = bf16;
    using Panel = bf16;
};
struct Bf16x3Tiles : Bf16Tiles {
    long lo_rows;
    long lo_panels;
};
struct Int8Tiles {
    using Row = uint8_t;
    using Panel = int8_t;
    const int32_t* weight_sums;
    const float* weight_scales;
    const float* row_scales;
};
template <typename Tiles>
static void amx_panels(const Tiles&, const typename Tiles::Row*, long, long, const typename Tiles::Panel*, long,
                       float*, long, long, long, long, const float*, long) {}
static void round_to_tiles(const float*, bf16*, long, long, long) {}
static void split_to_tiles(const float*, long, bf16*, bf16*, long, long, long) {}
#endif

}  // namespace prelude_cpu
