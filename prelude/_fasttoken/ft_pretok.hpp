// Hand-written scanners that split text exactly as the common pre-tokenizer regexes do under
// Oniguruma's leftmost-first backtracking (the engine HF runs them with). Each scanner answers
// "where does the match starting at byte i end" (0: no match there); `isolated` turns that into
// HF's Split(behavior=Isolated) pieces: every match, and every unmatched gap, is one piece.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ft_unicode.hpp"

namespace ft {

enum class PatternKind : int { kGpt2 = 0, kLlama3 = 1, kDeepSeek = 2 };

class Scanner {
public:
    Scanner(const ClassTable& classes, const uint8_t* s) : t_(classes), s_(s) {}

    uint8_t seen() const { return seen_; }

    // Calls emit(begin, end) for each piece of s[0, end).
    template <class Emit>
    void split(PatternKind kind, int max_digits, size_t end, Emit&& emit) {
        switch (kind) {
            case PatternKind::kGpt2:
                isolated(0, end, [&](size_t i, size_t e) { return gpt2(i, e); }, emit);
                break;
            case PatternKind::kLlama3:
                isolated(0, end, [&](size_t i, size_t e) { return llama3(i, e, max_digits); }, emit);
                break;
            case PatternKind::kDeepSeek:
                deepseek(0, end, emit);
                break;
        }
    }

private:
    // Class bits of the code point at byte i; cp and the next byte offset come back too.
    uint8_t at(size_t i, uint32_t& cp, size_t& next) {
        if (s_[i] < 0x80) {
            cp = s_[i];
            next = i + 1;
            return t_.get(cp);
        }
        next = i;
        cp = next_cp(s_, next);
        const uint8_t c = t_.get(cp);
        seen_ |= c;
        return c;
    }
    uint8_t cls(size_t i) {
        uint32_t cp;
        size_t next;
        return at(i, cp, next);
    }
    // End of the run of code points whose class has any of `bits`, at most `limit` of them.
    size_t run(size_t i, size_t e, uint8_t bits, size_t limit = ~size_t(0)) {
        while (i < e && limit) {
            uint32_t cp;
            size_t next;
            if (!(at(i, cp, next) & bits)) break;
            i = next;
            --limit;
        }
        return i;
    }
    size_t run_other(size_t i, size_t e, uint8_t excluded) {  // run of classes outside `excluded`
        while (i < e) {
            uint32_t cp;
            size_t next;
            if (at(i, cp, next) & excluded) break;
            i = next;
        }
        return i;
    }
    size_t newlines(size_t i, size_t e) const {
        while (i < e && (s_[i] == '\r' || s_[i] == '\n')) ++i;
        return i;
    }

    // `\s*[\r\n]+|\s+(?!\S)|\s+` (with_newlines) or `\s+(?!\S)|\s+` starting at a space.
    size_t spaces(size_t i, size_t e, bool with_newlines) {
        size_t j = i, last = i, after_newline = 0;
        while (j < e) {
            uint32_t cp;
            size_t next;
            if (!(at(j, cp, next) & kSpace)) break;
            if (cp == '\r' || cp == '\n') after_newline = next;
            last = j;
            j = next;
        }
        if (with_newlines && after_newline) return after_newline;
        if (j == e) return j;     // \s+(?!\S): the run reaches the end of the piece
        if (last > i) return last;  // \s+(?!\S): give back the space before the non-space
        return j;                   // \s+
    }

    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
    size_t gpt2(size_t i, size_t e) {
        uint32_t cp;
        size_t next;
        const uint8_t c = at(i, cp, next);
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
        if (cp == ' ' && next < e) { k = next; ck = cls(next); }
        if (ck & kLetter) return run(k, e, kLetter);
        if (ck & kNumber) return run(k, e, kNumber);
        if (!(ck & (kSpace | kLetter | kNumber))) return run_other(k, e, kSpace | kLetter | kNumber);
        return spaces(i, e, false);
    }

    // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}|
    //  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
    size_t llama3(size_t i, size_t e, int max_digits) {
        uint32_t cp;
        size_t next;
        const uint8_t c = at(i, cp, next);
        if (cp == '\'' && next < e) {
            const size_t m = contraction(next, e);
            if (m) return m;
        }
        if (c & kLetter) return run(i, e, kLetter);
        if (cp != '\r' && cp != '\n' && !(c & kNumber) && next < e && (cls(next) & kLetter))
            return run(next, e, kLetter);
        if (c & kNumber) return run(i, e, kNumber, size_t(max_digits));
        size_t k = i;
        uint8_t ck = c;
        if (cp == ' ' && next < e) {
            const uint8_t c2 = cls(next);
            if (!(c2 & (kSpace | kLetter | kNumber))) { k = next; ck = c2; }
        }
        if (!(ck & (kSpace | kLetter | kNumber)))
            return newlines(run_other(k, e, kSpace | kLetter | kNumber), e);
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
    // Isolated and each applied to the pieces the previous one produced.
    template <class Emit>
    void deepseek(size_t begin, size_t end, Emit&& emit) {
        size_t i = begin, gap = begin;
        while (i < end) {
            uint32_t cp;
            size_t next;
            if (at(i, cp, next) & kNumber) {
                if (gap < i) deepseek_cjk(gap, i, emit);
                gap = run(i, end, kNumber, 3);
                emit(i, gap);
                i = gap;
            } else {
                i = next;
            }
        }
        if (gap < end) deepseek_cjk(gap, end, emit);
    }
    static bool cjk(uint32_t cp) {
        return (cp >= 0x4E00 && cp <= 0x9FA5) || (cp >= 0x3040 && cp <= 0x30FF);
    }
    template <class Emit>
    void deepseek_cjk(size_t begin, size_t end, Emit&& emit) {
        size_t i = begin, gap = begin;
        while (i < end) {
            size_t next = i;
            if (cjk(next_cp(s_, next))) {
                if (gap < i) isolated(gap, i, [&](size_t a, size_t b) { return deepseek_main(a, b); }, emit);
                size_t j = next;
                while (j < end) {
                    size_t k = j;
                    if (!cjk(next_cp(s_, k))) break;
                    j = k;
                }
                emit(i, j);
                i = gap = j;
            } else {
                i = next;
            }
        }
        if (gap < end) isolated(gap, end, [&](size_t a, size_t b) { return deepseek_main(a, b); }, emit);
    }
    static bool ascii_punct(uint32_t cp) {
        return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) ||
               (cp >= 0x5B && cp <= 0x60) || (cp >= 0x7B && cp <= 0x7E);
    }
    static bool ascii_alpha(uint8_t b) { return (b >= 'A' && b <= 'Z') || (b >= 'a' && b <= 'z'); }

    // [!-/:-@[-`{-~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|
    // \s*[\r\n]+|\s+(?!\S)|\s+
    size_t deepseek_main(size_t i, size_t e) {
        uint32_t cp;
        size_t next;
        const uint8_t c = at(i, cp, next);
        if (ascii_punct(cp) && next < e && ascii_alpha(s_[next])) {
            size_t j = next;
            while (j < e && ascii_alpha(s_[j])) ++j;
            return j;
        }
        if (c & (kLetter | kMark)) return run(i, e, kLetter | kMark);
        if (cp != '\r' && cp != '\n' && !(c & (kLetter | kPunct | kSymbol)) && next < e &&
            (cls(next) & (kLetter | kMark)))
            return run(next, e, kLetter | kMark);
        size_t k = i;
        uint8_t ck = c;
        if (cp == ' ' && next < e) {
            const uint8_t c2 = cls(next);
            if (c2 & (kPunct | kSymbol)) { k = next; ck = c2; }
        }
        if (ck & (kPunct | kSymbol)) return newlines(run(k, e, kPunct | kSymbol), e);
        if (c & kSpace) return spaces(i, e, true);
        return 0;
    }

    template <class Match, class Emit>
    void isolated(size_t begin, size_t end, Match&& match, Emit&& emit) {
        size_t i = begin, gap = begin;
        while (i < end) {
            const size_t m = match(i, end);
            if (m) {
                if (gap < i) emit(gap, i);
                emit(i, m);
                i = gap = m;
            } else {
                size_t next = i;
                next_cp(s_, next);
                i = next;
            }
        }
        if (gap < end) emit(gap, end);
    }

    const ClassTable& t_;
    const uint8_t* s_;
    uint8_t seen_ = 0;
};

}  // namespace ft
