// out[n, V] = x[n, H] . w[V, H]^T for a few rows of x against a large weight: every linear layer
// of a decode step and its LM head. Bound by reading the weight, so each weight row is read from
// memory once and dotted with every row of x while it is in L1.
//
// Up to kStreamRows rows of x: one weight row at a time (a single sequential stream), with the
// rows of x four at a time, and a software prefetch of the weight 8 KB ahead into L2: faster
// than interleaving four weight rows, whose compute stops overlapping its memory reads once the
// hardware prefetcher falls behind (`python -m bench.kernels.lm_head`). Past that, compute
// dominates and the 4x2 register tile below does better.
//
// The weight may be fp32, bf16 or int8 (weights.hpp); an int8 row's sums are scaled once at the end.
#pragma once
#include <type_traits>

#include "simd.hpp"
#include "team.hpp"
#include "weights.hpp"

namespace prelude_cpu {

constexpr long kStreamRows = 8;

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
        for (; i + 4 <= n; i += 4) {
            const float* xs[4] = {x + i * hidden, x + (i + 1) * hidden, x + (i + 2) * hidden, x + (i + 3) * hidden};
            v8f acc[8] = {};
            dot_groups<T, 4>(row, xs, 0, hidden, acc);
            dot_tail<T, 4>(row, xs, hidden, acc);
            for (int r = 0; r < 4; ++r) out[(i + r) * vocab + v] = scaled<T>(hsum(acc[2 * r] + acc[2 * r + 1]), scales, v);
        }
        for (; i < n; ++i) {
            const float* xs[1] = {x + i * hidden};
            v8f acc[2] = {};
            dot_groups<T, 1>(row, xs, 0, hidden, acc);
            dot_tail<T, 1>(row, xs, hidden, acc);
            out[i * vocab + v] = scaled<T>(hsum(acc[0] + acc[1]), scales, v);
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

// `w`: a weight by rows. hidden must be a multiple of 8 (the caller checks). The vocabulary is
// split into up to `threads` ranges of whole four-row groups (one for a small weight).
static void skinny_gemm(const float* x, long n, const Weight& w, long hidden, float* out, long vocab, int threads) {
    const long floats = vocab * hidden * format_bytes(w.format) / 4;
    parallel_ranges(vocab, threads_worth(floats, threads), 4, [&](long begin, long end) {
        if (n <= kStreamRows)
            by_format(w.format, run_stream_rows_f32, run_stream_rows_bf16, run_stream_rows_i8, x, n, w.data, w.scales,
                      hidden, out, vocab, begin, end);
        else
            by_format(w.format, run_dot_rows_f32, run_dot_rows_bf16, run_dot_rows_i8, x, n, w.data, w.scales, hidden,
                      out, vocab, begin, end);
    });
}

}  // namespace prelude_cpu
