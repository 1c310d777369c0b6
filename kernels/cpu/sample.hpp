// Draws one token per row from softmax(logits / temperature) by inverse CDF, fp32 logits on the
// CPU: one uniform per row, no per-entry noise, no tensor the size of the vocabulary. Torch's
// version is half a dozen ops over [rows, vocab] (softmax, a float64 copy, cumsum,
// searchsorted) on torch's OpenMP threads, whose spinning after each op holds the core the next
// native kernel wants (`python -m bench.kernels.decode_step`).
//
// A row may cut first (min-p, top-k, top-p: sample_cuts.hpp); the draw then runs over the masses
// the cuts keep, as torch's over its masked logits.
//
// Exactness: the cumulative mass runs in float64 over blocks of kBlock entries (each block summed
// in float), and the search skips whole blocks by their sums, then walks one entry by entry in
// float64; an entry of zero mass (a -inf logit) can never be the one drawn.
#pragma once
#include <cmath>
#include <vector>

#include "sample_cuts.hpp"
#include "simd.hpp"
#include "team.hpp"

namespace prelude_cpu {

constexpr long kBlock = 64;

struct SampleRows {
    const float* logits;           // [rows, vocab], row-major with row_stride
    long rows, vocab, row_stride;
    const float* inv_temperature;  // [rows]
    const double* uniforms;        // [rows], in [0, 1)
    long* out;                     // [rows]
    // Each row's cuts, or null where no row makes that cut: min_p (0: none), top_k (<= 0: none),
    // top_p (>= 1: none).
    const float* min_p;
    const long* top_k;
    const float* top_p;
};

__attribute__((always_inline)) static inline void sample_row_body(const float* logits, long vocab, float inv_t,
                                                                   double u, float min_p, long top_k, float top_p,
                                                                   long* out, std::vector<float>& mass,
                                                                   std::vector<double>& block_sums,
                                                                   std::vector<float>& scratch,
                                                                   std::vector<long>& kept) {
    const float top = max_of(logits, vocab);
    long j;
    if (top_k > 0 && top_k < vocab) {  // the masses of the few tokens kept, not of the vocabulary
        const long chosen = top_k_draw(logits, vocab, top, inv_t, u, min_p, top_k, top_p, scratch, mass, kept);
        if (chosen >= 0) {
            *out = chosen;
            return;
        }
    }
    mass.resize(vocab);
    const long blocks = (vocab + kBlock - 1) / kBlock;
    block_sums.resize(blocks);
    const v8f scale = v8f{} + inv_t, shift = v8f{} + top * inv_t, floor = v8f{} - 87.0f, zero = {};
    double total = 0.0;
    for (long b = 0; b < blocks; ++b) {
        const long begin = b * kBlock, end = begin + kBlock < vocab ? begin + kBlock : vocab;
        // A block's sum in float (its own entries only, so no entry is lost beside a large
        // running total), the running total in float64.
        v8f sum8 = {};
        float sum = 0.0f;
        for (j = begin; j + 8 <= end; j += 8) {
            const v8f x = load8(logits + j) * scale - shift;
            const v8f e = x < floor ? zero : exp8(x);  // exp8 clamps at -87: a -inf logit gets no mass
            store8(mass.data() + j, e);
            sum8 += e;
        }
        for (; j < end; ++j) {
            const float x = logits[j] * inv_t - top * inv_t;
            mass[j] = x < -87.0f ? 0.0f : std::exp(x);
            sum += mass[j];
        }
        block_sums[b] = (double)hsum(sum8) + sum;
        total += block_sums[b];
    }
    const float cut = min_p > 0.0f || top_p < 1.0f ? cut_floor(mass.data(), vocab, min_p, top_p, scratch) : 0.0f;
    if (cut > 0.0f) {  // the blocks summed again over the masses the cuts keep
        const v8f cut8 = splat(cut), zero8 = {};
        total = 0.0;
        for (long b = 0; b < blocks; ++b) {
            const long begin = b * kBlock, end = begin + kBlock < vocab ? begin + kBlock : vocab;
            v8f sum8 = {};
            float sum = 0.0f;
            for (j = begin; j + 8 <= end; j += 8) {
                const v8f m = load8(mass.data() + j);
                sum8 += m >= cut8 ? m : zero8;
            }
            for (; j < end; ++j) sum += mass[j] >= cut ? mass[j] : 0.0f;
            block_sums[b] = (double)hsum(sum8) + sum;
            total += block_sums[b];
        }
    }
    const double target = u * total;
    double seen = 0.0;
    long b = 0;
    while (b + 1 < blocks && seen + block_sums[b] <= target) seen += block_sums[b++];
    const long begin = b * kBlock, end = begin + kBlock < vocab ? begin + kBlock : vocab;
    long chosen = -1;
    for (long j = begin; j < end; ++j) {
        if (mass[j] == 0.0f || mass[j] < cut) continue;  // no mass, or cut
        chosen = j;  // the last entry with mass, if rounding leaves the target past the block
        seen += mass[j];
        if (seen > target) break;
    }
    if (chosen < 0)  // a block of no mass (only when every logit is -inf): the best logit
        for (long j = 0; j < vocab && chosen < 0; ++j) chosen = logits[j] == top ? j : -1;
    *out = chosen;
}

__attribute__((always_inline)) static inline void sample_range_body(const SampleRows& s, long first, long last) {
    std::vector<float> mass, scratch;
    std::vector<double> block_sums;
    std::vector<long> kept;
    for (long r = first; r < last; ++r)
        sample_row_body(s.logits + r * s.row_stride, s.vocab, s.inv_temperature[r], s.uniforms[r],
                        s.min_p ? s.min_p[r] : 0.0f, s.top_k ? s.top_k[r] : 0, s.top_p ? s.top_p[r] : 1.0f,
                        s.out + r, mass, block_sums, scratch, kept);
}

PRELUDE_CPU_VARIANTS(sample_range, (const SampleRows& s, long first, long last), (s, first, last))

static void sample_rows(const SampleRows& s, int threads) {
    parallel_ranges(s.rows, threads_worth(s.rows * s.vocab, threads), 1,
                    [&](long first, long last) { run_sample_range(s, first, last); });
}

// Each row's greedy token: the first index of its largest logit, torch.argmax's answer (a NaN
// counts as the largest; of equal values the first wins). torch's CPU argmax compares one entry
// at a time, about 190 us over a 152K vocabulary on the dev VM, paid by every greedy row of every
// step; two vector passes (the largest value, then where it first is) take a tenth of that.
struct GreedyRows {
    const float* logits;  // [rows, vocab], row-major with row_stride
    long rows, vocab, row_stride;
    long* out;            // [rows]
};

__attribute__((always_inline)) static inline long greedy_row_body(const float* logits, long vocab) {
    v8f top8 = splat(-INFINITY);
    v8i nan8 = {};
    long j = 0;
    for (; j + 8 <= vocab; j += 8) {
        const v8f x = load8(logits + j);
        nan8 |= x != x;
        top8 = x > top8 ? x : top8;
    }
    float top = -INFINITY;
    bool nan = false;
    for (long k = 0; k < 8; ++k) {
        top = top8[k] > top ? top8[k] : top;
        nan = nan || nan8[k];
    }
    for (long k = j; k < vocab; ++k) {
        top = logits[k] > top ? logits[k] : top;
        nan = nan || logits[k] != logits[k];
    }
    if (nan)
        for (long k = 0; k < vocab; ++k)
            if (logits[k] != logits[k]) return k;
    const v8f wanted = splat(top);  // every row has it: -inf when every logit is -inf
    for (j = 0; j + 8 <= vocab; j += 8) {
        if (any_lane(load8(logits + j) == wanted))
            for (long k = j;; ++k)
                if (logits[k] == top) return k;
    }
    for (; j < vocab; ++j)
        if (logits[j] == top) return j;
    return 0;  // an empty row
}

__attribute__((always_inline)) static inline void greedy_range_body(const GreedyRows& g, long first, long last) {
    for (long r = first; r < last; ++r) g.out[r] = greedy_row_body(g.logits + r * g.row_stride, g.vocab);
}

PRELUDE_CPU_VARIANTS(greedy_range, (const GreedyRows& g, long first, long last), (g, first, last))

static void greedy_rows(const GreedyRows& g, int threads) {
    parallel_ranges(g.rows, threads_worth(g.rows * g.vocab, threads), 1,
                    [&](long first, long last) { run_greedy_range(g, first, last); });
}

// Sets to -inf the logits a grammar forbids: bit t of a row's bitmask (32 tokens to a uint32 word,
// bit 0 first) is 0. One write over the forbidden entries; numpy's byte-table take and add wrote a
// float mask the size of the logits and read it back, about 1.5 ms for 16 rows of a 152K vocabulary.
struct MaskRows {
    float* logits;              // [*, vocab], row-major with row_stride
    long rows, vocab, row_stride;
    const uint32_t* bitmask;    // [rows, words]
    long words;
    const long* logits_rows;    // [rows]: the logits row each bitmask row masks
};

static void mask_rows(const MaskRows& m, int threads) {
    parallel_ranges(m.rows, threads_worth(m.rows * m.vocab, threads), 1, [&](long first, long last) {
        for (long r = first; r < last; ++r) {
            float* row = m.logits + m.logits_rows[r] * m.row_stride;
            const uint32_t* bits = m.bitmask + r * m.words;
            for (long w = 0; w < m.words && w * 32 < m.vocab; ++w) {
                const uint32_t word = bits[w];
                if (word == 0xFFFFFFFFu) continue;
                float* at = row + w * 32;
                const long n = m.vocab - w * 32 < 32 ? m.vocab - w * 32 : 32;
                if (word == 0) {
                    for (long b = 0; b < n; ++b) at[b] = -INFINITY;
                } else {
                    for (long b = 0; b < n; ++b)
                        if (!((word >> b) & 1u)) at[b] = -INFINITY;
                }
            }
        }
    });
}

}  // namespace prelude_cpu
