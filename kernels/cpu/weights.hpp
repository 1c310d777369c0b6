// A linear layer's weight as the CPU kernels read it: fp32, bf16 or int8 elements, laid out by
// rows ([outputs, inputs], as checkpoints store it) or in packed panels (packed_gemm.hpp's), with
// one scale per output for int8. Lower precisions are computed in fp32 (each weight widened as
// it is loaded, an int8 product scaled once per output), or, for panels on a CPU that has the
// instructions, in their own arithmetic (vnni_gemm.hpp, bf16_gemm.hpp); either way a decode step
// reads a quarter (int8) or half (bf16) of fp32's bytes.
//
// int8 is symmetric per output channel: scale = max |w| / 127 over the output's inputs, q =
// round(w / scale). A token's embedding row is the tied LM head's output row, so one scale per
// row serves both.
//
// Widening must cost a few instructions per vector, and GCC's vector extensions turn a sign or
// zero extension of eight narrow lanes into scalar code. So a row of a narrow by-rows weight is
// stored in groups of G elements (bf16 16, int8 32: one 32-byte vector) interleaved so that a
// group widens with shifts alone: the group's element 8b + j sits in lane j of the vector, at
// its b-th byte (int8) or half (bf16), and `(lane << (32 - w(b+1))) >> (32 - w)` brings it out
// (w its width in bits). Panels interleave k within a lane instead (packed_gemm.hpp).
#pragma once
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <vector>

#include "simd.hpp"
#include "team.hpp"

