// The cuts a draw makes before it samples (vLLM's, in its order: min-p, then top-k, then top-p),
// as torch's sampler makes them on the tempered logits. Torch's version sorts the whole
// vocabulary for top-p, about 3 ms a row over 152K entries on the dev VM. Here a row with a top-k
// cut finds its k-th largest logit in one scan with a k-entry heap and computes the masses of only
// the tokens it keeps (ties with the k-th included, as torch's masked_fill(logits < kth) keeps
// them), then cuts those by top-p and draws among them (top_k_draw). Without top-k, the cuts
// raise a floor under the draw's masses (mass[j] = exp((logit_j - max) / T), the best token's 1):
// min-p is a floor itself; top-p sums the masses by power-of-two band and sorts only the band its
// boundary falls in (cut_floor).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "simd.hpp"

namespace prelude_cpu {

// The k-th largest of the values at or above `floor` (the floor itself when fewer are).
__attribute__((always_inline)) static inline float kth_largest(const float* values, long n, long k, float floor,
                                                               std::vector<float>& heap) {
    heap.clear();
    heap.reserve(k);
    float bar = floor;  // while the heap fills, a value enters at >= floor; once full, above its least
    auto consider = [&](float x) {
        if ((long)heap.size() < k) {
            if (!(x >= floor)) return;  // a NaN neither
            heap.push_back(x);
            std::push_heap(heap.begin(), heap.end(), std::greater<float>());
            if ((long)heap.size() == k) bar = heap.front();
        } else if (x > bar) {
            std::pop_heap(heap.begin(), heap.end(), std::greater<float>());
            heap.back() = x;
            std::push_heap(heap.begin(), heap.end(), std::greater<float>());
            bar = heap.front();
        }
    };
    long j = 0;
    for (; j + 8 <= n; j += 8) {
        const v8f v = load8(values + j), bar8 = splat(bar);
        if (!any_lane((long)heap.size() < k ? v >= bar8 : v > bar8)) continue;
        for (long i = 0; i < 8; ++i) consider(values[j + i]);
    }
    for (; j < n; ++j) consider(values[j]);
    return (long)heap.size() < k ? floor : heap.front();
}

// The least of `sorted` (descending) that top-p keeps when `before` of the mass precedes them:
// a token stays while the mass before it is below `target`; `least` when none does.
__attribute__((always_inline)) static inline float least_kept(const std::vector<float>& sorted, double before,
                                                              double target, float least) {
    for (const float x : sorted) {
        if (before >= target) break;
        least = x;
        before += x;
    }
    return least;
}

// A mass's band: b holds [2^-b, 2^(1-b)) (the best token, mass 1, is in band 0); 127 holds zero
// and the subnormals.
constexpr int kBands = 128;
__attribute__((always_inline)) static inline int band_of(float x) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof(bits));
    const int exponent = (int)((bits >> 23) & 0xFF);
    return exponent >= 127 ? 0 : 127 - exponent;
}

