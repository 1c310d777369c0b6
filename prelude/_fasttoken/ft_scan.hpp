// The primitives fasttoken's pre-tokenizer scanners are built from: code point classes at a byte
// offset, runs of a class (eight ASCII bytes at a time where the class is letters), the
// whitespace rules the patterns share, and Split(behavior=Isolated) over a match function.
// ft_pretok.hpp writes each pattern with them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "ft_inline.hpp"
#include "ft_unicode.hpp"

namespace ft {

namespace swar {
constexpr uint64_t kOnes = 0x0101010101010101ULL, kHigh = 0x8080808080808080ULL;
// Bit 7 of each byte of the result is set where that byte of w is an ASCII letter.
FT_INLINE uint64_t letters(uint64_t w) {
    const uint64_t x = (w | 0x20 * kOnes) & ~kHigh;  // folds case; no byte exceeds 0x7F
    return (x + 0x1F * kOnes) & ~(x + 0x05 * kOnes) & ~w & kHigh;  // >= 'a' and < '{', ASCII
}
// ... where that byte is an ASCII digit or not ASCII at all.
FT_INLINE uint64_t digits_or_high(uint64_t w) {
    const uint64_t x = w & ~kHigh;
    return (((x + 0x50 * kOnes) & ~(x + 0x46 * kOnes)) | w) & kHigh;  // >= '0' and < ':'
}
FT_INLINE uint64_t load(const uint8_t* p) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    return w;
}
}  // namespace swar

class TextScanner {
protected:
    TextScanner(const ClassTable& classes, const uint8_t* s) : t_(classes), s_(s) {}

    // Class bits of the code point at byte i; cp and the next byte offset come back too.
    FT_INLINE uint8_t at(size_t i, uint32_t& cp, size_t& next) {
        if (s_[i] < 0x80) {
            cp = s_[i];
            next = i + 1;
            return t_.ascii(uint8_t(cp));
        }
        next = i;
        cp = next_cp(s_, next);
        const uint8_t c = t_.get(cp);
        seen_ |= c;
        return c;
    }
    FT_INLINE uint8_t cls(size_t i) {
        uint32_t cp;
        size_t next;
        return at(i, cp, next);
    }
    // End of the run of code points whose class has any of `Bits`. When the ASCII members of
    // Bits are exactly the letters, eight bytes are tested per step.
    template <uint8_t Bits>
    FT_INLINE size_t run(size_t i, size_t e) {
        constexpr bool kSwar = (Bits & kLetter) && !(Bits & (kNumber | kSpace | kPunct | kSymbol | kWord));
        for (;;) {
            if (kSwar) {
                while (i + 8 <= e) {
                    const uint64_t non = ~swar::letters(swar::load(s_ + i)) & swar::kHigh;
                    if (non) {
                        i += size_t(__builtin_ctzll(non)) >> 3;
                        break;
                    }
                    i += 8;
                }
            }
            if (i >= e) return e;
            const uint8_t b = s_[i];
            if (b < 0x80) {
                if (!(t_.ascii(b) & Bits)) return i;
                ++i;
                continue;
            }
            uint32_t cp;
            size_t next;
            if (!(at(i, cp, next) & Bits)) return i;
            i = next;
        }
    }
    // At most `limit` code points of the run.
    size_t run_limited(size_t i, size_t e, uint8_t bits, size_t limit) {
        while (i < e && limit) {
            uint32_t cp;
            size_t next;
            if (!(at(i, cp, next) & bits)) break;
            i = next;
            --limit;
        }
        return i;
    }
    template <uint8_t Excluded>
    FT_INLINE size_t run_other(size_t i, size_t e) {  // run of classes outside `Excluded`
        while (i < e) {
            const uint8_t b = s_[i];
            if (b < 0x80) {
                if (t_.ascii(b) & Excluded) break;
                ++i;
                continue;
            }
            uint32_t cp;
            size_t next;
            if (at(i, cp, next) & Excluded) break;
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

    // Isolated pieces of [begin, end) under `match`; returns where it stopped (end unless `stop`
    // came first).
    template <class Match, class Emit>
    FT_INLINE size_t isolated(size_t begin, size_t end, size_t stop, Match&& match, Emit&& emit) {
        size_t i = begin, gap = begin;
        while (i < end) {
            const size_t m = match(i, end);
            if (m) {
                if (gap < i) emit(gap, i);
                emit(i, m);
                i = gap = m;
                if (i >= stop) return i;
            } else {
                size_t next = i;
                next_cp(s_, next);
                i = next;
            }
        }
        if (gap < end) emit(gap, end);
        return end;
    }

    const ClassTable& t_;
    const uint8_t* s_;
    uint8_t seen_ = 0;
};

}  // namespace ft
