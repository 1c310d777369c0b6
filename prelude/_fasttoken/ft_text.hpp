// Python str -> UTF-8 without the GIL.
//
// PyUnicode_AsUTF8AndSize encodes a non-ASCII str one code point at a time with the GIL held
// (a visible share of a whole encode, and serial in encode_batch). A str is immutable, so its
// PEP 393 buffer can be read by the encoding thread: ASCII stretches are packed 8 or 16
// characters at a time, the rest one at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace ft {

// A str as core.pyx hands it over: kind 0 is UTF-8 bytes already (an ASCII str's buffer),
// kinds 1, 2, 4 are PEP 393 code units of that many bytes.
struct TextRef {
    const void* data;
    size_t length;  // bytes for kind 0, code points otherwise
    int kind;
};

namespace detail {
inline uint8_t* put_cp(uint8_t* w, uint32_t c) {
    if (c < 0x80) {
        *w++ = uint8_t(c);
    } else if (c < 0x800) {
        *w++ = uint8_t(0xC0 | (c >> 6));
        *w++ = uint8_t(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
        *w++ = uint8_t(0xE0 | (c >> 12));
        *w++ = uint8_t(0x80 | ((c >> 6) & 0x3F));
        *w++ = uint8_t(0x80 | (c & 0x3F));
    } else {
        *w++ = uint8_t(0xF0 | (c >> 18));
        *w++ = uint8_t(0x80 | ((c >> 12) & 0x3F));
        *w++ = uint8_t(0x80 | ((c >> 6) & 0x3F));
        *w++ = uint8_t(0x80 | (c & 0x3F));
    }
    return w;
}
inline bool surrogate(uint32_t c) { return c >= 0xD800 && c <= 0xDFFF; }
}  // namespace detail

// The UTF-8 of t in buf (grown as needed, never shrunk; 16 zero bytes follow the text, as
// after CPython's own UTF-8 buffer the readers may look a little past the end). False when
// t holds a lone surrogate, which has no UTF-8 (the caller lets CPython raise its error).
inline bool to_utf8(const TextRef& t, std::vector<uint8_t>& buf, const uint8_t*& out, size_t& out_len) {
    if (t.kind == 0) {
        out = static_cast<const uint8_t*>(t.data);
        out_len = t.length;
        return true;
    }
    const size_t n = t.length;
    const size_t need = n * (t.kind == 1 ? 2 : t.kind == 2 ? 3 : 4) + 16;
    if (buf.size() < need) buf.resize(need);
    uint8_t* w = buf.data();
    size_t i = 0;
    if (t.kind == 1) {
        const uint8_t* s = static_cast<const uint8_t*>(t.data);
        while (i < n) {
#if defined(__SSE2__)
            for (; i + 16 <= n; i += 16) {
                const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
                if (_mm_movemask_epi8(v)) break;
                _mm_storeu_si128(reinterpret_cast<__m128i*>(w), v);
                w += 16;
            }
#endif
            for (const size_t stop = i + 16 < n ? i + 16 : n; i < stop; ++i) w = detail::put_cp(w, s[i]);
        }
    } else if (t.kind == 2) {
        const uint16_t* s = static_cast<const uint16_t*>(t.data);
        while (i < n) {
#if defined(__SSE2__)
            // 16 units a step (one full store): this loop runs on the calling thread before the
            // parallel split of a long text.
            for (; i + 16 <= n; i += 16) {
                const __m128i v0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
                const __m128i v1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 8));
                // any unit >= 0x80: its high 9 bits are not all zero
                if (_mm_movemask_epi8(_mm_cmpeq_epi16(_mm_and_si128(_mm_or_si128(v0, v1), _mm_set1_epi16(-128)),
                                                      _mm_setzero_si128())) != 0xFFFF)
                    break;
                _mm_storeu_si128(reinterpret_cast<__m128i*>(w), _mm_packus_epi16(v0, v1));
                w += 16;
            }
#endif
            for (const size_t stop = i + 16 < n ? i + 16 : n; i < stop; ++i) {
                if (detail::surrogate(s[i])) return false;
                w = detail::put_cp(w, s[i]);
            }
        }
    } else {
        const uint32_t* s = static_cast<const uint32_t*>(t.data);
        for (; i < n; ++i) {
            if (detail::surrogate(s[i])) return false;
            w = detail::put_cp(w, s[i]);
        }
    }
    std::memset(w, 0, 16);
    out = buf.data();
    out_len = size_t(w - buf.data());
    return true;
}

}  // namespace ft
