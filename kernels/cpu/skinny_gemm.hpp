// out[n, V] = x[n, H] . w[V, H]^T for a few rows of x against a large weight: every linear layer
// of a decode step and its LM head. Bound by reading the weight, so each weight row is read from
// memory once and dotted with every row of x while it is in L1.
//
// Up to kStreamRows rows of x: one weight row at a time (a single sequential stream), with the
// rows of x four at a time, and a software prefetch of the weight 8 KB ahead into L2: faster
// than interleaving four weight rows, whose compute stops overlapping its memory reads once the
// hardware prefetcher falls behind (`python -m bench.kernels.lm_head`). Past that, compute
// dominates and the 4x2 register tile below does better; an fp32 or bf16 weight on AVX-512 goes
// to the sixteen-lane 4x4 tile past kWideStreamRows.
//
// The weight may be fp32, bf16 or int8 (weights.hpp); an int8 row's sums are scaled once at the end.
#pragma once
#include <type_traits>
#include <vector>

#include "simd.hpp"
#include "team.hpp"
#include "weights.hpp"

namespace prelude_cpu {

constexpr long kStreamRows = 8;
// Where the sixteen-lane tile below runs (an fp32 or bf16 weight on AVX-512), it is faster than
// the stream from five rows on: on Qwen3's head at five rows 14.3 against 15.8-17.2 ms in fp32,
// 7.4-10.0 against 9.9-11.2 in bf16 (`python -m bench.kernels.lm_head`).
constexpr long kWideStreamRows = 4;

// Output v's sum, scaled for an int8 weight.
template <typename T>
__attribute__((always_inline)) static inline float scaled(float sum, const float* scales, long v) {
    if constexpr (std::is_same<T, int8_t>::value) return sum * scales[v];
    return sum;
}

// Row v's dot product with x over the groups of [h_begin, hidden), added to the accumulators.
template <typename T, int N>
__attribute__((always_inline)) static inline void dot_groups(const T* row, const float* const* xs, long h_begin,
                                                             long hidden, v8f* acc) {
    constexpr long kVectors = Widen<T>::kElems / 8;
    for (long h = h_begin; h + Widen<T>::kElems <= hidden; h += Widen<T>::kElems) {
        v8f w[kVectors];
        Widen<T>::load(row + h, w);
        for (long g = 0; g < kVectors; ++g)
            for (int i = 0; i < N; ++i) acc[i * 2 + (g & 1)] += w[g] * load8(xs[i] + h + 8 * g);
    }
}

// The last 8 of an fp32 row whose length is an odd multiple of 8 (the narrow formats' rows are
// whole groups).
template <typename T, int N>
__attribute__((always_inline)) static inline void dot_tail(const T* row, const float* const* xs, long hidden,
                                                           v8f* acc) {
    if constexpr (std::is_same<T, float>::value)
        if (hidden % 16 != 0)
            for (int i = 0; i < N; ++i) acc[i * 2] += load8(row + hidden - 8) * load8(xs[i] + hidden - 8);
}

// Weight row v against N consecutive rows of x in one pass (two accumulators per row of x, each
// row's sums in the same order whatever N is): out[r * vocab + v] for r < N.
template <typename T, int N>
__attribute__((always_inline)) static inline void stream_dot(const T* row, const float* x, long hidden, float* out,
                                                             long vocab, long v, const float* scales) {
    const float* xs[N];
    for (int r = 0; r < N; ++r) xs[r] = x + r * hidden;
    v8f acc[2 * N] = {};
    dot_groups<T, N>(row, xs, 0, hidden, acc);
    dot_tail<T, N>(row, xs, hidden, acc);
    for (int r = 0; r < N; ++r) out[r * vocab + v] = scaled<T>(hsum(acc[2 * r] + acc[2 * r + 1]), scales, v);
}

template <typename T>
__attribute__((always_inline)) static inline void stream_rows_body(const float* x, long n, const void* weight,
                                                                   const float* scales, long hidden, float* out,
                                                                   long vocab, long v_begin, long v_end) {
    const T* w = static_cast<const T*>(weight);
    for (long v = v_begin; v < v_end; ++v) {
        const T* row = w + v * hidden;
        // prefetcht2 (into L2): prefetching into L1 this far ahead evicted the rows of x.
        const char* ahead = (const char*)row + kPrefetchAheadBytes;
        for (long b = 0; b < hidden * (long)sizeof(T); b += 64) __builtin_prefetch(ahead + b, 0, 1);
        long i = 0;
        for (; i + 4 <= n; i += 4) stream_dot<T, 4>(row, x + i * hidden, hidden, out + i * vocab, vocab, v, scales);
        // The last one to three rows in one pass too: a pass per row of x made the chains of
        // dependent sums outlast the weight's stream.
        switch (n - i) {
            case 3: stream_dot<T, 3>(row, x + i * hidden, hidden, out + i * vocab, vocab, v, scales); break;
            case 2: stream_dot<T, 2>(row, x + i * hidden, hidden, out + i * vocab, vocab, v, scales); break;
            case 1: stream_dot<T, 1>(row, x + i * hidden, hidden, out + i * vocab, vocab, v, scales); break;
        }
    }
}

// More rows: four weight rows by two x rows at a time (eight vector accumulators, which fit the
// sixteen AVX2 registers beside the operands).
// dot_rows_body's step along a row: 8 floats (one vector per row keeps its 4x2 tile and
// operands within the sixteen registers), or one group of a narrow format.
template <typename T>
struct RowStep {
    static constexpr long kElems = Widen<T>::kElems;
    __attribute__((always_inline)) static inline void load(const T* p, v8f* v) { Widen<T>::load(p, v); }
};

template <>
struct RowStep<float> {
    static constexpr long kElems = 8;
    __attribute__((always_inline)) static inline void load(const float* p, v8f* v) { v[0] = load8(p); }
};

// More rows: four weight rows by two x rows at a time (eight vector accumulators, which fit the
// sixteen AVX2 registers beside the operands).
template <typename T>
__attribute__((always_inline)) static inline void dot_rows_body(const float* x, long n, const void* weight,
                                                                const float* scales, long hidden, float* out,
                                                                long vocab, long v_begin, long v_end) {
    const T* w = static_cast<const T*>(weight);
    constexpr long kStep = RowStep<T>::kElems, kVectors = kStep / 8;
    constexpr long kStepBytes = 4 * kStep * (long)sizeof(T);  // of the next four rows, per step
    long v = v_begin;
    for (; v + 4 <= v_end; v += 4) {
        const T* rows[4] = {w + v * hidden, w + (v + 1) * hidden, w + (v + 2) * hidden, w + (v + 3) * hidden};
        // The next four rows, as many cache lines per step of the first pass as the step reads of
        // these: without it the four interleaved streams ran at two thirds of the machine's read speed.
        const char* next = (const char*)(rows[3] + hidden);
        for (long i = 0; i < n; i += 2) {
            const bool pair = i + 1 < n;
            const float* xa = x + i * hidden;
            const float* xb = pair ? xa + hidden : xa;
            v8f a[4] = {}, b[4] = {};
            for (long h = 0; h < hidden; h += kStep) {
                if (i == 0)
                    for (long line = 0; line < kStepBytes; line += 64)
                        __builtin_prefetch(next + h / kStep * kStepBytes + line);
                for (int r = 0; r < 4; ++r) {
                    v8f wv[kVectors];
                    RowStep<T>::load(rows[r] + h, wv);
                    for (long g = 0; g < kVectors; ++g) {  // x's loads hit L1 for every r
                        a[r] += wv[g] * load8(xa + h + 8 * g);
                        b[r] += wv[g] * load8(xb + h + 8 * g);
                    }
                }
            }
            for (int r = 0; r < 4; ++r) {
                out[i * vocab + v + r] = scaled<T>(hsum(a[r]), scales, v + r);
                if (pair) out[(i + 1) * vocab + v + r] = scaled<T>(hsum(b[r]), scales, v + r);
            }
        }
    }
    for (; v < v_end; ++v) {
        const T* row = w + v * hidden;
        for (long i = 0; i < n; ++i) {
            const float* xs[1] = {x + i * hidden};
            v8f acc[2] = {};
            dot_groups<T, 1>(row, xs, 0, hidden, acc);
            dot_tail<T, 1>(row, xs, hidden, acc);
            out[i * vocab + v] = scaled<T>(hsum(acc[0] + acc[1]), scales, v);
        }
    }
}

#define PRELUDE_ROWS_PARAMS                                                                                    \
    (const float* x, long n, const void* weight, const float* scales, long hidden, float* out, long vocab, \
     long v_begin, long v_end)
#define PRELUDE_ROWS_ARGS (x, n, weight, scales, hidden, out, vocab, v_begin, v_end)
PRELUDE_FORMAT_VARIANTS(stream_rows, stream_rows_body, PRELUDE_ROWS_PARAMS, PRELUDE_ROWS_ARGS)
PRELUDE_FORMAT_VARIANTS(dot_rows, dot_rows_body, PRELUDE_ROWS_PARAMS, PRELUDE_ROWS_ARGS)
#undef PRELUDE_ROWS_PARAMS
#undef PRELUDE_ROWS_ARGS

#if defined(__x86_64__) && defined(__GNUC__)
typedef float v4f __attribute__((vector_size(16)));

// The sums of four vectors, in order: a tree of ten shuffles for the four, where reducing each
// alone takes four shuffles (each on the port that also runs half the multiply-adds).
__attribute__((always_inline)) static inline v4f hsum4x16(v16f a, v16f b, v16f c, v16f d) {
    const v16f ab = __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                    __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    const v16f cd = __builtin_shufflevector(c, d, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                    __builtin_shufflevector(c, d, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    // Four partial sums of a, then of b, of c, of d.
    const v16f q = __builtin_shufflevector(ab, cd, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
                   __builtin_shufflevector(ab, cd, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    const v8f e = __builtin_shufflevector(q, q, 0, 1, 4, 5, 8, 9, 12, 13) +
                  __builtin_shufflevector(q, q, 2, 3, 6, 7, 10, 11, 14, 15);
    return __builtin_shufflevector(e, e, 0, 2, 4, 6) + __builtin_shufflevector(e, e, 1, 3, 5, 7);
}

// A weight row's elements for the sixteen-lane tile: kElems of them as kVectors vectors, in the
// order x16 (below) lays x out in. fp32: sixteen in order. bf16: two interleaved groups
// (weights.hpp), whose 16 lanes widen to elements 0-7 and 16-23 (low halves), then 8-15 and 24-31.
template <typename T>
struct Wide16;

template <>
struct Wide16<float> {
    static constexpr long kElems = 16, kVectors = 1;
    __attribute__((always_inline)) static inline void load(const float* p, v16f* v) { v[0] = load_lanes<v16f>(p); }
};

template <>
struct Wide16<bf16> {
    static constexpr long kElems = 32, kVectors = 2;
    __attribute__((always_inline)) static inline void load(const bf16* p, v16f* v) { widen_bf16_pairs(p, v); }
};

// x's rows in the order Wide16<bf16> widens a weight row's elements in (fp32 weights take x as it is).
static std::vector<float> x16_bf16(const float* x, long n, long hidden) {
    std::vector<float> out(n * hidden);
    for (long at = 0; at < n * hidden; at += 32)
        for (long k = 0; k < 8; ++k) {
            out[at + k] = x[at + k];
            out[at + 8 + k] = x[at + 16 + k];
            out[at + 16 + k] = x[at + 8 + k];
            out[at + 24 + k] = x[at + 24 + k];
        }
    return out;
}

// A weight by rows (fp32, or bf16 widened) against more than kWideStreamRows rows on AVX-512:
// four weight rows by four rows of x, sixteen lanes a vector, sixteen of the thirty-two vector
// registers accumulating. The eight-lane tile above computes at half the width, and past about
// sixteen rows MKL's GEMM beat it on an AVX-512 machine (`python -m bench.kernels.lm_head`).
// x16: x in Wide16<T>'s order; x itself goes to the eight-lane tile with the last rows of a range
// that are not four. hidden must be a multiple of Wide16<T>::kElems.
template <typename T>
__attribute__((always_inline)) static inline void dot_rows16_body(const float* x, const float* x16, long n,
                                                                  const T* w, long hidden, float* out, long vocab,
                                                                  long v_begin, long v_end) {
    constexpr long kElems = Wide16<T>::kElems, kVectors = Wide16<T>::kVectors;
    long v = v_begin;
    for (; v + 4 <= v_end; v += 4) {
        const T* rows[4] = {w + v * hidden, w + (v + 1) * hidden, w + (v + 2) * hidden, w + (v + 3) * hidden};
        const char* next = (const char*)(rows[3] + hidden);  // the next four rows, fetched by the first tile
        for (long i = 0; i < n; i += 4) {
            const float* xs[4];
            for (int r = 0; r < 4; ++r) xs[r] = x16 + (i + r < n ? i + r : n - 1) * hidden;  // a short tile repeats
            v16f acc[4][4] = {};
            for (long h = 0; h < hidden; h += kElems) {
                if (i == 0)  // four rows' bytes of this step: 256 for either format
                    for (long line = 0; line < 4 * kElems * (long)sizeof(T); line += 64)
                        __builtin_prefetch(next + 4 * h * (long)sizeof(T) + line);
                v16f wv[4][kVectors];
                for (int c = 0; c < 4; ++c) Wide16<T>::load(rows[c] + h, wv[c]);
                for (int r = 0; r < 4; ++r)
                    for (long g = 0; g < kVectors; ++g) {
                        const v16f xv = load_lanes<v16f>(xs[r] + h + 16 * g);
                        for (int c = 0; c < 4; ++c) acc[r][c] += wv[c][g] * xv;
                    }
            }
            for (int r = 0; r < 4 && i + r < n; ++r) {
                const v4f sums = hsum4x16(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
                std::memcpy(out + (i + r) * vocab + v, &sums, sizeof(sums));
            }
        }
    }
    if (v < v_end)
        by_format(std::is_same<T, float>::value ? kF32 : kBF16, run_dot_rows_f32, run_dot_rows_bf16, run_dot_rows_i8,
                  x, n, static_cast<const void*>(w), nullptr, hidden, out, vocab, v, v_end);
}

// A weight by rows (fp32, or bf16 widened) against one to kWideStreamRows rows on AVX-512: the
// stream above at sixteen lanes, two accumulators per row of x. x16 as for dot_rows16_body. Four
// rows of an fp32 weight stay on the eight-lane stream, which reads them as fast; for fewer rows,
// and a bf16 weight's, the wide one took a fifth to a third off Qwen3's head
// (`python -m bench.kernels.lm_head`).
constexpr long kWide16StreamRowsF32 = 3;

template <typename T, int N>
__attribute__((always_inline)) static inline void stream16_dot(const T* row, const float* x16, long hidden,
                                                               float* out, long vocab, long v) {
    constexpr long kElems = Wide16<T>::kElems, kVectors = Wide16<T>::kVectors;
    v16f acc[N][2] = {};
    long h = 0;
    for (; h + 2 * kElems <= hidden; h += 2 * kElems) {
        v16f a[kVectors], b[kVectors];
        Wide16<T>::load(row + h, a);
        Wide16<T>::load(row + h + kElems, b);
        for (long g = 0; g < kVectors; ++g)
            for (int r = 0; r < N; ++r) {
                acc[r][0] += a[g] * load_lanes<v16f>(x16 + r * hidden + h + 16 * g);
                acc[r][1] += b[g] * load_lanes<v16f>(x16 + r * hidden + h + kElems + 16 * g);
            }
    }
    if (h < hidden) {
        v16f a[kVectors];
        Wide16<T>::load(row + h, a);
        for (long g = 0; g < kVectors; ++g)
            for (int r = 0; r < N; ++r) acc[r][g & 1] += a[g] * load_lanes<v16f>(x16 + r * hidden + h + 16 * g);
    }
    for (int r = 0; r < N; ++r) {
        const v16f sum = acc[r][0] + acc[r][1];
        out[r * vocab + v] = hsum(__builtin_shufflevector(sum, sum, 0, 1, 2, 3, 4, 5, 6, 7) +
                                  __builtin_shufflevector(sum, sum, 8, 9, 10, 11, 12, 13, 14, 15));
    }
}

template <typename T>
__attribute__((always_inline)) static inline void stream16_body(const float* x16, long n, const T* w, long hidden,
                                                                float* out, long vocab, long v_begin, long v_end) {
    for (long v = v_begin; v < v_end; ++v) {
        const T* row = w + v * hidden;
        const char* ahead = (const char*)row + kPrefetchAheadBytes;  // into L2, as the stream above
        for (long b = 0; b < hidden * (long)sizeof(T); b += 64) __builtin_prefetch(ahead + b, 0, 1);
        switch (n) {
            case 4: stream16_dot<T, 4>(row, x16, hidden, out, vocab, v); break;
            case 3: stream16_dot<T, 3>(row, x16, hidden, out, vocab, v); break;
            case 2: stream16_dot<T, 2>(row, x16, hidden, out, vocab, v); break;
            default: stream16_dot<T, 1>(row, x16, hidden, out, vocab, v); break;
        }
    }
}

__attribute__((target("avx512f"))) static void stream16_f32(const float* x16, long n, const float* w, long hidden,
                                                            float* out, long vocab, long v_begin, long v_end) {
    stream16_body<float>(x16, n, w, hidden, out, vocab, v_begin, v_end);
}

__attribute__((target("avx512f"))) static void stream16_bf16(const float* x16, long n, const bf16* w, long hidden,
                                                             float* out, long vocab, long v_begin, long v_end) {
    stream16_body<bf16>(x16, n, w, hidden, out, vocab, v_begin, v_end);
}

__attribute__((target("avx512f"))) static void dot_rows16_f32(const float* x, const float* x16, long n,
                                                              const float* w, long hidden, float* out, long vocab,
                                                              long v_begin, long v_end) {
    dot_rows16_body<float>(x, x16, n, w, hidden, out, vocab, v_begin, v_end);
}

__attribute__((target("avx512f"))) static void dot_rows16_bf16(const float* x, const float* x16, long n,
                                                               const bf16* w, long hidden, float* out, long vocab,
                                                               long v_begin, long v_end) {
    dot_rows16_body<bf16>(x, x16, n, w, hidden, out, vocab, v_begin, v_end);
}

// Whether the sixteen-lane tile takes a weight of this format and row length on this CPU.
static inline bool wide_rows(long format, long hidden) {
    return ((format == kF32 && hidden % 16 == 0) || (format == kBF16 && hidden % 32 == 0)) && has_avx512f();
}
#endif

// `w`: a weight by rows. hidden must be a multiple of 8 (the caller checks). The vocabulary is
// split into up to `threads` ranges of whole four-row groups (one for a small weight).
static void skinny_gemm(const float* x, long n, const Weight& w, long hidden, float* out, long vocab, int threads) {
    const long floats = vocab * hidden * format_bytes(w.format) / 4;
#if defined(__x86_64__) && defined(__GNUC__)
    const bool wide = wide_rows(w.format, hidden);
    std::vector<float> x16;  // x in a bf16 weight's widened order (wide_rows only)
    if (wide && w.format == kBF16) x16 = x16_bf16(x, n, hidden);
#else
    const bool wide = false;
#endif
    parallel_ranges(vocab, threads_worth(floats, threads), 4, [&](long begin, long end) {
#if defined(__x86_64__) && defined(__GNUC__)
        if (wide && n <= kWide16StreamRowsF32 && w.format == kF32)
            stream16_f32(x, n, static_cast<const float*>(w.data), hidden, out, vocab, begin, end);
        else if (wide && n <= kWideStreamRows && w.format == kBF16)
            stream16_bf16(x16.data(), n, static_cast<const bf16*>(w.data), hidden, out, vocab, begin, end);
        else
#endif
        if (n <= (wide ? kWideStreamRows : kStreamRows))
            by_format(w.format, run_stream_rows_f32, run_stream_rows_bf16, run_stream_rows_i8, x, n, w.data, w.scales,
                      hidden, out, vocab, begin, end);
#if defined(__x86_64__) && defined(__GNUC__)
        else if (wide && w.format == kF32)
            dot_rows16_f32(x, x, n, static_cast<const float*>(w.data), hidden, out, vocab, begin, end);
        else if (wide)
            dot_rows16_bf16(x, x16.data(), n, static_cast<const bf16*>(w.data), hidden, out, vocab, begin, end);
#endif
        else
            by_format(w.format, run_dot_rows_f32, run_dot_rows_bf16, run_dot_rows_i8, x, n, w.data, w.scales, hidden,
                      out, vocab, begin, end);
    });
}

}  // namespace prelude_cpu
