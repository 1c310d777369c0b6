// out[n, V] = x[n, H] . w[V, H]^T for a few rows of x against a large weight: the LM head of a
// decode step. Each weight row is read from memory once and dotted with every row of x while it
// is in L1, four weight rows by two x rows at a time (eight vector accumulators, which fit the
// sixteen AVX2 registers beside the operands). Vocabulary ranges run on std::threads.
#pragma once
#include "simd.hpp"

namespace prelude_cpu {

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

// hidden must be a multiple of 8 (the caller checks). The vocabulary is split into `threads`
// ranges of whole four-row groups.
static void skinny_gemm(const float* x, long n, const float* w, long hidden, float* out, long vocab,
                        int threads) {
    parallel_ranges(vocab, threads, 4, [&](long begin, long end) { run_dot_rows(x, n, w, hidden, out, vocab, begin, end); });
}

}  // namespace prelude_cpu
