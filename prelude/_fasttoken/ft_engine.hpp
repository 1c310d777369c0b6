// The immutable tokenizer: encode (added-token split, normalizers, pre-tokenizer, BPE,
// template ids) and decode (ft_decode.hpp).
// Everything is filled once by core.pyx and only read afterwards, so any number of threads
// may encode and decode at once; per-call state lives in a per-thread Scratch.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ft_added.hpp"
#include "ft_bits.hpp"
#include "ft_block.hpp"
#include "ft_bpe.hpp"
#include "ft_cache.hpp"
#include "ft_decode.hpp"
#include "ft_model.hpp"
#include "ft_nfc.hpp"
#include "ft_normalize.hpp"
#include "ft_out.hpp"
#include "ft_parallel.hpp"
#include "ft_pretok.hpp"
#include "ft_text.hpp"
#include "ft_unicode.hpp"

namespace ft {

enum Status : int { kOk = 0, kNeedReference = 1, kNotUtf8 = 2 /* a lone surrogate */ };
// Per-thread state of one Engine: the word model's (WordScratch) and encode's buffers.
struct Scratch : WordScratch {
    explicit Scratch(uint64_t owner_) : owner(owner_) {}
    uint64_t owner;
    std::vector<Segment> segs, sub_segs;
    std::string norm_a, norm_b, bytes_a, bytes_b, text_a, text_b, meta;
    std::vector<int32_t> out;
    std::vector<uint8_t> utf8;  // the text being encoded, when it was not UTF-8 already
};

inline Scratch& scratch_for(uint64_t owner) {
    thread_local std::vector<std::unique_ptr<Scratch>> pool;
    for (auto& s : pool)
        if (s->owner == owner) return *s;
    if (pool.size() >= 8) pool.erase(pool.begin());
    pool.push_back(std::make_unique<Scratch>(owner));
    return *pool.back();
}

inline uint64_t next_engine_id() {
    static std::atomic<uint64_t> counter{1};
    return counter++;
}

class Engine : public WordModel {
public:
    // ---- configuration (written by core.pyx before first use) ----
    ClassTable classes;
    Nfc nfc;
    std::vector<NormStep> normalizers;
    AddedMatcher raw_added, normalized_added;
    int pattern = -1;  // PatternKind, or -1: no pre-tokenizer (the whole segment is one word)
    int max_digits = 3;
    std::vector<int32_t> prefix_ids, suffix_ids;
    std::string word_boundary;  // see encode_words_at_boundaries; empty: off
    bool metaspace = false;  // Metaspace pre-tokenizer
    std::string ms_replacement;
    int ms_prepend = 0;  // one of the kPrepend values (PREPEND_SCHEMES in plan.py)
    bool ms_split = true;
    enum : int { kPrependAlways = 0, kPrependFirst = 1, kPrependNever = 2 };
    Decoder decoder;
    const uint64_t uid = next_engine_id();
    // Derived on build and on load (derive()), never stored.
    bool bits_ok = false;  // the ASCII classes are those ft_bits.hpp assumes

    void derive() { bits_ok = pattern >= 0 && ascii_classes_match(classes, PatternKind(pattern)); }

    // Called once after the tables above are filled.
    void finalize() {
        derive();
        finalize_words(scratch_for(uid));
    }

    // ---- encode ----
    // Encodes into this thread's scratch buffer: *count ids, valid until the thread's next call.
    // With a sink, part of the ids (from the first) may go to it during the call (see Sink).
    const int32_t* encode_scratch(const TextRef& t, bool add_special, int* status, size_t* count,
                                  Sink* sink = nullptr) const {
        Scratch& sc = scratch_for(uid);
        Out o(sc.out);
        o.sink = sink;
        const uint8_t* s;
        size_t n;
        *status = to_utf8(t, sc.utf8, s, n) ? encode_into(sc, s, n, add_special, o) : kNotUtf8;
        *count = o.size();
        return o.begin();
    }
    const int32_t* encode_scratch(const uint8_t* s, size_t n, bool add_special, int* status,
                                  size_t* count) const {
        return encode_scratch(TextRef{s, n, 0}, add_special, status, count);
    }

