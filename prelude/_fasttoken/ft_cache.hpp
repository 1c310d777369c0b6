// The per-thread piece cache: pre-token bytes -> the ids BPE gives them.
//
// Real text draws its pre-tokens from a small working set (a few thousand distinct words cover
// almost everything), so after warm-up nearly every piece is answered here and BPE, whose merge
// table lookups miss the CPU caches, runs only for new words. Profiling showed those table
// misses, not the merge arithmetic, as the cost; hence the layout:
// - the key is the piece itself (up to 15 bytes, zero padded, length in the last byte), so a
//   probe is two 64-bit compares and never touches the text again;
// - entries are 32 bytes with up to 4 ids inline, two per 64-byte line (2-way set associative,
//   least recently used out), so a probe touches one cache line and a frequent word is not
//   evicted by rare ones.
// Longer pieces (well under 1% of English pre-tokens) skip the cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ft_inline.hpp"
#include "ft_mem.hpp"

namespace ft {

constexpr size_t kCacheKeyMax = 15, kCacheIdsMax = 4;

struct PieceKey {
    uint64_t lo, hi;  // bytes 0-14 of the piece, zero padded; bits 56-59: its length
};

// The masks that keep the first n bytes of the two 8-byte halves of a key.
struct KeyMasks {
    uint64_t lo[16], hi[16];
    constexpr KeyMasks() : lo(), hi() {
        for (int n = 0; n < 16; ++n) {
            lo[n] = n >= 8 ? ~uint64_t(0) : (uint64_t(1) << (8 * n)) - 1;
            hi[n] = n <= 8 ? 0 : (uint64_t(1) << (8 * (n - 8))) - 1;
        }
    }
};
static constexpr KeyMasks kKeyMasks{};

// Reads n <= 15 bytes at p. A 16-byte load that stays inside p's page cannot fault, so it is
// used whenever it does; the bytes past n are masked off. The masks come from a table indexed
// by the length: no branch on "shorter than 8 bytes" (a coin toss in real text; perf showed
// the mispredictions), and half the instructions of computing them with variable shifts.
inline PieceKey make_key(const uint8_t* p, size_t n) {
    PieceKey k;
    if ((reinterpret_cast<uintptr_t>(p) & 4095) <= 4096 - 16) {
        std::memcpy(&k.lo, p, 8);
        std::memcpy(&k.hi, p + 8, 8);
        k.lo &= kKeyMasks.lo[n & 15];
        k.hi &= kKeyMasks.hi[n & 15];
    } else {
        uint8_t buf[16] = {};
        std::memcpy(buf, p, n);
        std::memcpy(&k.lo, buf, 8);
        std::memcpy(&k.hi, buf + 8, 8);
    }
    k.hi |= uint64_t(n) << 56;
    return k;
}

class PieceCache {
public:
    // 32K lines x 2 ways = 64K pieces, 2 MiB (one huge page, see ft_mem.hpp). Halving it doubled the misses on paper text
    // (~7K distinct pieces): each costs a vocabulary lookup or a BPE, 100x a hit.
    static constexpr size_t kBucketBits = 15;

    PieceCache() : buckets_(static_cast<Bucket*>(huge_zeroed(sizeof(Bucket) << kBucketBits))) {}
    ~PieceCache() { std::free(buckets_); }
    PieceCache(const PieceCache&) = delete;
    PieceCache& operator=(const PieceCache&) = delete;

    // The line a key lives in; computed once per piece and used for the prefetch and the probe.
    static size_t line(const PieceKey& k) {
        const uint64_t h = (k.lo ^ (k.hi * 0x9E3779B97F4A7C15ULL)) * 0xD6E8FEB86659FD93ULL;
        return size_t(h >> (64 - kBucketBits));
    }
    // Always inlined: GCC takes a function whose only effect is __builtin_prefetch for pure,
    // and deletes a call to it that was not inlined early (the linear merger's prefetch of
    // merge slots, round four, was never in the binary).
    FT_INLINE void prefetch(size_t line) const { __builtin_prefetch(&buckets_[line]); }

