// The merge-rank table and the BPE merge loop (the vocabulary is ft_vocab.hpp).
#pragma once

#include <cstdint>
#include <cstring>
#include <queue>
#include <stdexcept>
#include <string>
#include <vector>

#include "ft_mem.hpp"
#include "ft_vocab.hpp"

namespace ft {

// (left id, right id) -> (order key, merged id). A new word's BPE is a chain of lookups here
// that mostly miss the CPU caches, so the table is kept small: one 8-byte slot per pair holding
// left (20 bits), right (20 bits) and a 24-bit order key at a load factor up to 3/4.
// The merge loops only compare ranks, so a slot may hold any value that orders like the rank.
// Where merged ids never fall from one rank to the next (GPT-2, Qwen, DeepSeek-V3, Llama 3),
// the key is (merged id - first merged id) << shift | the rank's place among the ranks giving
// that id: it orders like the rank, and the merged id is key >> shift, with no second table
// read (for Llama 3 a dependent miss in a 1.1 MiB per-rank array, a large share of the merge
// loop). Where every rank gives a new id, shift is 0 and the key is
// the rank. Other tables keep the rank as key and read the id from that array.
class PairMap {
public:
    static constexpr int32_t kMaxId = (1 << 20) - 2;  // plan.py refuses larger vocabularies
    static constexpr size_t kMaxRanks = size_t(1) << 24;
    static constexpr uint32_t kKeyLimit = 0xFFFFFF;  // keys stay below it (the memo's "absent")
    void reserve(size_t n) {
        size_t cap = 16;
        while (cap * 3 < n * 4) cap <<= 1;
        slots_.assign(cap, kEmpty);
        mask_ = cap - 1;
        shift_ = 64 - __builtin_ctzll(cap);
        merged_.clear();
        merged_.reserve(n);
        key_shift_ = -1;
        key_base_ = 0;
    }
    // Ranks come in order 0, 1, 2...; a repeated pair keeps its last rank. finish() follows the
    // last insert.
    void insert(int32_t a, int32_t b, int32_t rank, int32_t id) {
        merged_.push_back(id);
        const uint64_t key = pack(a, b);
        for (size_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
            if (slots_[i] == kEmpty || (slots_[i] >> 24) == key) {
                slots_[i] = (key << 24) | uint64_t(rank);
                return;
            }
        }
    }
    void finish() {
        set_keys();
        build_filter();
    }

private:
    // Turns ranks into order keys where the merged ids allow it (see above).
    void set_keys() {
        const size_t n = merged_.size();
        int longest = 0;
        for (size_t r = 0, run = 0; r < n; ++r) {
            if (r && merged_[r] < merged_[r - 1]) return;  // not monotone: keys stay ranks
            run = r && merged_[r] == merged_[r - 1] ? run + 1 : 0;
            while ((size_t(1) << longest) <= run) ++longest;
        }
        if (!n || ((uint64_t(merged_.back() - merged_[0]) + 1) << longest) > kKeyLimit) return;
        std::vector<uint32_t> keys(n);
        for (size_t r = 0, run = 0; r < n; ++r) {
            run = r && merged_[r] == merged_[r - 1] ? run + 1 : 0;
            keys[r] = (uint32_t(merged_[r] - merged_[0]) << longest) | uint32_t(run);
        }
        for (uint64_t& slot : slots_)
            if (slot != kEmpty) slot = (slot & ~uint64_t(0xFFFFFF)) | keys[slot & 0xFFFFFF];
        key_shift_ = longest;
        key_base_ = merged_[0];
        merged_.clear();
        merged_.shrink_to_fit();
    }

public:
    // The order key alone: the merge loops read or compute the merged id only for the pair
    // they merge. -1: no merge.
    int32_t rank(int32_t a, int32_t b) const {
        const uint64_t key = pack(a, b);
        if (!maybe(key)) return -1;
        for (size_t i = mix(key) & mask_;; i = (i + 1) & mask_) {
            const uint64_t slot = slots_[i];
            if ((slot >> 24) == key) return int32_t(slot & 0xFFFFFF);
            if (slot == kEmpty) return -1;
        }
    }
    int32_t merged(int32_t key) const {
        return key_shift_ >= 0 ? (key >> key_shift_) + key_base_ : merged_[key];
    }
    template <class IO>
    void visit(IO& io) {
        io.vec(slots_);
        io.vec(merged_);
        io.pod(mask_);
        io.pod(shift_);
        io.pod(key_shift_);
        io.pod(key_base_);
        if (IO::kLoading) {
            if (slots_.size() < 2 || (slots_.size() & (slots_.size() - 1)) || mask_ != slots_.size() - 1 ||
                shift_ != 64 - __builtin_ctzll(slots_.size()) || key_shift_ < -1 || key_shift_ > 23 ||
                (key_shift_ >= 0) != merged_.empty() || key_base_ < 0 || key_base_ > kMaxId)
                throw std::runtime_error("fasttoken cache: merge table shape");
            for (uint64_t slot : slots_) {
                if (slot == kEmpty) continue;
                const uint32_t key = uint32_t(slot & 0xFFFFFF);
                if (key_shift_ >= 0 ? key >= kKeyLimit || merged(int32_t(key)) > kMaxId : key >= merged_.size())
                    throw std::runtime_error("fasttoken cache: merge slot");
            }
            build_filter();
        }
    }

private:
    static constexpr uint64_t kEmpty = ~uint64_t(0);  // left and right both 2^20 - 1: no id
    static uint64_t pack(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 20) | uint32_t(b); }
    size_t mix(uint64_t k) const { return size_t((k * 0x9E3779B97F4A7C15ULL) >> shift_); }

