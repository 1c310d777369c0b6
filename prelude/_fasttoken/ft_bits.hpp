// Bit-parallel splitting for the Llama-3 / Qwen2, GPT-2 and DeepSeek-V3 patterns over ASCII.
//
// The scanner of ft_pretok.hpp decides each piece with a chain of branches on its first bytes;
// on English (about four bytes a piece) those branches, unpredictable from one piece to the
// next, were most of its cost. Here 64 bytes are classified at once (SSE2) into one bit per
// byte per class, and the set of piece starts is computed with shifts and masks; pieces are
// then read off the start mask with count-trailing-zeros.
//
// The masks reproduce the regex exactly only for "simple" windows: ASCII, no run of two or
// more whitespace characters, and per pattern: no apostrophe (Llama-3, GPT-2: contractions),
// no control character (DeepSeek: neither punctuation nor a letter prefix there). Any other window is split by the
// scanner (the caller's fallback); tests/tokenizer compare both on random text. Matching from
// a piece start never looks back, so a window starting at a known start behaves as if the
// text began there.
//
// Llama-3 starts, for a character at j with p = class of j-1 and pp = class of j-2 (O: ASCII
// other than letters, digits and whitespace; Ws: whitespace other than \r \n):
//   letter: p is not a letter, not Ws (" word"), and not an O that starts its own piece,
//           which an O does unless pp is O (a run of them) or a space (" ?[^\s\p{L}\p{N}]+");
//   digit:  p is not a digit, or it is the max_digits-th digit after a start;
//   O:      p is neither O nor a space;
//   Ws:     always (every whitespace run here is one character);
//   \r \n:  p is not O (O runs take the newlines after them: "[\r\n]*").
// DeepSeek-V3's main regex gives the same starts on these windows: its "[!-/:-@[-`{-~][A-Za-z]+"
// and "[^\r\n\p{L}\p{P}\p{S}]?\p{L}+" together are Llama-3's letter prefix once control
// characters are refused, its digits are split off first in threes, and it has no contractions.
// GPT-2 (" ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"): a letter, digit or O starts a piece unless
// p is of its class or a space; whitespace always does.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "ft_pretok.hpp"
#include "ft_unicode.hpp"

namespace ft {

struct Classes64 {
    uint64_t alpha = 0, digit = 0, space = 0, newline = 0, blank = 0, other = 0;
    uint64_t high = 0, apostrophe = 0, control = 0;  // non-ASCII; '; ASCII controls but \t-\r
};

// Class bits of the 64 bytes at p (all readable). Only the classes pattern K reads are
// computed (GPT-2 needs no newline or control bits, Llama-3 no control bits, DeepSeek no
// apostrophes): a tenth of the instructions of a window.
template <PatternKind K>
inline Classes64 classify64(const uint8_t* p) {
    Classes64 c;
#if defined(__SSE2__)
    // Signed byte compares: bytes >= 0x80 are negative, so they fail every range test below.
    const __m128i k20 = _mm_set1_epi8(0x20);
    for (int k = 0; k < 4; ++k) {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * k));
        const __m128i lower = _mm_or_si128(v, k20);
        const __m128i a = _mm_and_si128(_mm_cmpgt_epi8(lower, _mm_set1_epi8(0x60)),
                                        _mm_cmplt_epi8(lower, _mm_set1_epi8(0x7B)));
        const __m128i d = _mm_and_si128(_mm_cmpgt_epi8(v, _mm_set1_epi8(0x2F)),
                                        _mm_cmplt_epi8(v, _mm_set1_epi8(0x3A)));
        const __m128i blank = _mm_cmpeq_epi8(v, k20);
        const __m128i tab_to_cr = _mm_and_si128(_mm_cmpgt_epi8(v, _mm_set1_epi8(0x08)),
                                                _mm_cmplt_epi8(v, _mm_set1_epi8(0x0E)));
        const int s = 16 * k;
        auto bits = [s](__m128i m) { return uint64_t(uint16_t(_mm_movemask_epi8(m))) << s; };
        c.alpha |= bits(a);
        c.digit |= bits(d);
        c.space |= bits(_mm_or_si128(blank, tab_to_cr));
        c.blank |= bits(blank);
        c.high |= bits(v);
        if constexpr (K != PatternKind::kGpt2) {
            const __m128i nl = _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8(0x0A)),
                                            _mm_cmpeq_epi8(v, _mm_set1_epi8(0x0D)));
            c.newline |= bits(nl);
        }
        if constexpr (K != PatternKind::kDeepSeek) c.apostrophe |= bits(_mm_cmpeq_epi8(v, _mm_set1_epi8(0x27)));
        if constexpr (K == PatternKind::kDeepSeek) {
            const __m128i below_blank =
                _mm_and_si128(_mm_cmpgt_epi8(v, _mm_set1_epi8(-1)), _mm_cmplt_epi8(v, k20));
            const __m128i control = _mm_or_si128(_mm_andnot_si128(tab_to_cr, below_blank),
                                                 _mm_cmpeq_epi8(v, _mm_set1_epi8(0x7F)));
            c.control |= bits(control);
        }
    }
