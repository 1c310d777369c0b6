// Logprobs read straight from fp32 logits rows on the CPU: per row the logprob and rank of one
// token and the `top` most likely tokens, with no log-softmax tensor the size of the logits.
// torch's way (log_softmax, a >= comparison summed for the rank, topk) makes four passes and two
// [rows, vocab] temporaries: over a 152K vocabulary about a quarter of a 512-token
// prompt_logprobs step on a 103M-parameter model. This reads a row two times, three with `top`.
//
// A logprob is (logit - max) - log(sum of e^(logit - max)) in float, as torch computes it; the
// rank counts the tokens whose logit is at least the token's (itself included, as vLLM counts),
// which orders them as their logprobs do. Of equal logits the lower token id comes first.
#pragma once
#include <cmath>
#include <vector>

#include "simd.hpp"
#include "team.hpp"

namespace prelude_cpu {

struct LogprobRows {
    const float* logits;  // [rows, vocab], row-major with row_stride
    long rows, vocab, row_stride;
    const long* targets;  // [rows]: the token each row reports
    long top;             // the most likely tokens each row lists (0: none)
    float* logprobs;      // [rows]: the target's logprob
    long* ranks;          // [rows]: tokens at least as likely as the target, itself included
    long* top_ids;        // [rows, top], most likely first; -1 past the row's finite logits
    float* top_logprobs;  // [rows, top]; -inf past the row's finite logits
};

__attribute__((always_inline)) static inline void logprob_row_body(const LogprobRows& p, long r,
                                                                    std::vector<float>& best,
                                                                    std::vector<long>& best_ids) {
    const float* x = p.logits + r * p.row_stride;
    const long vocab = p.vocab;
    const float top = max_of(x, vocab);
    long j;

    // The sum runs in float within blocks of 512 entries and in double across them: a float
    // total over a whole row drifts by 1e-5 of itself (a 152K vocabulary), as much in its log.
    const float target = x[p.targets[r]];
    const v8f shift = splat(top), at_least = splat(target), floor = splat(-87.0f), zero = {};
    double sum = 0.0;
    v8i count8 = {};
    for (j = 0; j + 8 <= vocab;) {
        v8f sum8 = {};
        for (const long end = j + 512 < vocab ? j + 512 : vocab; j + 8 <= end; j += 8) {
            const v8f v = load8(x + j), d = v - shift;
            sum8 += d < floor ? zero : exp8(d);  // exp8 clamps at -87: a -inf logit adds nothing
            count8 -= v >= at_least;             // a true lane is -1
        }
        sum += hsum(sum8);
    }
    long rank = 0;
    for (long k = 0; k < 8; ++k) rank += count8[k];
    for (; j < vocab; ++j) {
        sum += x[j] - top < -87.0f ? 0.0f : std::exp(x[j] - top);
        rank += x[j] >= target;
    }
    const float log_sum = (float)std::log(sum);
    p.logprobs[r] = (target - top) - log_sum;
    p.ranks[r] = rank;
    if (p.top <= 0) return;

    // The best `top` logits so far, best first; a lane enters only above the last of them.
    best.assign(p.top, -INFINITY);
    best_ids.assign(p.top, -1);
    float last = -INFINITY;
    auto offer = [&](long k) {
        long at = p.top - 1;
        while (at > 0 && x[k] > best[at - 1]) {
            best[at] = best[at - 1];
            best_ids[at] = best_ids[at - 1];
            --at;
        }
        best[at] = x[k];
        best_ids[at] = k;
        last = best[p.top - 1];
    };
    for (j = 0; j + 8 <= vocab; j += 8) {
        if (any_lane(load8(x + j) > splat(last)))
            for (long k = j; k < j + 8; ++k)
                if (x[k] > last) offer(k);
    }
    for (; j < vocab; ++j)
        if (x[j] > last) offer(j);
    for (long k = 0; k < p.top; ++k) {
        p.top_ids[r * p.top + k] = best_ids[k];
        p.top_logprobs[r * p.top + k] = best_ids[k] < 0 ? -INFINITY : (best[k] - top) - log_sum;
    }
}

__attribute__((always_inline)) static inline void logprob_range_body(const LogprobRows& p, long first, long last) {
    std::vector<float> best;
    std::vector<long> best_ids;
    for (long r = first; r < last; ++r) logprob_row_body(p, r, best, best_ids);
}

PRELUDE_CPU_VARIANTS(logprob_range, (const LogprobRows& p, long first, long last), (p, first, last))

static void logprob_rows(const LogprobRows& p, int threads) {
    parallel_ranges(p.rows, threads_worth(p.rows * p.vocab, threads), 1,
                    [&](long first, long last) { run_logprob_range(p, first, last); });
}

}  // namespace prelude_cpu
