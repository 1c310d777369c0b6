// The cuts a draw makes before it samples (vLLM's, in its order: min-p, then top-k, then top-p),
// each over a row's tempered masses (mass[j] = exp((logit_j - max) / T), so the best token's is
// 1). Each cut only raises a floor: the row keeps the tokens whose mass is at least the floor,
// ties with it included (as torch's masked_fill(logits < kth) keeps top-k's). Torch's version
// sorts the whole vocabulary for top-p, about 6 ms a row over 152K entries on the dev VM; here
// top-k scans once with a k-entry heap and top-p sorts only the tokens of one power-of-two band.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "simd.hpp"

namespace prelude_cpu {

// The k-th largest of the masses at or above `floor` (the floor itself when fewer are).
__attribute__((always_inline)) static inline float kth_largest(const float* mass, long n, long k, float floor,
                                                               std::vector<float>& heap) {
    heap.clear();
    heap.reserve(k);
    float bar = floor;  // while the heap fills, a mass enters at >= floor; once full, above its least
    auto consider = [&](float x) {
        if ((long)heap.size() < k) {
            if (x < floor) return;
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
        const v8f v = load8(mass + j), bar8 = splat(bar);
        if (!any_lane((long)heap.size() < k ? v >= bar8 : v > bar8)) continue;
        for (long i = 0; i < 8; ++i) consider(mass[j + i]);
    }
    for (; j < n; ++j) consider(mass[j]);
    return (long)heap.size() < k ? floor : heap.front();
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
    double sums[kBands] = {};
    long j = 0;
    const v8f floor8 = splat(floor);
    for (; j + 8 <= n; j += 8) {
        if (!any_lane(load8(mass + j) >= floor8)) continue;
        for (long i = j; i < j + 8; ++i)
            if (mass[i] >= floor) sums[band_of(mass[i])] += mass[i];
    }
    for (; j < n; ++j)
        if (mass[j] >= floor) sums[band_of(mass[j])] += mass[j];
    double total = 0.0;
    for (int b = 0; b < kBands; ++b) total += sums[b];
    const double target = (double)top_p * total;
    double before = 0.0;
    int crossing = 0;
    while (crossing < kBands && before + sums[crossing] < target) before += sums[crossing++];
    if (crossing == kBands) return floor;  // rounding left the target past everything: keep all
    band.clear();
    for (j = 0; j < n; ++j) {
        if ((j & 7) == 0 && j + 8 <= n && !any_lane(load8(mass + j) >= floor8)) {
            j += 7;  // eight below the floor
            continue;
        }
        if (mass[j] >= floor && band_of(mass[j]) == crossing) band.push_back(mass[j]);
    }
    std::sort(band.begin(), band.end(), std::greater<float>());
    float least = band.empty() ? floor : band.front();
    for (const float x : band) {
        if (before >= target) break;
        least = x;
        before += x;
    }
    return least > floor ? least : floor;
}

// The floor of a row's cuts: min_p (0: none), top_k (<= 0: none), top_p (>= 1: none).
__attribute__((always_inline)) static inline float cut_floor(const float* mass, long n, float min_p, long top_k,
                                                             float top_p, std::vector<float>& scratch) {
    float floor = min_p > 0.0f ? min_p : 0.0f;  // p / p_best is the mass itself
    if (top_k > 0 && top_k < n) floor = std::max(floor, kth_largest(mass, n, top_k, floor, scratch));
    if (top_p < 1.0f) floor = std::max(floor, top_p_floor(mass, n, top_p, floor, scratch));
    return floor;
}

}  // namespace prelude_cpu
