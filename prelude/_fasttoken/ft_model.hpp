// The word model: a pre-token's bytes to ids (the piece caches, a whole-token lookup, BPE with
// HF's byte fallback and unk rules). Engine (ft_engine.hpp) derives from it and adds
// everything around the words: added tokens, normalizers, pre-tokenizers, templates, decode.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ft_bpe.hpp"
#include "ft_cache.hpp"
#include "ft_out.hpp"
#include "ft_unicode.hpp"

namespace ft {

// The per-thread state the word model writes (see Scratch in ft_engine.hpp).
struct WordScratch {
    std::vector<int32_t> syms;
    Merger merger;
    PieceCache cache;
    LongCache long_cache;
};

class WordModel {
public:
    // ---- tables (written by core.pyx or the table cache before first use) ----
    bool byte_level = true;
    StrMap vocab;
    PairMap merges;
    int32_t byte_ids[256];
    bool ignore_merges = false;
    bool byte_fallback = false;
    int32_t fallback_ids[256];
    int32_t unk_id = -1;
    bool fuse_unk = false;
    // What a one-byte pre-token encodes to when that is exactly one id, else -1 (set by
    // finalize_words).
    int32_t single_ids[256];

protected:
    // Called once after the tables above are filled.
    void finalize_words(WordScratch& sc) {
        for (int b = 0; b < 256; ++b) {
            single_ids[b] = -1;
            if (!byte_level && b >= 0x80) continue;  // not a whole character
            const uint8_t bytes[16] = {uint8_t(b)};  // padded: the readers are generic
            const std::vector<int32_t>& ids = bpe_word(sc, bytes, 1);
            if (ids.size() == 1) single_ids[b] = ids[0];
        }
        // Most new words of real text are vocabulary entries that BPE merges back into
        // themselves; knowing which ones lets a new piece skip BPE with one lookup.
        std::string padded;
        vocab.mark_whole([&](const uint8_t* p, size_t n, int32_t id) {
            padded.assign(reinterpret_cast<const char*>(p), n);
            padded.append(4, '\0');  // the readers may look a few bytes ahead
            const uint8_t* q = reinterpret_cast<const uint8_t*>(padded.data());
            if (!byte_level && !valid_utf8(q, n)) return false;
            const std::vector<int32_t>& ids = bpe_word(sc, q, n);
            return ids.size() == 1 && ids[0] == id;
        });
    }

    // One pre-token; the caller has ensured room for n + kSlack ids.
    void encode_word(WordScratch& sc, const uint8_t* p, size_t n, Out& o) const {
        if (!n) return;
        if (n <= kCacheKeyMax) {
            const PieceKey key = make_key(p, n);
            if (sc.cache.copy_ids(key, PieceCache::line(key), o.w)) return;
            encode_new_word(sc, &key, p, n, o);
            return;
        }
        encode_new_word(sc, nullptr, p, n, o);
    }

    // A piece the PieceCache did not have (key set) or cannot hold (key null).
    __attribute__((noinline)) void encode_new_word(WordScratch& sc, const PieceKey* key, const uint8_t* p,
                                                   size_t n, Out& o, const uint64_t* hash = nullptr) const {
        if (!n) return;
        if (n == 1 && single_ids[p[0]] >= 0) {  // spaces, punctuation: no hash, no BPE
            o.put(single_ids[p[0]]);
            if (key) sc.cache.insert(*key, o.w - 1, 1);
            return;
        }
        const uint64_t h = hash ? *hash : hash_bytes(p, n);
        int32_t* const first = o.w;
        // Most new pieces are whole tokens: their vocabulary slot (prefetched by the block
        // lookup) answers before the LongCache, which only ever holds the other kind, is probed.
        const int32_t whole = vocab.find_whole(p, n, h);
        if (whole >= 0) {
            o.put(whole);
        } else {
            size_t n_ids;
            if (const int32_t* ids = sc.long_cache.find(p, n, h, n_ids)) {
                o.put(ids, n_ids);
                return;
            }
            const std::vector<int32_t>& ids = bpe_word(sc, p, n);
            o.put(ids.data(), ids.size());
        }
        const size_t produced = size_t(o.w - first);
        if (key && produced >= 1 && produced <= kCacheIdsMax) sc.cache.insert(*key, first, produced);
        else if (produced >= 1 && whole < 0) sc.long_cache.insert(p, n, h, first, produced);
    }

    // The model on one pre-token, uncached; the ids are in sc.syms.
    const std::vector<int32_t>& bpe_word(WordScratch& sc, const uint8_t* p, size_t n) const {
        std::vector<int32_t>& syms = sc.syms;
        syms.clear();
        if (!n) return syms;
        if (ignore_merges) {  // HF looks the whole pre-token up before merging
            const int32_t whole = vocab.find(p, n);
            if (whole >= 0) {
                syms.push_back(whole);
                return syms;
            }
        }
        initial_symbols(p, n, syms);
        sc.merger.run(merges, syms);
        return syms;
    }

    // The word before merges, as HF's BPE::merge_word builds it: one symbol per character
    // (per byte for byte-level vocabularies, whose characters stand for bytes), else its
    // <0xNN> byte tokens, else the unk token (runs fused when fuse_unk), else nothing.
    void initial_symbols(const uint8_t* p, size_t n, std::vector<int32_t>& syms) const {
        syms.clear();
        bool have_unk = false;
        for (size_t i = 0; i < n;) {
            const size_t start = i;
            int32_t id;
            if (byte_level) {
                id = byte_ids[p[i++]];
            } else {
                next_cp(p, i);
                id = vocab.find(p + start, i - start);
            }
            if (id >= 0) {
                if (have_unk) { syms.push_back(unk_id); have_unk = false; }
                syms.push_back(id);
                continue;
            }
            if (byte_fallback) {
                bool all = true;
                for (size_t k = start; k < i; ++k) all = all && fallback_ids[p[k]] >= 0;
                if (all) {  // HF adds these before a pending unk (it `continue`s past the flush)
                    for (size_t k = start; k < i; ++k) syms.push_back(fallback_ids[p[k]]);
                    continue;
                }
            }
            if (unk_id >= 0) {
                if (have_unk && !fuse_unk) syms.push_back(unk_id);
                have_unk = true;
            }
        }
        if (have_unk) syms.push_back(unk_id);
    }
};

}  // namespace ft
