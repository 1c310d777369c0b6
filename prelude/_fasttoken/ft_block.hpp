// The pieces of a block looked up in the per-thread piece cache together.
//
// The scanner fills a block of pieces; its cache lines are all prefetched before any is read,
// so the waits for those lines overlap instead of following one another (profiling showed that
// wait, and the branches of interleaving scan and lookup piece by piece, as the main costs).
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
// 16 pieces a block: larger blocks put more lines in flight than the core holds and their
// prefetches stall (`python -m bench.tokenizer.ab OLD.so NEW.so` compares two builds).
constexpr size_t kBlock = 16;

// A block of pieces between its two phases: prepare() (keys, cache lines, prefetches) and
// resolve_block() (probes and ids). The engine prepares block k + 1 before it resolves block k,
// so a line has a whole block of scanning and hashing to arrive in: with the probe right after
// its own block's prefetches, perf put a third of the lookup on the first compare of each probe.
struct Block {
    Piece pieces[kBlock];
    PieceKey keys[kBlock];
    size_t lines[kBlock];
    size_t count = 0;

    void prepare(const PieceCache& cache) {
        for (size_t k = 0; k < count; ++k) {
            if (pieces[k].n > kCacheKeyMax) continue;
            const PieceKey key = make_key(pieces[k].p, pieces[k].n);
            const size_t line = PieceCache::line(key);
            keys[k] = key;
            lines[k] = line;
            cache.prefetch(line);
        }
    }
};

// Writes the ids of each piece of a prepared block to o in order (o has room for the pieces'
// bytes + kSlack). new_word(key or null, bytes, length, o, hash or null) encodes a piece the
// cache lacks; the hash, when given, is the vocabulary hash of the piece, already prefetched.
template <class NewWord>
FT_INLINE void resolve_block(PieceCache& cache, const StrMap& vocab, const Block& b, bool last, Out& o,
                             NewWord&& new_word) {
    const size_t count = b.count;
    // At the block's first miss, the later misses of the block start their vocabulary
    // lookups (a miss in a table of megabytes each), so those waits overlap too: new words
    // come in bunches in text the cache has not seen.
    uint64_t hashes[kBlock];
    uint64_t hashed = 0;  // bit k: hashes[k] is set
    bool looked_ahead = false;
    auto look_ahead = [&](size_t from) {
        looked_ahead = true;
        for (size_t j = from; j < count; ++j) {
            if (b.pieces[j].n > kCacheKeyMax || cache.contains(b.keys[j], b.lines[j])) continue;
            hashes[j] = hash_bytes(b.pieces[j].p, b.pieces[j].n);
            vocab.prefetch(hashes[j]);
            hashed |= uint64_t(1) << j;
        }
    };
    // The text's last block (a short text's only one) was prepared just now, so its first miss
    // would wait for its vocabulary slot alone: its misses all start theirs before any is read
    // (only the last: done for every block, a block ahead, it costs long texts, whose blocks
    // mostly all hit).
    if (last) look_ahead(0);
    // The write cursor is a local: o.w itself was reloaded after every 16-byte copy (memcpy
    // may alias anything), a store-forwarding wait per piece.
    int32_t* w = o.w;
    for (size_t k = 0; k < count; ++k) {
        const Piece q = b.pieces[k];
        if (q.n <= kCacheKeyMax && cache.copy_ids(b.keys[k], b.lines[k], w)) continue;
        o.w = w;
        if (q.n > kCacheKeyMax) {
            new_word(nullptr, q.p, q.n, o, nullptr);
        } else {
            if (!looked_ahead) look_ahead(k + 1);
            new_word(&b.keys[k], q.p, q.n, o, (hashed >> k) & 1 ? &hashes[k] : nullptr);
        }
        w = o.w;
    }
    o.w = w;
}

}  // namespace ft