    // On a hit, stores the piece's ids at w (always 16 bytes: the caller leaves room for
    // kCacheIdsMax ids) and advances w past them.
    bool contains(const PieceKey& k, size_t line) const {
        const Entry* e = buckets_[line].way;
        return (e[0].lo == k.lo && ((e[0].hi ^ k.hi) & kKeyMask) == 0) ||
               (e[1].lo == k.lo && ((e[1].hi ^ k.hi) & kKeyMask) == 0);
    }

    // A hit in way 1 swaps the two ways, so the way insert() evicts is the one used less
    // recently: a frequent piece is not pushed out by two rare ones landing on its line.
    FT_INLINE bool copy_ids(const PieceKey& k, size_t line, int32_t*& w) {
        Entry* e = buckets_[line].way;
        if (!(e->lo == k.lo && ((e->hi ^ k.hi) & kKeyMask) == 0)) {
            if (!(e[1].lo == k.lo && ((e[1].hi ^ k.hi) & kKeyMask) == 0)) return false;
            std::memcpy(w, e[1].ids, sizeof(e->ids));
            w += e[1].hi >> 60;
            const Entry t = e[0];
            e[0] = e[1];
            e[1] = t;
            return true;
        }
        std::memcpy(w, e->ids, sizeof(e->ids));
        w += e->hi >> 60;
        return true;
    }

    // The newest piece takes way 0; the one there moves to way 1 (least recently inserted out).
    void insert(const PieceKey& k, const int32_t* ids, size_t n_ids) {
        Entry* e = buckets_[line(k)].way;
        e[1] = e[0];
        e[0].lo = k.lo;
        e[0].hi = k.hi | (uint64_t(n_ids) << 60);
        std::memcpy(e[0].ids, ids, n_ids * sizeof(int32_t));
    }

private:
    // A key's length nibble is never 0, so a zeroed entry matches nothing.
    static constexpr uint64_t kKeyMask = ~(uint64_t(0xF) << 60);
    struct Entry {
        uint64_t lo = 0, hi = 0;  // the key; bits 60-63 of hi: number of ids
        int32_t ids[kCacheIdsMax] = {};
    };
    struct alignas(64) Bucket {
        Entry way[2];
    };
    Bucket* buckets_;  // 1 << kBucketBits lines, zeroed (a zero entry matches no key)
};

}  // namespace ft

namespace ft {

// Pieces the PieceCache cannot hold (over 15 bytes, or over 4 ids): URLs, long identifiers,
// runs of punctuation or CJK. Rare, but each costs a long BPE with a heap, so they are cached
// too: a direct-mapped table over an arena of keys and ids, emptied when the arena fills.
class LongCache {
public:
    LongCache() : slots_(kSlots) {}

    const int32_t* find(const uint8_t* p, size_t n, uint64_t h, size_t& n_ids) const {
        const Slot& s = slots_[h & (kSlots - 1)];
        if (s.hash != h || s.key_len != n || std::memcmp(keys_.data() + s.key_off, p, n) != 0)
            return nullptr;
        n_ids = s.n_ids;
        return ids_.data() + s.ids_off;
    }

    void insert(const uint8_t* p, size_t n, uint64_t h, const int32_t* ids, size_t n_ids) {
        if (n > kMaxKey || n_ids > kMaxKey) return;
        if (keys_.size() + n > kArenaBytes || ids_.size() + n_ids > kArenaBytes / 4) clear();
        slots_[h & (kSlots - 1)] = Slot{h, uint32_t(keys_.size()), uint32_t(n), uint32_t(ids_.size()),
                                        uint32_t(n_ids)};
        keys_.insert(keys_.end(), p, p + n);
        ids_.insert(ids_.end(), ids, ids + n_ids);
    }

private:
    static constexpr size_t kSlots = 4096, kMaxKey = 4096, kArenaBytes = size_t(1) << 20;
    struct Slot {
        uint64_t hash = 0;
        uint32_t key_off = 0, key_len = 0, ids_off = 0, n_ids = 0;  // key_len 0: empty
    };
    void clear() {
        for (Slot& s : slots_) s = Slot{};
        keys_.clear();
        ids_.clear();
    }
    std::vector<Slot> slots_;
    std::vector<uint8_t> keys_;
    std::vector<int32_t> ids_;
};

}  // namespace ft
