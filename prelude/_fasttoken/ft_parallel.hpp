// One long text encoded on the worker pool: cut at sure piece starts into chunks that the
// pool's threads split and encode side by side, each with its own Scratch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
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
// for len + kSlack ids on entry.
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
    const std::function<void(size_t)> task = [&](size_t k) {
        Out part(base + cuts[k] + k * kSlack);
        sure[k] = chunk(p + cuts[k], cuts[k + 1] - cuts[k], part);
        counts[k] = part.size();
    };
    Pool::get().run(n, task);
    bool all_sure = true;
    for (size_t k = 0; k < n; ++k) {
        // The first region is in place; every later one starts at or after o.w.
        std::memmove(o.w, base + cuts[k] + k * kSlack, counts[k] * sizeof(int32_t));
        o.w += counts[k];
        all_sure = all_sure && sure[k];
    }
    return all_sure;
}

}  // namespace ft
