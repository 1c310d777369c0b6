// UTF-8 helpers, code-point property tables and lossy UTF-8 repair for fasttoken (NFC: ft_nfc.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace ft {

// Class bits; unicode_data.py builds the table with the same values.
enum : uint8_t {
    kLetter = 1, kNumber = 2, kSpace = 4, kPunct = 8, kSymbol = 16, kMark = 32, kWord = 64,
    kUnsure = 128,
};

constexpr uint32_t kNumCodePoints = 0x110000;

// Decodes one code point at s[i] and advances i. Input text always comes from a Python str
// (encoded by CPython), so it is valid UTF-8 and needs no checks.
inline uint32_t next_cp(const uint8_t* s, size_t& i) {
    const uint32_t b = s[i];
    if (b < 0x80) { i += 1; return b; }
    if (b < 0xE0) { i += 2; return ((b & 0x1F) << 6) | (s[i - 1] & 0x3F); }
    if (b < 0xF0) {
        i += 3;
        return ((b & 0x0F) << 12) | ((s[i - 2] & 0x3F) << 6) | (s[i - 1] & 0x3F);
    }
    i += 4;
    return ((b & 0x07) << 18) | ((s[i - 3] & 0x3F) << 12) | ((s[i - 2] & 0x3F) << 6) |
           (s[i - 1] & 0x3F);
}

inline void put_cp(std::string& out, uint32_t c) {
    if (c < 0x80) {
        out.push_back(char(c));
    } else if (c < 0x800) {
        out.push_back(char(0xC0 | (c >> 6)));
        out.push_back(char(0x80 | (c & 0x3F)));
    } else if (c < 0x10000) {
        out.push_back(char(0xE0 | (c >> 12)));
        out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
        out.push_back(char(0x80 | (c & 0x3F)));
    } else {
        out.push_back(char(0xF0 | (c >> 18)));
        out.push_back(char(0x80 | ((c >> 12) & 0x3F)));
        out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
        out.push_back(char(0x80 | (c & 0x3F)));
    }
}

inline size_t count_cps(const std::string& s) {
    size_t n = 0;
    for (unsigned char b : s) n += (b & 0xC0) != 0x80;
    return n;
}

// Length of the leading ASCII run, eight bytes at a time.
inline size_t ascii_prefix(const uint8_t* s, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        std::memcpy(&w, s + i, 8);
        if (w & 0x8080808080808080ULL) break;
    }
    while (i < n && s[i] < 0x80) ++i;
    return i;
}

// Length of the well-formed UTF-8 sequence at s[i] (0 if ill-formed); `end_of_subpart` is set to
// where its maximal invalid subpart ends, which is what lossy decoding replaces.
inline size_t utf8_sequence(const uint8_t* s, size_t n, size_t i, size_t& end_of_subpart) {
    const uint8_t b = s[i];
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) need = 2;
    else if (b == 0xE0) { need = 3; lo = 0xA0; }
    else if (b == 0xED) { need = 3; hi = 0x9F; }
    else if (b >= 0xE1 && b <= 0xEF) need = 3;
    else if (b == 0xF0) { need = 4; lo = 0x90; }
    else if (b == 0xF4) { need = 4; hi = 0x8F; }
    else if (b >= 0xF1 && b <= 0xF3) need = 4;
    else { end_of_subpart = i + 1; return 0; }
    size_t k = i + 1;
    while (k < i + need && k < n) {
        const uint8_t c = s[k];
        if (k == i + 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) break;
        ++k;
    }
    end_of_subpart = k;
    return k == i + need ? need : 0;
}

inline bool valid_utf8(const uint8_t* s, size_t n) {
    size_t i = 0;
    while (i < n) {
        i += ascii_prefix(s + i, n - i);
        if (i >= n) break;
        size_t end;
        const size_t len = utf8_sequence(s, n, i, end);
        if (!len) return false;
        i += len;
    }
    return true;
}

// Appends `bytes` to out as Rust's String::from_utf8_lossy does (what HF decoders use):
// every maximal invalid subpart (Unicode 3.9, "substitution of maximal subparts") becomes
// one U+FFFD, which is also what Python's errors="replace" produces.
inline void append_lossy(std::string& out, const uint8_t* s, size_t n) {
    size_t i = 0;
    while (i < n) {
        const size_t ascii = ascii_prefix(s + i, n - i);
        out.append(reinterpret_cast<const char*>(s + i), ascii);
        i += ascii;
        if (i >= n) break;
        size_t end;
        const size_t len = utf8_sequence(s, n, i, end);
        if (len) out.append(reinterpret_cast<const char*>(s + i), len);
        else out.append("\xEF\xBF\xBD", 3);
        i = end;
    }
}

// Per-code-point values in 256-code-point blocks, identical blocks shared.
template <typename T>
class BlockTable {
public:
    void build(const T* flat) {  // flat has kNumCodePoints entries
        index_.assign(kNumCodePoints >> 8, 0);
        blocks_.clear();
        std::unordered_map<std::string, uint16_t> seen;
        for (uint32_t b = 0; b < (kNumCodePoints >> 8); ++b) {
            std::string key(reinterpret_cast<const char*>(flat + (size_t(b) << 8)), 256 * sizeof(T));
            auto it = seen.find(key);
            if (it == seen.end()) {
                it = seen.emplace(key, uint16_t(blocks_.size() >> 8)).first;
                blocks_.insert(blocks_.end(), flat + (size_t(b) << 8), flat + (size_t(b + 1) << 8));
            }
            index_[b] = it->second;
        }
    }
    T get(uint32_t cp) const { return blocks_[(size_t(index_[cp >> 8]) << 8) | (cp & 0xFF)]; }
    bool built() const { return !index_.empty(); }

    template <class IO>
    void visit(IO& io) {
        io.vec(index_);
        io.vec(blocks_);
        if (IO::kLoading && !(index_.empty() && blocks_.empty())) {  // empty: never built (unused)
            if (index_.size() != (kNumCodePoints >> 8) || blocks_.size() % 256)
                throw std::runtime_error("fasttoken cache: block table shape");
            for (uint16_t b : index_)
                if ((size_t(b) << 8) >= blocks_.size()) throw std::runtime_error("fasttoken cache: block index");
        }
    }

private:
    std::vector<uint16_t> index_;
    std::vector<T> blocks_;
};

class ClassTable {
public:
    void build(const uint8_t* flat) {
        table_.build(flat);
        std::copy(flat, flat + 128, ascii_);
    }
    uint8_t get(uint32_t cp) const { return cp < 128 ? ascii_[cp] : table_.get(cp); }
    uint8_t ascii(uint8_t b) const { return ascii_[b]; }  // b < 128
    bool built() const { return table_.built(); }

    template <class IO>
    void visit(IO& io) {
        io.pod(ascii_);
        table_.visit(io);
    }

private:
    uint8_t ascii_[128] = {};
    BlockTable<uint8_t> table_;
};

}  // namespace ft