    int encode(const TextRef& t, bool add_special, std::vector<int32_t>& out) const {
        size_t count;
        int status;
        const int32_t* ids = encode_scratch(t, add_special, &status, &count);
        out.assign(ids, ids + count);
        return status;
    }
    int encode(const uint8_t* s, size_t n, bool add_special, std::vector<int32_t>& out) const {
        return encode(TextRef{s, n, 0}, add_special, out);
    }

private:
    int encode_into(Scratch& sc, const uint8_t* s, size_t n, bool add_special, Out& o) const {
        if (add_special) put_all(o, prefix_ids);
        const int status = walk(sc, s, n, [&](int32_t id) { o.ensure(1); o.put(id); },
                                [&](const uint8_t* p, size_t len, bool at_start) {
                                    return pretokenize(sc, p, len, at_start, o);
                                });
        if (add_special) put_all(o, suffix_ids);
        return status;
    }
    static void put_all(Out& o, const std::vector<int32_t>& ids) {
        o.ensure(ids.size());
        o.put(ids.data(), ids.size());
    }

public:
    // For Split regexes no scanner reproduces, the `regex` module splits (core.pyx); this does
    // everything before that: added tokens come back as Segment{0, 0, id}, text as its
    // normalized bytes appended to `arena`.
    int segment(const uint8_t* s, size_t n, std::vector<Segment>& segs, std::string& arena) const {
        Scratch& sc = scratch_for(uid);
        return walk(sc, s, n, [&](int32_t id) { segs.push_back(Segment{0, 0, id}); },
                    [&](const uint8_t* p, size_t len, bool) {
                        // The regex module's Unicode version is not Oniguruma's either.
                        uint8_t seen = 0;
                        for (size_t i = 0; i < len;) seen |= classes.get(next_cp(p, i));
                        segs.push_back(Segment{arena.size(), arena.size() + len, -1});
                        arena.append(reinterpret_cast<const char*>(p), len);
                        return !(seen & kUnsure);
                    });
    }

    // BPE over each piece of `buf` (Segment id -1) or the added id, in order.
    void encode_items(const uint8_t* buf, const std::vector<Segment>& items, bool add_special,
                      std::vector<int32_t>& out) const {
        Scratch& sc = scratch_for(uid);
        Out o(sc.out);
        if (add_special) put_all(o, prefix_ids);
        for (const Segment& item : items) {
            o.ensure(item.id >= 0 ? 1 : item.end - item.begin + kSlack);
            if (item.id >= 0) o.put(item.id);
            else encode_word(sc, buf + item.begin, item.end - item.begin, o);
        }
        if (add_special) put_all(o, suffix_ids);
        out.assign(o.begin(), o.w);
    }

    // ---- decode ----
    // Appends decode(ids) as valid UTF-8.
    void decode(const int32_t* ids, size_t n, bool skip_special, std::string& out) const {
        Scratch& sc = scratch_for(uid);
        decoder.decode(ids, n, skip_special, out, sc.bytes_a, sc.bytes_b);
    }

    // See Decoder::step.
    bool decode_step(const int32_t* ids, size_t n_prefix, size_t n_all, bool skip_special,
                     std::string& text) const {
        Scratch& sc = scratch_for(uid);
        return decoder.step(ids, n_prefix, n_all, skip_special, text, sc.text_a, sc.text_b, sc.bytes_a,
                            sc.bytes_b);
    }

private:
    // The steps HF takes before the pre-tokenizer: split on raw added tokens, normalize each
    // remaining segment, split that on normalized added tokens.
    template <class OnToken, class OnText>
    int walk(Scratch& sc, const uint8_t* s, size_t n, OnToken&& on_token, OnText&& on_text) const {
        sc.segs.clear();
        if (!raw_added.split(s, n, classes, sc.segs)) return kNeedReference;
        for (size_t k = 0; k < sc.segs.size(); ++k) {
            const Segment seg = sc.segs[k];
            if (seg.id >= 0) { on_token(seg.id); continue; }
            const uint8_t* p = s + seg.begin;
            size_t len = seg.end - seg.begin;
            normalize(normalizers, nfc, sc.norm_a, sc.norm_b, p, len);
            if (normalized_added.empty()) {
                if (!on_text(p, len, seg.begin == 0)) return kNeedReference;
                continue;
            }
            sc.sub_segs.clear();
            if (!normalized_added.split(p, len, classes, sc.sub_segs)) return kNeedReference;
            for (const Segment& sub : sc.sub_segs) {
                if (sub.id >= 0) on_token(sub.id);
                else if (!on_text(p + sub.begin, sub.end - sub.begin, seg.begin == 0 && sub.begin == 0))
                    return kNeedReference;
            }
        }
        return kOk;
    }

    // at_start: the text begins at offset 0 of the input (Metaspace's prepend_scheme "first").
    bool pretokenize(Scratch& sc, const uint8_t* p, size_t len, bool at_start, Out& o) const {
        if (metaspace) {
            metaspace_split(sc, p, len, at_start, o);
            return true;
        }
        o.ensure(len + kSlack);
        if (pattern < 0) {
            if (word_boundary.empty()) encode_word(sc, p, len, o);
            else encode_words_at_boundaries(sc, p, len, o);
            return true;
        }
        if (len >= kParallelText && bits_ok)
            return encode_parallel(p, len, o, [this](const uint8_t* q, size_t n, Out& part) {
                return split_and_encode(scratch_for(uid), q, n, part);
            });
        return split_and_encode(sc, p, len, o);
    }