#else
    for (int j = 0; j < 64; ++j) {
        const uint8_t b = p[j];
        const uint64_t bit = uint64_t(1) << j;
        const uint8_t l = b | 0x20;
        if (b >= 0x80) c.high |= bit;
        else if (l >= 'a' && l <= 'z') c.alpha |= bit;
        else if (b >= '0' && b <= '9') c.digit |= bit;
        else if (b == ' ' || (b >= 0x09 && b <= 0x0D)) {
            c.space |= bit;
            if (b == ' ') c.blank |= bit;
            if (b == '\n' || b == '\r') c.newline |= bit;
        } else if (b < 0x20 || b == 0x7F) c.control |= bit;
        if (b == '\'') c.apostrophe |= bit;
    }
#endif
    c.other = ~(c.alpha | c.digit | c.space | c.high);
    return c;
}

// Whether the ASCII classes of `t` are the ones bit_starts assumes (letters, digits, and
// \t \n \v \f \r space as the only whitespace; for DeepSeek, every other printable byte
// punctuation or a symbol); checked once per tokenizer.
inline bool ascii_classes_match(const ClassTable& t, PatternKind kind) {
    for (int b = 0; b < 128; ++b) {
        const uint8_t l = uint8_t(b | 0x20);
        const uint8_t want = (l >= 'a' && l <= 'z') ? kLetter
                             : (b >= '0' && b <= '9') ? kNumber
                             : (b == ' ' || (b >= 0x09 && b <= 0x0D)) ? kSpace
                                                                      : 0;
        const uint8_t got = t.ascii(uint8_t(b));
        if ((got & (kLetter | kNumber | kSpace)) != want) return false;
        const bool printable_other = !want && b > 0x20 && b < 0x7F;
        if (kind == PatternKind::kDeepSeek && printable_other && !(got & (kPunct | kSymbol))) return false;
    }
    return true;
}

