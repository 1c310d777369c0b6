// The pieces of a block looked up in the per-thread piece cache together.
//
// The scanner fills a block of pieces; resolve_block then hashes the whole block and prefetches
// its cache lines before reading any of them, so the waits for those lines overlap instead of
// following one another (profiling showed that wait, and the branches of interleaving scan and
// lookup piece by piece, as the main costs; without the prefetches a warm 8K encode is ~10%
// slower).
#pragma once

#include <cstddef>
#include <cstdint>

#include "ft_bpe.hpp"
#include "ft_cache.hpp"
#include "ft_out.hpp"

namespace ft {

struct Piece {
    const uint8_t* p;
    size_t n;
};
constexpr size_t kBlock = 32;

// Writes the ids of each piece to o in order (o has room for the pieces' bytes + kSlack).
// new_word(key or null, bytes, length, o, hash or null) encodes a piece the cache lacks; the
// hash, when given, is the vocabulary hash of the piece, already prefetched.
template <class NewWord>
FT_INLINE void resolve_block(PieceCache& cache, const StrMap& vocab, const Piece* block, size_t count, Out& o,
                             NewWord&& new_word) {
    PieceKey keys[kBlock];
    size_t lines[kBlock];
    for (size_t k = 0; k < count; ++k) {
        if (block[k].n > kCacheKeyMax) continue;
        keys[k] = make_key(block[k].p, block[k].n);
        lines[k] = PieceCache::line(keys[k]);
        cache.prefetch(lines[k]);
    }
    // At the block's first miss, the later misses of the block start their vocabulary
    // lookups (a miss in a table of megabytes each), so those waits overlap too: new words
    // come in bunches in text the cache has not seen.
    uint64_t hashes[kBlock];
    uint64_t hashed = 0;  // bit k: hashes[k] is set
    bool looked_ahead = false;
    for (size_t k = 0; k < count; ++k) {
        const Piece q = block[k];
        if (q.n > kCacheKeyMax) {
            new_word(nullptr, q.p, q.n, o, nullptr);
            continue;
        }
        if (cache.copy_ids(keys[k], lines[k], o.w)) continue;
        if (!looked_ahead) {
            looked_ahead = true;
            for (size_t j = k + 1; j < count; ++j) {
                if (block[j].n > kCacheKeyMax || cache.contains(keys[j], lines[j])) continue;
                hashes[j] = hash_bytes(block[j].p, block[j].n);
                vocab.prefetch(hashes[j]);
                hashed |= uint64_t(1) << j;
            }
        }
        new_word(&keys[k], q.p, q.n, o, (hashed >> k) & 1 ? &hashes[k] : nullptr);
    }
}

}  // namespace ft