namespace prelude_cpu {

// kBF16x3: an fp32 weight kept as two bf16 packings, its rounding then the rest (linear.hpp);
// kBF16x2: one that bf16 holds exactly, kept as its one packing, multiplied as bf16x3 is.
enum WeightFormat : long { kF32 = 0, kBF16 = 1, kI8 = 2, kBF16x3 = 3, kBF16x2 = 4 };
enum WeightLayout : long { kByRows = 0, kPanels = 1 };

// Four 8-byte fields, so that a weight crosses from Python as four int64s.
struct Weight {
    const void* data;
    const float* scales;  // [outputs, rounded up to a panel for panels] for int8, else null
    long format;          // WeightFormat
    long layout;          // WeightLayout
};

struct bf16 {
    uint16_t bits;  // a float's high half
};

// Widen<T>::load(p, v): the kElems (a group's) elements at p as kElems / 8 vectors of floats, in
// element order; an int8 group still to be scaled.
template <typename T>
struct Widen;

template <>
struct Widen<float> {
    static constexpr long kElems = 16;
    __attribute__((always_inline)) static inline void load(const float* p, v8f* v) {
        v[0] = load8(p);
        v[1] = load8(p + 8);
    }
};

// Interleaved bf16 pairs widened to floats, a vector of F's lanes at a time: each 32-bit lane
// holds one element in its low half and another in its high half (the interleave above); v[0]
// gets the low halves' elements, v[1] the high halves'.
template <typename F>
__attribute__((always_inline)) static inline void widen_bf16_pairs(const bf16* p, F* v) {
    using I = decltype(v[0] < v[0]);  // the int32 vector of the same lanes
    I lanes;
    std::memcpy(&lanes, p, sizeof(lanes));
    const I low = lanes << 16, high = lanes & (I{} - 65536);
    std::memcpy(&v[0], &low, sizeof(low));
    std::memcpy(&v[1], &high, sizeof(high));
}

template <>
struct Widen<bf16> {
    static constexpr long kElems = 16;
    __attribute__((always_inline)) static inline void load(const bf16* p, v8f* v) { widen_bf16_pairs(p, v); }
};

template <>
struct Widen<int8_t> {
    static constexpr long kElems = 32;
    __attribute__((always_inline)) static inline void load(const int8_t* p, v8f* v) {
        v8i lanes;
        std::memcpy(&lanes, p, sizeof(lanes));
        v[0] = __builtin_convertvector((lanes << 24) >> 24, v8f);
        v[1] = __builtin_convertvector((lanes << 16) >> 24, v8f);
        v[2] = __builtin_convertvector((lanes << 8) >> 24, v8f);
        v[3] = __builtin_convertvector(lanes >> 24, v8f);
    }
};

// NAME_f32, NAME_bf16 and NAME_i8 (each in simd.hpp's CPU variants) from an always_inline
// BODY<T> for each stored element type.
#define PRELUDE_FORMAT_VARIANTS(NAME, BODY, PARAMS, ARGS)             \
    PRELUDE_CPU_VARIANTS_OF(NAME##_f32, BODY<float>, PARAMS, ARGS)    \
    PRELUDE_CPU_VARIANTS_OF(NAME##_bf16, BODY<bf16>, PARAMS, ARGS)    \
    PRELUDE_CPU_VARIANTS_OF(NAME##_i8, BODY<int8_t>, PARAMS, ARGS)

// Calls the one of three kernels that reads `format`.
template <typename F32, typename BF16, typename I8, typename... Args>
static inline void by_format(long format, F32 f32, BF16 bf16_kernel, I8 i8, Args... args) {
    if (format == kBF16) bf16_kernel(args...);
    else if (format == kI8) i8(args...);
    else f32(args...);
}

// How far ahead a kernel streaming a weight from memory prefetches it (into L2): far enough to
// cover the memory's latency, near enough that the lines are still there when read.
constexpr long kPrefetchAheadBytes = 8192;

static inline long format_bytes(long format) { return format == kF32 ? 4 : format == kBF16 ? 2 : 1; }

// Elements per interleaved group (1: not interleaved); a row of a by-rows weight is whole groups.
static inline long format_group(long format) { return format == kF32 ? 1 : format == kBF16 ? 16 : 32; }

// Round to nearest even, as torch's float -> bfloat16 conversion does (no NaNs in weights).
static inline bf16 to_bf16(float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof(bits));
    bits += 0x7fff + ((bits >> 16) & 1);
    return bf16{(uint16_t)(bits >> 16)};
}

// Row o of a weight being stored, in fp32: the source's own row (fp32), or a bf16 checkpoint's
// row widened into `scratch` (inputs floats): such a weight is stored from the checkpoint's own
// tensor, never held in fp32 while the model loads.
__attribute__((always_inline)) static inline const float* source_row(const void* w, long source, long o,
                                                                     long inputs, float* scratch) {
    if (source == kF32) return static_cast<const float*>(w) + o * inputs;
    const uint16_t* row = static_cast<const uint16_t*>(w) + o * inputs;
    for (long k = 0; k < inputs; ++k) {
        const uint32_t bits = uint32_t(row[k]) << 16;
        std::memcpy(scratch + k, &bits, sizeof(bits));
    }
    return scratch;
}

// One output's scale for int8 (1 for an all-zero row, so that dequantizing stays exact); inputs %
// 8 == 0. Eight lanes at a time (in the AVX2 variants that call it, 0.3 ns an element against the
// scalar loop's 1.3): every row of a vocabulary goes through it as an int8 server starts.
__attribute__((always_inline)) static inline float row_scale(const float* w, long inputs) {
    const v8i magnitude = v8i{} + 0x7fffffff;
    v8f most{};
    for (long k = 0; k < inputs; k += 8) {
        v8i bits;
        std::memcpy(&bits, w + k, sizeof(bits));
        bits &= magnitude;
        v8f size;
        std::memcpy(&size, &bits, sizeof(size));
        most = size > most ? size : most;  // a NaN is passed over (one max instruction)
    }
    // Folded in halves by shuffles (read lane by lane, the lanes went through inserts).
    v8f half = __builtin_shufflevector(most, most, 4, 5, 6, 7, 0, 1, 2, 3);
    most = half > most ? half : most;
    half = __builtin_shufflevector(most, most, 2, 3, 0, 1, 6, 7, 4, 5);
    most = half > most ? half : most;
    half = __builtin_shufflevector(most, most, 1, 0, 3, 2, 5, 4, 7, 6);
    most = half > most ? half : most;
    return most[0] > 0.0f ? most[0] / 127.0f : 1.0f;
}

// A row quantized with `inverse_scale` (x times it, clamped to +-127, rounded half away from zero
// by truncation: nearbyint is a libm call in the baseline build), eight lanes at a time, stored
// at q plus `offset` (vnni_gemm.hpp's rows are q + 128, as bytes); returns the sum of its q.
// inputs % 8 == 0.
__attribute__((always_inline)) static inline int32_t quantize_row(const float* row, long inputs, float inverse_scale,
                                                                  int8_t* q, int32_t offset = 0) {
    const v8f inverse = splat(inverse_scale), top = v8f{} + 127.0f, bottom = v8f{} - 127.0f;
    const v8i sign = v8i{} + (int32_t)0x80000000, half = v8i{} + 0x3f000000;  // 0.5f's bits
    v8i sum{};
    for (long k = 0; k < inputs; k += 8) {
        v8f v = load8(row + k) * inverse;
        v = v > bottom ? v : bottom;
        v = v < top ? v : top;
        v8i bits;
        std::memcpy(&bits, &v, sizeof(bits));
        const v8i away_bits = (bits & sign) | half;
        v8f away;
        std::memcpy(&away, &away_bits, sizeof(away));
        const v8i whole = __builtin_convertvector(v + away, v8i);
        sum += whole;
        // Each lane's low byte (a conversion of the lanes was eight extractions).
        typedef int8_t v32c __attribute__((vector_size(32)));
        v32c bytes;
        const v8i stored = whole + offset;
        std::memcpy(&bytes, &stored, sizeof(bytes));
        const auto narrow = __builtin_shufflevector(bytes, bytes, 0, 4, 8, 12, 16, 20, 24, 28);
        std::memcpy(q + k, &narrow, sizeof(narrow));
    }
    return ((sum[0] + sum[4]) + (sum[1] + sum[5])) + ((sum[2] + sum[6]) + (sum[3] + sum[7]));
}

// One row of `inputs` (whole groups) converted into `format` at dst, group by group (converted
// in order, then interleaved: the group's element 8b + j to lane j's b-th part): computing each
// element's place one by one made quantizing a vocabulary take half a second of startup.
__attribute__((always_inline)) static inline void put_row(void* dst, long format, const float* row, long inputs,
                                                           float inverse_scale) {
    if (format == kF32) {
        std::memcpy(dst, row, inputs * sizeof(float));
        return;
    }
    const long group = format_group(format), per_lane = group / 8;
    for (long g = 0; g < inputs; g += group) {
        // Converted in order first (the loop vectorizes), then interleaved.
        int8_t narrow[32];
        bf16 half[16];
        if (format == kBF16)
            for (long i = 0; i < 16; ++i) half[i] = to_bf16(row[g + i]);
        else
            quantize_row(row + g, 32, inverse_scale, narrow);
        for (long b = 0; b < per_lane; ++b)
            for (long j = 0; j < 8; ++j) {
                const long at = g + per_lane * j + b;
                if (format == kBF16) static_cast<bf16*>(dst)[at] = half[8 * b + j];
                else static_cast<int8_t*>(dst)[at] = narrow[8 * b + j];
            }
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
// put_row's bf16 rows sixteen elements an instruction where the CPU converts to bf16 itself (the
// same rounding): a bf16 checkpoint's head kept in bf16 took 111 ms of B's startup element by element.
__attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl"))) static void put_bf16_row_wide(bf16* dst,
                                                                                            const float* row,
                                                                                            long inputs) {
    // Lane 2j + b of a group takes its element 8b + j (the interleave above).
    const __m256i order = _mm256_setr_epi16(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    for (long g = 0; g < inputs; g += 16) {
        const __m256i half = (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(row + g));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + g), _mm256_permutexvar_epi16(order, half));
    }
}

static inline bool converts_bf16_wide() {
    static const bool has = [] {
        __builtin_cpu_init();
        return has_avx512f() && __builtin_cpu_supports("avx512bf16") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
    }();
    return has;
}
#else
static void put_bf16_row_wide(bf16*, const float*, long) {}
static inline bool converts_bf16_wide() { return false; }
#endif

// Rows [begin, end) of w [outputs, inputs] (fp32, or bf16: `source`) into rows of `format` at
// dst; int8 writes their scales.
__attribute__((always_inline)) static inline void convert_range_body(const void* w, long source, long inputs,
                                                                     long format, void* dst, float* scales,
                                                                     long begin, long end) {
    std::vector<float> scratch(source == kF32 ? 0 : inputs);
    for (long o = begin; o < end; ++o) {
        const float* row = source_row(w, source, o, inputs, scratch.data());
        float inverse = 1.0f;
        if (format == kI8) {
            scales[o] = row_scale(row, inputs);
            inverse = 1.0f / scales[o];
        }
        void* out = static_cast<char*>(dst) + o * inputs * format_bytes(format);
        if (format == kBF16 && converts_bf16_wide()) put_bf16_row_wide(static_cast<bf16*>(out), row, inputs);
        else put_row(out, format, row, inputs, inverse);
    }
}
PRELUDE_CPU_VARIANTS(convert_range,
                     (const void* w, long source, long inputs, long format, void* dst, float* scales, long begin,
                      long end),
                     (w, source, inputs, format, dst, scales, begin, end))

// w [outputs, inputs] (fp32, or bf16: `source`) into rows of `format` at dst; int8 writes scales
// [outputs]. On the team: a model's vocabulary is converted while the server starts.
static void convert_rows(const void* w, long source, long outputs, long inputs, long format, void* dst,
                         float* scales, int threads) {
    parallel_ranges(outputs, threads, 1, [&](long begin, long end) {
        run_convert_range(w, source, inputs, format, dst, scales, begin, end);
    });
}

// Rows `ids` of a narrow weight by rows (whole groups of T) widened into fp32 out [n, inputs], each
// times its scale (int8's; 1 without).
template <typename T>
static void widen_rows(const void* data, const float* scales, long inputs, const int64_t* ids, long n, float* out) {
    constexpr long kVectors = Widen<T>::kElems / 8;
    for (long i = 0; i < n; ++i) {
        const T* row = static_cast<const T*>(data) + ids[i] * inputs;
        const v8f scale = splat(scales != nullptr ? scales[ids[i]] : 1.0f);
        for (long g = 0; g < inputs; g += Widen<T>::kElems) {
            v8f v[kVectors];
            Widen<T>::load(row + g, v);
            for (long b = 0; b < kVectors; ++b) {
                const v8f scaled = v[b] * scale;
                std::memcpy(out + i * inputs + g + 8 * b, &scaled, sizeof(scaled));
            }
        }
    }
}

// Rows `ids` of a weight by rows in fp32 out [n, inputs] (an embedding's lookups), in the
// caller's thread. torch's own ops (gather, undo the interleave, widen) took 0.27 ms for 128 ids
// of the demo's bf16 rows, and their OpenMP threads, spinning after, slowed the step that followed.
static void gather_rows(const Weight& w, long inputs, const int64_t* ids, long n, float* out) {
    if (w.format == kBF16) {
        widen_rows<bf16>(w.data, nullptr, inputs, ids, n, out);
    } else if (w.format == kI8) {
        widen_rows<int8_t>(w.data, w.scales, inputs, ids, n, out);
    } else {
        for (long i = 0; i < n; ++i)
            std::memcpy(out + i * inputs, static_cast<const float*>(w.data) + ids[i] * inputs, inputs * sizeof(float));
    }
}

}  // namespace prelude_cpu
