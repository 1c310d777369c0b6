// The vocabulary: token bytes -> id. Probed once for every piece the piece cache lacks (most
// new pieces of real text are whole tokens), so a probe should cost one cache miss.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "ft_cache.hpp"  // make_key: the page-safe read of a short piece
#include "ft_mem.hpp"

namespace ft {

inline uint64_t hash_bytes(const uint8_t* s, size_t n) {
    // FNV-style over 8-byte words with a final avalanche: pieces are short, so simplicity wins.
    // The tail is read as two overlapping 4-byte loads (or three single bytes) rather than a
    // variable-length memcpy, which profiling showed stalling.
    uint64_t h = 0xcbf29ce484222325ULL ^ (n * 0x9E3779B97F4A7C15ULL);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        std::memcpy(&w, s + i, 8);
        h = (h ^ w) * 0x100000001b3ULL;
        h ^= h >> 29;
    }
    const size_t t = n - i;
    uint64_t tail = 0;
    if (t >= 4) {
        uint32_t lo, hi;
        std::memcpy(&lo, s + i, 4);
        std::memcpy(&hi, s + i + t - 4, 4);
        tail = (uint64_t(hi) << 32) | lo;
    } else if (t > 0) {
        tail = (uint64_t(s[i]) << 16) | (uint64_t(s[i + t / 2]) << 8) | s[i + t - 1];
    }
    h = (h ^ tail) * 0x100000001b3ULL;
    h ^= h >> 32;
    h *= 0xD6E8FEB86659FD93ULL;
    h ^= h >> 32;
    return h;
}

// Immutable map from byte strings to ids (open addressing, 16-byte slots). A key of up to 11
// bytes (~95% of the whole-token pieces of paper text) sits in its slot, so the probe compares
// in the line it loads; a longer key keeps 32 bits of its hash and an offset into a byte arena,
// whose compare is a second, dependent miss.
class StrMap {
public:
    static constexpr size_t kInlineMax = 11;

    void reserve(size_t n) {
        size_t cap = 16;
        while (cap * 3 < n * 4) cap <<= 1;
        slots_.assign(cap, Slot{0, 0, -1});
        mask_ = cap - 1;
        arena_.clear();
    }
    // Later inserts of an equal key overwrite, as a Rust HashMap built from an iterator does.
    void insert(const uint8_t* s, size_t n, int32_t id) {
        if (n > 0xFFFF) return;  // never a BPE result: pieces that long are not tokens
        const uint64_t h = hash_bytes(s, n);
        if (Slot* slot = const_cast<Slot*>(lookup(s, n, h))) {
            slot->id = id;
            return;
        }
        size_t i = h & mask_;
        while (slots_[i].id >= 0) i = (i + 1) & mask_;
        if (n <= kInlineMax) {
            const PieceKey k = make_key(s, n);
            slots_[i] = Slot{k.lo, inline_b(k, n), id};
        } else {
            slots_[i] = Slot{(uint64_t(tag(h)) << 32) | uint32_t(arena_.size()), kLong | uint32_t(n), id};
            arena_.append(reinterpret_cast<const char*>(s), n);
        }
    }
    int32_t find(const uint8_t* s, size_t n, uint64_t h) const {
        const Slot* slot = lookup(s, n, h);
        return slot ? slot->id : -1;
    }
    int32_t find(const uint8_t* s, size_t n) const { return find(s, n, hash_bytes(s, n)); }

    FT_INLINE void prefetch(uint64_t h) const { __builtin_prefetch(&slots_[h & mask_]); }  // see PieceCache::prefetch

