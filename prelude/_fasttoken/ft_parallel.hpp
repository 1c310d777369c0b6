// One long text encoded on the worker pool: cut at sure piece starts into chunks that the
// pool's threads split and encode side by side, each with its own Scratch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "ft_bits.hpp"
#include "ft_out.hpp"
#include "ft_pool.hpp"

namespace ft {

// Texts from kParallelText bytes are cut into chunks of about kChunk bytes: enough chunks for
// the pool to even out a late worker, each long enough that its wake-up is noise.
constexpr size_t kParallelText = 64 * 1024, kChunk = 24 * 1024;

// chunk(bytes, length, Out&) encodes one chunk and says whether its ids are sure (see
// Engine::split_and_encode). Every chunk writes straight into o, at a region as long as its
// bytes (ids never outnumber bytes) plus kSlack, so no thread touches another's region and no
// chunk needs a buffer of its own; the regions are then closed up in order. o must have room
// for len + kSlack ids on entry. Where o has a sink, the calling thread hands it every finished
// chunk in order after each chunk of its own, and the rest once all are done.
template <class Chunk>
bool encode_parallel(const uint8_t* p, size_t len, Out& o, Chunk&& chunk) {
    std::vector<size_t> cuts{0};
    for (size_t at = kChunk; at < len;) {
        const size_t cut = next_sure_start(p, len, at);
        if (cut >= len) break;
        cuts.push_back(cut);
        at = cut + kChunk;
    }
    cuts.push_back(len);
    const size_t n = cuts.size() - 1;
    o.ensure(len + (n + 1) * kSlack);
    int32_t* const base = o.w;
    std::vector<size_t> counts(n);
    std::vector<uint8_t> sure(n);
    std::unique_ptr<std::atomic<bool>[]> done(new std::atomic<bool>[n]);
    for (size_t k = 0; k < n; ++k) done[k].store(false, std::memory_order_relaxed);
    size_t handed = 0;  // chunks handed to o.sink (the calling thread's count)
    const std::thread::id caller = std::this_thread::get_id();
    auto hand_over_done = [&] {
        if (!handed) o.hand_over(base);
        for (; handed < n && done[handed].load(std::memory_order_acquire); ++handed)
            o.sink->take(o.sink->ctx, base + cuts[handed] + handed * kSlack, counts[handed]);
    };
    const std::function<void(size_t)> task = [&](size_t k) {
        Out part(base + cuts[k] + k * kSlack);
        sure[k] = chunk(p + cuts[k], cuts[k + 1] - cuts[k], part);
        counts[k] = part.size();
        done[k].store(true, std::memory_order_release);
        if (o.sink && std::this_thread::get_id() == caller) hand_over_done();
    };
    Pool::get().run(n, task);
    if (o.sink) hand_over_done();
    bool all_sure = true;
    for (size_t k = 0; k < n; ++k) {
        // The first region is in place; every later one starts at or after o.w. The sink has
        // all of them already: only the count matters.
        if (!o.sink) std::memmove(o.w, base + cuts[k] + k * kSlack, counts[k] * sizeof(int32_t));
        o.w += counts[k];
        all_sure = all_sure && sure[k];
    }
    if (o.sink) o.taken = o.size();
    return all_sure;
}

}  // namespace ft