// The least mass top-p keeps among the masses at or above `floor`: in descending order, a token
// stays while the mass before it is below top_p of theirs all (the first always stays). One pass
// sums the masses by band; only the band where the running sum crosses is gathered and sorted.
__attribute__((always_inline)) static inline float top_p_floor(const float* mass, long n, float top_p, float floor,
                                                               std::vector<float>& band) {
    // Eight histograms, one per lane: neighbouring tokens often share a band, and one histogram
    // made each add wait for the last one's store (about 0.4 ms over 152K entries).
    // The bands come from the exponents eight at a time; a mass below the floor adds nothing.
    double lanes[8][kBands] = {};
    long j = 0;
    const v8f floor8 = splat(floor), zero8 = {};
    const v8i biased = v8i{} + 127, none = {};
    for (; j + 8 <= n; j += 8) {
        const v8f m = load8(mass + j);
        if (!any_lane(m >= floor8)) continue;
        v8i bits;
        std::memcpy(&bits, &m, sizeof(bits));
        v8i band = biased - ((bits >> 23) & 0xFF);
        band = band < none ? none : band;
        const v8f add = m >= floor8 ? m : zero8;
        for (long i = 0; i < 8; ++i) lanes[i][band[i]] += add[i];
    }
    for (; j < n; ++j)
        if (mass[j] >= floor) lanes[0][band_of(mass[j])] += mass[j];
    double sums[kBands], total = 0.0;
    for (int b = 0; b < kBands; ++b) {
        sums[b] = 0.0;
        for (int i = 0; i < 8; ++i) sums[b] += lanes[i][b];
        total += sums[b];
    }
    const double target = (double)top_p * total;
    double before = 0.0;
    int crossing = 0;
    while (crossing < kBands && before + sums[crossing] < target) before += sums[crossing++];
    if (crossing == kBands) return floor;  // rounding left the target past everything: keep all
    band.clear();
    // The band's masses are [2^-crossing, 2^(1-crossing)) (band 0: from 1 up): eight outside it
    // are passed over at once.
    const float low = std::max(std::ldexp(1.0f, -crossing), floor);
    const v8f low8 = splat(low), high8 = splat(crossing == 0 ? INFINITY : std::ldexp(1.0f, 1 - crossing));
    for (j = 0; j + 8 <= n; j += 8) {
        const v8f m = load8(mass + j);
        if (!any_lane((m >= low8) & (m < high8))) continue;
        for (long i = j; i < j + 8; ++i)
            if (mass[i] >= floor && band_of(mass[i]) == crossing) band.push_back(mass[i]);
    }
    for (; j < n; ++j)
        if (mass[j] >= floor && band_of(mass[j]) == crossing) band.push_back(mass[j]);
    std::sort(band.begin(), band.end(), std::greater<float>());
    const float least = least_kept(band, before, target, band.empty() ? floor : band.front());
    return least > floor ? least : floor;
}

// The floor of a row's cuts without top-k: min_p (0: none), top_p (>= 1: none).
__attribute__((always_inline)) static inline float cut_floor(const float* mass, long n, float min_p, float top_p,
                                                             std::vector<float>& scratch) {
    float floor = min_p > 0.0f ? min_p : 0.0f;  // p / p_best is the mass itself
    if (top_p < 1.0f) floor = std::max(floor, top_p_floor(mass, n, top_p, floor, scratch));
    return floor;
}

// A row with a top-k cut (0 < top_k < n), drawn at uniform u over the tokens its cuts keep; -1
// when none has mass (every logit -inf). `top` is the row's largest logit.
__attribute__((always_inline)) static inline long top_k_draw(const float* logits, long n, float top, float inv_t,
                                                             double u, float min_p, long top_k, float top_p,
                                                             std::vector<float>& scratch, std::vector<float>& masses,
                                                             std::vector<long>& kept) {
    // min-p keeps mass >= min_p, which is logit >= top + ln(min_p) T.
    const float eligible = min_p > 0.0f ? top + std::log(min_p) / inv_t : -INFINITY;
    const float kth = kth_largest(logits, n, top_k, eligible, scratch);
    kept.clear();
    masses.clear();
    auto keep = [&](long i) {
        if (logits[i] >= kth && logits[i] > -INFINITY) {
            kept.push_back(i);
            masses.push_back(std::exp((logits[i] - top) * inv_t));
        }
    };
    const v8f kth8 = splat(kth);
    long j = 0;
    for (; j + 8 <= n; j += 8) {
        if (!any_lane(load8(logits + j) >= kth8)) continue;
        for (long i = j; i < j + 8; ++i) keep(i);
    }
    for (; j < n; ++j) keep(j);
    float least = 0.0f;  // the least mass top-p keeps
    if (top_p < 1.0f && !masses.empty()) {
        scratch.assign(masses.begin(), masses.end());
        std::sort(scratch.begin(), scratch.end(), std::greater<float>());
        double all = 0.0;
        for (const float m : scratch) all += m;
        least = least_kept(scratch, 0.0, (double)top_p * all, 0.0f);
    }
    double total = 0.0;
    for (const float m : masses) total += m >= least ? m : 0.0f;
    const double target = u * total;
    double seen = 0.0;
    long chosen = -1;
    for (size_t i = 0; i < kept.size(); ++i) {
        if (masses[i] == 0.0f || masses[i] < least) continue;
        chosen = kept[i];  // the last with mass, if rounding leaves the target past them all
        seen += masses[i];
        if (seen > target) break;
    }
    return chosen;
}

}  // namespace prelude_cpu