    // The id of piece s when BPE over it yields exactly that token (see mark_whole), else -1.
    int32_t find_whole(const uint8_t* s, size_t n, uint64_t h) const {
        const Slot* slot = lookup(s, n, h);
        return slot && (slot->b & kWhole) ? slot->id : -1;
    }
    // Sets the flag find_whole reads: whole(bytes, length, id) says whether BPE over the bytes
    // of a vocabulary entry merges them back into that entry.
    template <class Whole>
    void mark_whole(Whole&& whole) {
        for (Slot& slot : slots_) {
            if (slot.id < 0) continue;
            uint8_t buf[16];
            const uint8_t* p = buf;
            const size_t n = key_len(slot);
            if (is_long(slot)) {
                p = reinterpret_cast<const uint8_t*>(arena_.data()) + uint32_t(slot.a);
            } else {
                std::memcpy(buf, &slot.a, 8);
                std::memcpy(buf + 8, &slot.b, 4);
            }
            slot.b &= ~kWhole;
            if (whole(p, n, slot.id)) slot.b |= kWhole;
        }
    }

    template <class IO>
    void visit(IO& io) {
        io.vec(slots_);
        io.str(arena_);
        io.pod(mask_);
        if (IO::kLoading) {
            if (slots_.size() < 2 || (slots_.size() & (slots_.size() - 1)) || mask_ != slots_.size() - 1)
                throw std::runtime_error("fasttoken cache: vocab table shape");
            for (const Slot& slot : slots_) {
                if (slot.id < 0) continue;
                if (is_long(slot) ? size_t(uint32_t(slot.a)) + key_len(slot) > arena_.size()
                                  : key_len(slot) > kInlineMax)
                    throw std::runtime_error("fasttoken cache: vocab slot");
            }
        }
    }

private:
    // a: an inline key's bytes 0-7, else the hash tag (high half) and arena offset (low half).
    // b: bits 0-23 an inline key's bytes 8-10, else the length (<= 0xFFFF); bits 24-28 the
    //    inline length, or kLong; bit 31 the whole flag. An inline probe compares a and b
    //    (minus the flag), which no long slot can equal.
    struct Slot {
        uint64_t a;
        uint32_t b;
        int32_t id;  // -1: empty
    };
    static constexpr uint32_t kWhole = uint32_t(1) << 31, kLong = uint32_t(0x1F) << 24;
    static constexpr uint32_t kLenField = uint32_t(0x1F) << 24;
    static uint32_t tag(uint64_t h) { return uint32_t(h >> 32); }
    // make_key puts the length in bits 56-59 of hi and zeroes the bytes past it, so for up to
    // 11 bytes its low 32 bits are bytes 8-10 and a zero byte.
    static uint32_t inline_b(const PieceKey& k, size_t n) { return uint32_t(k.hi) | (uint32_t(n) << 24); }
    static bool is_long(const Slot& s) { return (s.b & kLenField) == kLong; }
    static size_t key_len(const Slot& s) { return is_long(s) ? (s.b & 0xFFFF) : ((s.b & kLenField) >> 24); }

    const Slot* lookup(const uint8_t* s, size_t n, uint64_t h) const {
        if (n <= kInlineMax) {
            const PieceKey k = make_key(s, n);
            const uint32_t b = inline_b(k, n);
            for (size_t i = h & mask_;; i = (i + 1) & mask_) {
                const Slot& slot = slots_[i];
                if (slot.id < 0) return nullptr;
                if (slot.a == k.lo && (slot.b & ~kWhole) == b) return &slot;
            }
        }
        const uint32_t b = kLong | uint32_t(n);
        for (size_t i = h & mask_;; i = (i + 1) & mask_) {
            const Slot& slot = slots_[i];
            if (slot.id < 0) return nullptr;
            if ((slot.b & ~kWhole) == b && uint32_t(slot.a >> 32) == tag(h) &&
                std::memcmp(arena_.data() + uint32_t(slot.a), s, n) == 0)
                return &slot;
        }
    }
    std::vector<Slot, HugeAllocator<Slot>> slots_;
    std::string arena_;  // the bytes of keys longer than kInlineMax
    size_t mask_ = 0;
};

}  // namespace ft