    bool split_and_encode(Scratch& sc, const uint8_t* p, size_t len, Out& o) const {
        // Pieces are looked up a block at a time (ft_block.hpp), one block behind the scan: a
        // full block is prepared (its cache lines prefetched), then the one before it resolved.
        // The fill cursor is a local of a type no piece store can alias: a count kept in the
        // Block was reloaded after every piece store (a store-forwarding wait per piece).
        Block blocks[2];
        unsigned cur = 0;
        bool have_prev = false;
        Piece* put = blocks[0].pieces;
        Piece* full = put + kBlock;
        Scanner scanner(classes, p);
        auto emit = [&](size_t b, size_t e) FT_INLINE_LAMBDA {
            *put++ = Piece{p + b, e - b};
            if (put == full) {
                blocks[cur].count = kBlock;
                blocks[cur].prepare(sc.cache);
                if (have_prev) resolve(sc, blocks[cur ^ 1], false, o);
                have_prev = true;
                cur ^= 1;
                put = blocks[cur].pieces;
                full = put + kBlock;
            }
        };
        switch (bits_ok ? PatternKind(pattern) : PatternKind(-1)) {
            case PatternKind::kGpt2: split_bits<PatternKind::kGpt2>(scanner, max_digits, p, len, emit); break;
            case PatternKind::kLlama3: split_bits<PatternKind::kLlama3>(scanner, max_digits, p, len, emit); break;
            case PatternKind::kDeepSeek: split_bits<PatternKind::kDeepSeek>(scanner, max_digits, p, len, emit); break;
            default: scanner.split(PatternKind(pattern), max_digits, len, emit);
        }
        blocks[cur].count = size_t(put - blocks[cur].pieces);
        blocks[cur].prepare(sc.cache);
        if (have_prev) resolve(sc, blocks[cur ^ 1], false, o);
        resolve(sc, blocks[cur], true, o);
        return !(scanner.seen() & kUnsure);
    }

    void resolve(Scratch& sc, const Block& block, bool last, Out& o) const {
        resolve_block(sc.cache, vocab, block, last, o,
                      [&](const PieceKey* key, const uint8_t* q, size_t n, Out& out, const uint64_t* hash) {
                          encode_new_word(sc, key, q, n, out, hash);
                      });
    }

    // Without a pre-tokenizer the whole segment is one BPE word. When no merge can span a point
    // where word_boundary follows another character (checked at load), BPE on the pieces
    // between such points gives the same ids, and the pieces hit the word cache.
    void encode_words_at_boundaries(Scratch& sc, const uint8_t* p, size_t len, Out& o) const {
        if (ignore_merges) {  // the whole-segment lookup comes first
            const int32_t whole = vocab.find(p, len);
            if (whole >= 0) { o.put(whole); return; }
        }
        const std::string& wb = word_boundary;
        const size_t w = wb.size();
        size_t piece = 0;
        for (size_t i = 1; i + w <= len; ++i) {
            if (std::memcmp(p + i, wb.data(), w) != 0) continue;
            if (i >= w && std::memcmp(p + i - w, wb.data(), w) == 0) continue;  // inside a run
            encode_word(sc, p + piece, i - piece, o);
            piece = i;
        }
        encode_word(sc, p + piece, len - piece, o);
    }

    // Metaspace: spaces become the replacement, which is prepended per the scheme unless the
    // text already starts with it; with split, every replacement starts a new piece
    // (Split MergedWithNext).
    void metaspace_split(Scratch& sc, const uint8_t* p, size_t len, bool at_start, Out& o) const {
        std::string& buf = sc.meta;
        buf.clear();
        const std::string& rep = ms_replacement;
        for (size_t i = 0; i < len; ++i) {
            if (p[i] == ' ') buf.append(rep);
            else buf.push_back(char(p[i]));
        }
        const bool starts = buf.compare(0, rep.size(), rep) == 0;
        if (!starts && (ms_prepend == kPrependAlways || (ms_prepend == kPrependFirst && at_start)))
            buf.insert(0, rep);
        const uint8_t* b = reinterpret_cast<const uint8_t*>(buf.data());
        o.ensure(buf.size() + kSlack);
        if (!ms_split) {
            encode_word(sc, b, buf.size(), o);
            return;
        }
        size_t piece = 0;
        for (size_t i = 1; i + rep.size() <= buf.size(); ++i) {
            if (std::memcmp(b + i, rep.data(), rep.size()) == 0) {
                encode_word(sc, b + piece, i - piece, o);
                piece = i;
                i += rep.size() - 1;
            }
        }
        encode_word(sc, b + piece, buf.size() - piece, o);
    }
};

}  // namespace ft