    // Half of the pairs a new word's BPE asks about have no merge (the pairs left between its
    // final tokens). A 256 KiB filter of the pairs that do, two bits in one word per pair, stays
    // in the L2 cache and answers most of those with no read of the multi-megabyte slots.
    // Derived from the slots, never stored.
    static constexpr int kFilterBits = 15;  // 2^15 words of 64 bits
    static uint64_t filter_hash(uint64_t key) { return key * 0xC2B2AE3D27D4EB4FULL; }
    static uint64_t filter_mask(uint64_t h) {
        return (uint64_t(1) << ((h >> (58 - kFilterBits)) & 63)) | (uint64_t(1) << ((h >> (52 - kFilterBits)) & 63));
    }
    bool maybe(uint64_t key) const {
        const uint64_t h = filter_hash(key), m = filter_mask(h);
        return (filter_[size_t(h >> (64 - kFilterBits))] & m) == m;
    }
    void build_filter() {
        filter_.assign(size_t(1) << kFilterBits, 0);
        for (uint64_t slot : slots_) {
            if (slot == kEmpty) continue;
            const uint64_t h = filter_hash(slot >> 24);
            filter_[size_t(h >> (64 - kFilterBits))] |= filter_mask(h);
        }
    }
    std::vector<uint64_t, HugeAllocator<uint64_t>> filter_;
    std::vector<uint64_t, HugeAllocator<uint64_t>> slots_;
    std::vector<int32_t, HugeAllocator<int32_t>> merged_;  // per rank; empty when keys give the id
    size_t mask_ = 0;
    int shift_ = 60;
    int32_t key_shift_ = -1;  // -1: keys are ranks, ids in merged_
    int32_t key_base_ = 0;
};

constexpr int32_t kNoRank = 0x7FFFFFFF;

// Applies merges to `syms` in place: always the lowest-rank adjacent pair, the leftmost of equal
// ones (equal ranks mean the same pair). This is the order HF's heap-based Word::merge_all
// produces. Short words use a linear scan over cached pair ranks; long ones a heap. A rank here
// is the table's order key (PairMap), which orders like the rank.
class Merger {
public:
    void run(const PairMap& merges, std::vector<int32_t>& syms) {
        if (syms.size() < 2) return;
        if (syms.size() <= 64) linear(merges, syms);
        else heap(merges, syms);
    }

private:
    void linear(const PairMap& merges, std::vector<int32_t>& syms) {
        size_t n = syms.size();
        ranks_.resize(n);
        // No prefetch of the initial pairs' slots: most pairs are answered by the memo or the
        // filter, so it buys nothing (see PieceCache::prefetch).
        for (size_t k = 0; k + 1 < n; ++k) set_pair(merges, syms, k);
        while (n > 1) {
            size_t best = 0;
            int32_t best_rank = kNoRank;
            for (size_t k = 0; k + 1 < n; ++k) {
                if (ranks_[k] < best_rank) { best_rank = ranks_[k]; best = k; }
            }
            if (best_rank == kNoRank) break;
            syms[best] = merges.merged(best_rank);
            const size_t tail = n - best - 2;
            std::memmove(&syms[best + 1], &syms[best + 2], tail * sizeof(int32_t));
            std::memmove(&ranks_[best + 1], &ranks_[best + 2], tail * sizeof(int32_t));
            --n;
            if (best > 0) set_pair(merges, syms, best - 1);
            if (best + 1 < n) set_pair(merges, syms, best);
        }
        syms.resize(n);
    }
    void set_pair(const PairMap& merges, const std::vector<int32_t>& syms, size_t k) {
        const int32_t rank = memo_rank(merges, syms[k], syms[k + 1]);
        ranks_[k] = rank < 0 ? kNoRank : rank;
    }

