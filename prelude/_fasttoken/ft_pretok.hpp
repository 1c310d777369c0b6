// Hand-written scanners that split text exactly as the common pre-tokenizer regexes do under
// Oniguruma's leftmost-first backtracking (the engine HF runs them with). Each scanner answers
// "where does the match starting at byte i end" (0: no match there); `isolated` turns that into
// HF's Split(behavior=Isolated) pieces: every match, and every unmatched gap, is one piece.
//
// Speed: most input is ASCII, so every step tests the byte first and reads the class of an ASCII
// byte from a 128-entry table; only other bytes decode a code point. Letter runs (most of the
// text, ft_scan.hpp) and DeepSeek's search for digits/CJK go eight bytes at a time (SWAR on a
// 64-bit word).
#pragma once

#include <cstddef>
#include <cstdint>

#include "ft_inline.hpp"
#include "ft_scan.hpp"
#include "ft_unicode.hpp"

namespace ft {

enum class PatternKind : int { kGpt2 = 0, kLlama3 = 1, kDeepSeek = 2 };

class Scanner : TextScanner {
public:
    Scanner(const ClassTable& classes, const uint8_t* s) : TextScanner(classes, s) {}

    uint8_t seen() const { return seen_; }

    // Calls emit(begin, end) for each piece of s[0, end).
    template <class Emit>
    void split(PatternKind kind, int max_digits, size_t end, Emit&& emit) {
        split_until(kind, max_digits, 0, end, kNoStop, emit);
    }

    // The pieces from `begin` (a piece start) until one ends at or after `stop`; returns that
    // end (or `end`). Matching never looks behind, so any piece start is a valid `begin`.
    template <class Emit>
    size_t split_until(PatternKind kind, int max_digits, size_t begin, size_t end, size_t stop, Emit&& emit) {
        switch (kind) {
            case PatternKind::kGpt2:
                return isolated(begin, end, stop, [&](size_t i, size_t e) { return gpt2(i, e); }, emit);
            case PatternKind::kLlama3:
                return isolated(begin, end, stop, [&](size_t i, size_t e) { return llama3(i, e, max_digits); },
                                emit);
            case PatternKind::kDeepSeek:
                return deepseek(begin, end, stop, emit);
        }
        return end;
    }
    static constexpr size_t kNoStop = ~size_t(0);

private:
    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
    FT_INLINE size_t gpt2(size_t i, size_t e) {
        uint32_t cp;
        size_t next;
        const uint8_t c = at(i, cp, next);
        if (c & kLetter) return run<kLetter>(next, e);
        if (cp == '\'' && next < e) {
            const uint8_t b = s_[next];
            if (b == 's' || b == 't' || b == 'm' || b == 'd') return next + 1;
            if (next + 1 < e) {
                const uint8_t b2 = s_[next + 1];
                if ((b == 'r' && b2 == 'e') || (b == 'v' && b2 == 'e') || (b == 'l' && b2 == 'l'))
                    return next + 2;
            }
        }
        size_t k = i;
        uint8_t ck = c;
        if (cp == ' ' && next < e) {
            uint32_t cp2;
            ck = at(next, cp2, k);
            if (ck & kLetter) return run<kLetter>(k, e);
            k = next;
        }
        if (ck & kNumber) return run<kNumber>(k, e);
        if (!(ck & (kSpace | kLetter | kNumber))) return run_other<kSpace | kLetter | kNumber>(k, e);
        return spaces(i, e, false);
    }

    // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}|
    //  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
    FT_INLINE size_t llama3(size_t i, size_t e, int max_digits) {
        uint32_t cp;
        size_t next;
        const uint8_t c = at(i, cp, next);
        if (c & kLetter) return run<kLetter>(next, e);
        if (cp == '\'' && next < e) {
            const size_t m = contraction(next, e);
            if (m) return m;
        }
        if (c & kNumber) return run_limited(i, e, kNumber, size_t(max_digits));
        if (next >= e) {  // one character left: it is the whole piece
            return next;
        }
        uint32_t cp2;
        size_t next2;
        const uint8_t c2 = at(next, cp2, next2);
        // [^\r\n\p{L}\p{N}]?\p{L}+ (c is neither L nor N here)
        if ((c2 & kLetter) && cp != '\r' && cp != '\n') return run<kLetter>(next2, e);
        size_t k = i;
        uint8_t ck = c;
        if (cp == ' ' && !(c2 & (kSpace | kLetter | kNumber))) { k = next; ck = c2; }
        if (!(ck & (kSpace | kLetter | kNumber)))
            return newlines(run_other<kSpace | kLetter | kNumber>(k, e), e);
        return spaces(i, e, true);
    }

    // Case-insensitive contraction after an apostrophe. Oniguruma folds U+017F (long s) to 's';
    // no other code point folds to t, r, e, v, m, l or d.
    size_t contraction(size_t j, size_t e) const {
        const uint8_t b = s_[j] | 0x20;
        if (s_[j] == 0xC5 && j + 1 < e && s_[j + 1] == 0xBF) return j + 2;
        if (!((s_[j] >= 'A' && s_[j] <= 'Z') || (s_[j] >= 'a' && s_[j] <= 'z'))) return 0;
        if (b == 's' || b == 't' || b == 'm' || b == 'd') return j + 1;
        if (j + 1 < e) {
            const uint8_t raw2 = s_[j + 1];
            const bool alpha2 = (raw2 >= 'A' && raw2 <= 'Z') || (raw2 >= 'a' && raw2 <= 'z');
            const uint8_t b2 = raw2 | 0x20;
            if (alpha2 && (((b == 'r' || b == 'v') && b2 == 'e') || (b == 'l' && b2 == 'l')))
                return j + 2;
        }
        return 0;
    }