// Piece starts of `kind` in the n <= 64 bytes at p (bit j: byte j starts a piece; bit 0
// always). `refused` gets the bytes that make the window not simple (see the top of the file);
// when it is not 0, only the starts below its lowest bit are exact: each start is decided by
// the classes of its byte and of the two before it (max_digits before it for digits), never
// by a later byte.
template <PatternKind kind>
inline uint64_t bit_starts(const uint8_t* p, size_t n, int max_digits, uint64_t& refused) {
    Classes64 c;
    if (n == 64) {
        c = classify64<kind>(p);
    } else {
        uint8_t buf[64] = {};
        std::memcpy(buf, p, n);
        c = classify64<kind>(buf);
    }
    const uint64_t valid = n == 64 ? ~uint64_t(0) : (uint64_t(1) << n) - 1;
    const uint64_t a = c.alpha & valid, d = c.digit & valid, w = c.space & valid;
    const uint64_t o = c.other & valid, nl = c.newline & valid, blank = c.blank & valid;
    refused = c.high | (w & (w << 1));
    if constexpr (kind == PatternKind::kDeepSeek) {
        refused |= c.control;
        max_digits = 3;
    } else {
        refused |= c.apostrophe;
    }
    refused &= valid;
    if constexpr (kind == PatternKind::kGpt2) {
        const uint64_t after_blank = blank << 1;
        return ((a & ~(a << 1)) | (d & ~(d << 1)) | (o & ~(o << 1))) & ~after_blank & valid | w | 1;
    }
    // \p{N}{1,max}: a digit run starts a piece every max digits from its first one.
    uint64_t digit_starts = d;
    if (max_digits > 1 && max_digits < 64) {
        uint64_t whole = d;  // bit j: j and the max - 1 bytes before it are digits
        for (int k = 1; k < max_digits; ++k) whole &= d << k;
        digit_starts = d & ~(d << 1);
        for (uint64_t at = digit_starts; at;) {
            at = (at << max_digits) & whole;
            digit_starts |= at;
        }
    }
    const uint64_t ws = w & ~nl;
    const uint64_t o_alone = (o << 1) & ~(o << 2) & ~(blank << 2);  // j-1 is an O starting a piece
    const uint64_t letter_starts = a & ~(a << 1) & ~(ws << 1) & ~o_alone;
    const uint64_t other_starts = o & ~(o << 1) & ~(blank << 1);
    const uint64_t newline_starts = nl & ~(o << 1);
    return (letter_starts | digit_starts | other_starts | ws | newline_starts | 1) & valid;
}

// Splits p[0, len) into pieces (emit(begin, end) for each, in order), 64 bytes at a time through
// bit_starts. In a window that is not simple, the pieces that end before its first refused
// byte still come from the masks; the scanner takes over at the last start before that byte
// and hands back at the first piece end past it, as many windows of real text hold a non-ASCII
// character and the scanner is slower than the masks. A piece longer
// than a window goes to the scanner too.
template <PatternKind kind, class Emit>
FT_INLINE void split_bits(Scanner& scanner, int max_digits, const uint8_t* p, size_t len, Emit& emit) {
    size_t pos = 0;
    while (pos < len) {
        const size_t n = std::min<size_t>(64, len - pos);
        uint64_t refused;
        uint64_t starts = bit_starts<kind>(p + pos, n, max_digits, refused);
        if (refused) starts &= (refused & (0 - refused)) - 1;  // the starts below the first refused byte
        size_t prev = pos;
        for (uint64_t m = starts & (starts - 1); m; m &= m - 1) {
            const size_t b = pos + size_t(__builtin_ctzll(m));
            emit(prev, b);
            prev = b;
        }
        if (!refused) {
            if (pos + n == len) {  // the window ends the text: its last piece is complete
                emit(prev, len);
                return;
            }
            if (prev > pos) {  // the last piece may go on past the window
                pos = prev;
                continue;
            }
            pos = scanner.split_until(kind, max_digits, pos, len, pos + 64, emit);
            continue;
        }
        pos = scanner.split_until(kind, max_digits, prev, len, pos + size_t(__builtin_ctzll(refused)) + 1, emit);
    }
}

// The first j >= at where an ASCII letter, a space and an ASCII letter meet at j - 1, j, j + 1,
// or n. Such a j starts a piece in all three patterns whatever came before: no alternative
// matches a letter followed by a space (letter runs stop at the space; the other alternatives
// take no letters). Long texts are cut there for parallel encoding.
inline size_t next_sure_start(const uint8_t* p, size_t n, size_t at) {
    auto letter = [](uint8_t b) { return uint8_t((b | 0x20) - 'a') < 26; };
    for (size_t j = at < 1 ? 1 : at; j + 1 < n; ++j)
        if (p[j] == ' ' && letter(p[j - 1]) && letter(p[j + 1])) return j;
    return n;
}

}  // namespace ft