    // A direct-mapped memo of merge-table answers (ranks and absences) for the linear merger,
    // 128 KiB so it stays in the L2 cache: the pairs of unseen words' BPE repeat across words
    // (common bigrams, and the same few absent pairs), while the merge table's slots of those
    // pairs are spread over megabytes (A/B: 32 KiB gained less, 512 KiB no more). Slot: pair
    // key << 24 | rank, kAbsent for no merge; an empty slot holds a key no pair has (both ids
    // 2^20 - 1).
    static constexpr size_t kMemoBits = 14;
    static constexpr uint64_t kAbsent = 0xFFFFFF;
    static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 20) | uint32_t(b); }
    uint64_t& memo_slot(uint64_t key) {
        if (memo_.empty()) memo_.assign(size_t(1) << kMemoBits, ~uint64_t(0));
        return memo_[size_t((key * 0x9E3779B97F4A7C15ULL) >> (64 - kMemoBits))];
    }
    int32_t memo_rank(const PairMap& merges, int32_t a, int32_t b) {
        const uint64_t key = pair_key(a, b);
        uint64_t& slot = memo_slot(key);
        if ((slot >> 24) == key) {
            const uint64_t r = slot & 0xFFFFFF;
            return r == kAbsent ? -1 : int32_t(r);
        }
        const int32_t rank = merges.rank(a, b);
        if (rank < int32_t(kAbsent)) slot = (key << 24) | (rank < 0 ? kAbsent : uint64_t(rank));
        return rank;
    }

    void heap(const PairMap& merges, std::vector<int32_t>& syms) {
        const size_t n = syms.size();
        prev_.resize(n);
        next_.resize(n);
        for (size_t k = 0; k < n; ++k) { prev_[k] = int32_t(k) - 1; next_[k] = int32_t(k) + 1; }
        next_[n - 1] = -1;
        alive_.assign(n, 1);
        // (rank << 32 | position) ordered ascending: lowest rank first, then leftmost.
        std::priority_queue<uint64_t, std::vector<uint64_t>, std::greater<uint64_t>> queue;
        auto push = [&](int32_t pos) {
            const int32_t nx = next_[pos];
            if (nx < 0) return;
            const int32_t rank = merges.rank(syms[pos], syms[nx]);
            if (rank >= 0) queue.push((uint64_t(uint32_t(rank)) << 32) | uint32_t(pos));
        };
        for (size_t k = 0; k + 1 < n; ++k) push(int32_t(k));
        while (!queue.empty()) {
            const uint64_t top = queue.top();
            queue.pop();
            const int32_t pos = int32_t(top & 0xFFFFFFFF);
            const int32_t rank = int32_t(top >> 32);
            if (!alive_[pos]) continue;
            const int32_t nx = next_[pos];
            if (nx < 0) continue;
            if (merges.rank(syms[pos], syms[nx]) != rank) continue;  // stale: the pair changed
            syms[pos] = merges.merged(rank);
            alive_[nx] = 0;
            next_[pos] = next_[nx];
            if (next_[nx] >= 0) prev_[next_[nx]] = pos;
            if (prev_[pos] >= 0) push(prev_[pos]);
            push(pos);
        }
        size_t out = 0;
        for (size_t k = 0; k < n; ++k) {
            if (alive_[k]) syms[out++] = syms[k];
        }
        syms.resize(out);
    }

    std::vector<int32_t> ranks_, prev_, next_;
    std::vector<uint8_t> alive_;
    std::vector<uint64_t> memo_;  // see memo_rank; allocated on first use
};

}  // namespace ft
