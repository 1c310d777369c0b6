// Where encode writes ids.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ft_cache.hpp"

namespace ft {

// Room the hot loops may write past the last id: a cached piece's ids are copied as one
// 16-byte block whatever their number.
constexpr size_t kSlack = kCacheIdsMax;

// Takes ids in output order while an encode is still running: between its own chunks of a long
// text, the calling thread hands over the chunks finished so far (ft_parallel.hpp), so the
// result list (core.pyx, which takes the GIL for it) is built while the pool still encodes
// instead of after it. Called on the calling thread only.
struct Sink {
    void (*take)(void* ctx, const int32_t* ids, size_t n);
    void* ctx;
};

// A cursor into a vector that only grows, or into a fixed region the caller sized (the chunks
// of a parallel split, ft_parallel.hpp). Writers call ensure(k) before storing up to k ids, so
// the hot loops store without a capacity check; a text of n bytes never gives more than n ids
// (every id covers at least one byte), which bounds k.
struct Out {
    explicit Out(std::vector<int32_t>& vec) : v(&vec), w(vec.data()), first(vec.data()) {}
    explicit Out(int32_t* region) : v(nullptr), w(region), first(region) {}
    std::vector<int32_t>* v;  // null: a fixed region, where ensure() has nothing to do
    int32_t* w;
    int32_t* first;
    Sink* sink = nullptr;  // where set, ids before `taken` have gone to it
    size_t taken = 0;
    // Hands the ids from `taken` up to `end` to the sink.
    void hand_over(const int32_t* end) {
        if (end > first + taken) sink->take(sink->ctx, first + taken, size_t(end - first) - taken);
        taken = size_t(end - first);
    }
    size_t size() const { return size_t(w - first); }
    int32_t* begin() const { return first; }
    void ensure(size_t k) {
        if (!v) return;
        const size_t pos = size();
        if (pos + k > v->size()) {
            v->resize(std::max(pos + k, 2 * v->size()));
            first = v->data();
            w = first + pos;
        }
    }
    void put(int32_t id) { *w++ = id; }
    void put(const int32_t* p, size_t n) {
        std::memcpy(w, p, n * sizeof(int32_t));
        w += n;
    }
};

}  // namespace ft
