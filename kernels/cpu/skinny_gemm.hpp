// out[n, V] = x[n, H] . w[V, H]^T for a few rows of x against a large weight: every linear layer
// of a decode step and its LM head. Bound by reading the weight, so each weight row is read from
// memory once and dotted with every row of x while it is in L1.
//
// Up to kStreamRows rows of x: one weight row at a time (a single sequential stream), with the
// rows of x four at a time, and a software prefetch of the weight 8 KB ahead into L2: faster
// than interleaving four weight rows, whose compute stops overlapping its memory reads once the
// hardware prefetcher falls behind (`python -m bench.kernels.lm_head`). Past that, compute
// dominates and the 4x2 register tile below does better.
#pragma once
#include "simd.hpp"
#include "team.hpp"

namespace prelude_cpu {

constexpr long kStreamRows = 8;
constexpr long kPrefetchFloats = 2048;  // 8 KB ahead

__attribute__((always_inline)) static inline void stream_rows_body(const float* x, long n, const float* w, long hidden, float* out,
                                                                    long vocab, long v_begin, long v_end) {
    for (long v = v_begin; v < v_end; ++v) {
        const float* row = w + v * hidden;
        // prefetcht2 (into L2): prefetching into L1 this far ahead evicted the rows of x.
        for (long h = 0; h < hidden; h += 16) __builtin_prefetch(row + kPrefetchFloats + h, 0, 1);
        long i = 0;
        for (; i + 4 <= n; i += 4) {
            const float* x0 = x + i * hidden;
            const float* x1 = x0 + hidden;
            const float* x2 = x1 + hidden;
            const float* x3 = x2 + hidden;
            v8f a0 = {}, a1 = {}, a2 = {}, a3 = {}, c0 = {}, c1 = {}, c2 = {}, c3 = {};
            long h = 0;
            for (; h + 16 <= hidden; h += 16) {
                const v8f r = load8(row + h), s = load8(row + h + 8);
                a0 += r * load8(x0 + h); a1 += r * load8(x1 + h); a2 += r * load8(x2 + h); a3 += r * load8(x3 + h);
                c0 += s * load8(x0 + h + 8); c1 += s * load8(x1 + h + 8); c2 += s * load8(x2 + h + 8); c3 += s * load8(x3 + h + 8);
            }
            if (h < hidden) {  // hidden % 16 == 8
                const v8f r = load8(row + h);
                a0 += r * load8(x0 + h); a1 += r * load8(x1 + h); a2 += r * load8(x2 + h); a3 += r * load8(x3 + h);
            }
            out[i * vocab + v] = hsum(a0 + c0);
            out[(i + 1) * vocab + v] = hsum(a1 + c1);
            out[(i + 2) * vocab + v] = hsum(a2 + c2);
            out[(i + 3) * vocab + v] = hsum(a3 + c3);
        }
        for (; i < n; ++i) {
            const float* x0 = x + i * hidden;
            v8f a0 = {}, c0 = {};
            long h = 0;
            for (; h + 16 <= hidden; h += 16) {
                a0 += load8(row + h) * load8(x0 + h);
                c0 += load8(row + h + 8) * load8(x0 + h + 8);
            }
            if (h < hidden) a0 += load8(row + h) * load8(x0 + h);
            out[i * vocab + v] = hsum(a0 + c0);
        }
    }
}

PRELUDE_CPU_VARIANTS(stream_rows, (const float* x, long n, const float* w, long hidden, float* out, long vocab, long v_begin, long v_end),
                     (x, n, w, hidden, out, vocab, v_begin, v_end))

// More rows: four weight rows by two x rows at a time (eight vector accumulators, which fit the
// sixteen AVX2 registers beside the operands).
__attribute__((always_inline)) static inline void dot_rows_body(const float* x, long n, const float* w, long hidden, float* out, long vocab,
                     long v_begin, long v_end) {
    long v = v_begin;
    for (; v + 4 <= v_end; v += 4) {
        const float* w0 = w + v * hidden;
        const float* w1 = w0 + hidden;
        const float* w2 = w1 + hidden;
        const float* w3 = w2 + hidden;
        // The next four rows, two cache lines per step of the first pass: without it the
        // four interleaved streams ran at two thirds of the machine's read speed.
        const float* next = w3 + hidden;
        long i = 0;
        for (; i + 2 <= n; i += 2) {
            const float* xa = x + i * hidden;
            const float* xb = xa + hidden;
            v8f a0 = {}, a1 = {}, a2 = {}, a3 = {}, b0 = {}, b1 = {}, b2 = {}, b3 = {};
            for (long h = 0; h < hidden; h += 8) {
                if (i == 0) { __builtin_prefetch(next + 4 * h); __builtin_prefetch(next + 4 * h + 16); }
                v8f p = load8(xa + h), q = load8(xb + h);
                v8f r0 = load8(w0 + h), r1 = load8(w1 + h), r2 = load8(w2 + h), r3 = load8(w3 + h);
                a0 += r0 * p; a1 += r1 * p; a2 += r2 * p; a3 += r3 * p;
                b0 += r0 * q; b1 += r1 * q; b2 += r2 * q; b3 += r3 * q;
            }
            float* oa = out + i * vocab + v;
            float* ob = oa + vocab;
            oa[0] = hsum(a0); oa[1] = hsum(a1); oa[2] = hsum(a2); oa[3] = hsum(a3);
            ob[0] = hsum(b0); ob[1] = hsum(b1); ob[2] = hsum(b2); ob[3] = hsum(b3);
        }
        for (; i < n; ++i) {
            const float* xa = x + i * hidden;
            v8f a0 = {}, a1 = {}, a2 = {}, a3 = {};
            for (long h = 0; h < hidden; h += 8) {
                if (i == 0) { __builtin_prefetch(next + 4 * h); __builtin_prefetch(next + 4 * h + 16); }
                v8f p = load8(xa + h);
                a0 += load8(w0 + h) * p; a1 += load8(w1 + h) * p;
                a2 += load8(w2 + h) * p; a3 += load8(w3 + h) * p;
            }
            float* oa = out + i * vocab + v;
            oa[0] = hsum(a0); oa[1] = hsum(a1); oa[2] = hsum(a2); oa[3] = hsum(a3);
        }
    }
    for (; v < v_end; ++v) {
        const float* wr = w + v * hidden;
        for (long i = 0; i < n; ++i) {
            const float* xa = x + i * hidden;
            v8f a = {};
            for (long h = 0; h < hidden; h += 8) a += load8(wr + h) * load8(xa + h);
            out[i * vocab + v] = hsum(a);
        }
    }
}

PRELUDE_CPU_VARIANTS(dot_rows, (const float* x, long n, const float* w, long hidden, float* out, long vocab, long v_begin, long v_end),
                     (x, n, w, hidden, out, vocab, v_begin, v_end))

// hidden must be a multiple of 8 (the caller checks). The vocabulary is split into up to
// `threads` ranges of whole four-row groups (one for a small weight).
static void skinny_gemm(const float* x, long n, const float* w, long hidden, float* out, long vocab,
                        int threads) {
    parallel_ranges(vocab, threads_worth(vocab * hidden, threads), 4, [&](long begin, long end) {
        if (n <= kStreamRows) run_stream_rows(x, n, w, hidden, out, vocab, begin, end);
        else run_dot_rows(x, n, w, hidden, out, vocab, begin, end);
    });
}

}  // namespace prelude_cpu