    // DeepSeek-V3: Split(\p{N}{1,3}), then Split(CJK/kana runs), then the main regex, each
    // Isolated and each applied to the pieces the previous one produced. No code point is both
    // a number and CJK, so one pass does all three: runs of numbers (cut every 3), runs of CJK,
    // and the main regex over each stretch between them.
    template <class Emit>
    size_t deepseek(size_t begin, size_t end, size_t stop, Emit&& emit) {
        size_t i = begin, gap = begin;
        // An earlier call already swept past `begin` and found no number or CJK before
        // clear_to_: resume there. Each call ran its own sweep to the next one, and split_bits
        // calls once per 64-byte window that holds a non-ASCII byte, so a long stretch without
        // numbers or CJK (emoji and letters) was swept again per window: quadratic in the
        // stretch's length.
        size_t sweep = i;  // no number or CJK in [sweep, i)
        if (clear_end_ == end && clear_from_ <= begin && begin < clear_to_) {
            sweep = clear_from_;
            i = clear_to_;
        }
        while (i < end) {
            while (i + 8 <= end) {  // ASCII other than digits is never a stop
                const uint64_t stop = swar::digits_or_high(swar::load(s_ + i));
                if (stop) {
                    i += size_t(__builtin_ctzll(stop)) >> 3;
                    break;
                }
                i += 8;
            }
            if (i >= end) break;
            uint32_t cp;
            size_t next;
            const uint8_t c = at(i, cp, next);
            if ((c & kNumber) || cjk(cp)) remember_clear(sweep, i, end);
            if (c & kNumber) {
                const size_t reached = main_pieces(gap, i, stop, emit);
                if (reached < i) return reached;
                while (i < end && (cls(i) & kNumber)) {
                    const size_t last = run_limited(i, end, kNumber, 3);
                    emit(i, last);
                    i = last;
                }
                gap = sweep = i;
                if (i >= stop) return i;
            } else if (cjk(cp)) {
                const size_t reached = main_pieces(gap, i, stop, emit);
                if (reached < i) return reached;
                size_t j = next;
                while (j < end) {
                    size_t k = j;
                    if (!cjk(next_cp(s_, k))) break;
                    j = k;
                }
                emit(i, j);
                i = gap = sweep = j;
                if (i >= stop) return i;
            } else {
                i = next;
            }
        }
        remember_clear(sweep, end, end);
        return main_pieces(gap, end, stop, emit);
    }
    void remember_clear(size_t from, size_t to, size_t end) {
        clear_from_ = from;
        clear_to_ = to;
        clear_end_ = end;
    }
    // [clear_from_, clear_to_) of the text ending at clear_end_ holds no number or CJK.
    size_t clear_from_ = 0, clear_to_ = 0, clear_end_ = 0;
    // The main regex over [begin, end); returns where it stopped (end unless `stop` came first).
    template <class Emit>
    FT_INLINE size_t main_pieces(size_t begin, size_t end, size_t stop, Emit&& emit) {
        if (begin >= end) return end;
        return isolated(begin, end, stop, [&](size_t a, size_t b) { return deepseek_main(a, b); }, emit);
    }
    static bool cjk(uint32_t cp) {
        return (cp >= 0x4E00 && cp <= 0x9FA5) || (cp >= 0x3040 && cp <= 0x30FF);
    }
    static bool ascii_punct(uint32_t cp) {
        return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) ||
               (cp >= 0x5B && cp <= 0x60) || (cp >= 0x7B && cp <= 0x7E);
    }
    static bool ascii_alpha(uint8_t b) { return (b >= 'A' && b <= 'Z') || (b >= 'a' && b <= 'z'); }

    // [!-/:-@[-`{-~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|
    // \s*[\r\n]+|\s+(?!\S)|\s+
    FT_INLINE size_t deepseek_main(size_t i, size_t e) {
        uint32_t cp;
        size_t next;
        const uint8_t c = at(i, cp, next);
        if (c & (kLetter | kMark)) return run<kLetter | kMark>(next, e);
        if (ascii_punct(cp) && next < e && ascii_alpha(s_[next])) {
            size_t j = next;
            while (j < e && ascii_alpha(s_[j])) ++j;
            return j;
        }
        if (cp != '\r' && cp != '\n' && !(c & (kLetter | kPunct | kSymbol)) && next < e &&
            (cls(next) & (kLetter | kMark))) {
            size_t after;
            uint32_t cp2;
            at(next, cp2, after);
            return run<kLetter | kMark>(after, e);
        }
        size_t k = i;
        uint8_t ck = c;
        if (cp == ' ' && next < e) {
            const uint8_t c2 = cls(next);
            if (c2 & (kPunct | kSymbol)) { k = next; ck = c2; }
        }
        if (ck & (kPunct | kSymbol)) return newlines(run<kPunct | kSymbol>(k, e), e);
        if (c & kSpace) return spaces(i, e, true);
        return 0;
    }
};

}  // namespace ft