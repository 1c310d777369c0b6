// UTF-8 helpers, code-point property tables, lossy UTF-8 repair and NFC for fasttoken.
#pragma once

#include <algorithm>
#include <array>
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
enum : uint16_t { kNfcSlow = 1 << 8 };

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

// NFC as HF computes it. The quick check settles almost all text without copying; the rest is
// decomposed, reordered and recomposed with tables from Python's unicodedata.
class Nfc {
public:
    void build(const uint16_t* words, const std::vector<std::pair<uint32_t, std::vector<uint32_t>>>& decomp,
               const std::vector<std::array<uint32_t, 3>>& pairs);
    bool built() const { return words_.built(); }
    // The maps go to disk as flat lists (they are small) and are rebuilt on load.
    template <class IO>
    void visit(IO& io) {
        words_.visit(io);
        std::vector<uint32_t> index, compose;
        for (const auto& kv : decomp_index_) index.insert(index.end(), {kv.first, kv.second.first, kv.second.second});
        for (const auto& kv : compose_)
            compose.insert(compose.end(), {uint32_t(kv.first >> 32), uint32_t(kv.first), kv.second});
        io.vec(index);
        io.vec(decomp_data_);
        io.vec(compose);
        if (!IO::kLoading) return;
        decomp_index_.clear();
        compose_.clear();
        if (index.size() % 3 || compose.size() % 3) throw std::runtime_error("fasttoken cache: nfc tables");
        for (size_t i = 0; i < index.size(); i += 3) {
            if (size_t(index[i + 1]) + index[i + 2] > decomp_data_.size())
                throw std::runtime_error("fasttoken cache: nfc decomposition");
            decomp_index_[index[i]] = {index[i + 1], index[i + 2]};
        }
        for (size_t i = 0; i < compose.size(); i += 3)
            compose_[(uint64_t(compose[i]) << 32) | compose[i + 1]] = compose[i + 2];
    }
    // Sets `changed` false (and leaves `out` alone) when the input is already NFC.
    void normalize(const uint8_t* s, size_t n, std::string& out, bool& changed) const;

private:
    uint8_t ccc(uint32_t c) const { return uint8_t(words_.get(c) & 0xFF); }
    uint32_t compose(uint32_t a, uint32_t b) const;
    void decompose(uint32_t c, std::vector<uint32_t>& out) const;

    BlockTable<uint16_t> words_;
    std::unordered_map<uint32_t, std::pair<uint32_t, uint32_t>> decomp_index_;
    std::vector<uint32_t> decomp_data_;
    std::unordered_map<uint64_t, uint32_t> compose_;
};

namespace hangul {
constexpr uint32_t SBase = 0xAC00, LBase = 0x1100, VBase = 0x1161, TBase = 0x11A7;
constexpr uint32_t LCount = 19, VCount = 21, TCount = 28, NCount = VCount * TCount,
                   SCount = LCount * NCount;
}  // namespace hangul

inline void Nfc::build(const uint16_t* words,
                       const std::vector<std::pair<uint32_t, std::vector<uint32_t>>>& decomp,
                       const std::vector<std::array<uint32_t, 3>>& pairs) {
    words_.build(words);
    for (const auto& d : decomp) {
        decomp_index_[d.first] = {uint32_t(decomp_data_.size()), uint32_t(d.second.size())};
        decomp_data_.insert(decomp_data_.end(), d.second.begin(), d.second.end());
    }
    for (const auto& p : pairs) compose_[(uint64_t(p[0]) << 32) | p[1]] = p[2];
}

inline uint32_t Nfc::compose(uint32_t a, uint32_t b) const {
    using namespace hangul;
    if (a >= LBase && a < LBase + LCount && b >= VBase && b < VBase + VCount)
        return SBase + ((a - LBase) * VCount + (b - VBase)) * TCount;
    if (a >= SBase && a < SBase + SCount && (a - SBase) % TCount == 0 && b > TBase &&
        b < TBase + TCount)
        return a + (b - TBase);
    auto it = compose_.find((uint64_t(a) << 32) | b);
    return it == compose_.end() ? 0 : it->second;
}

inline void Nfc::decompose(uint32_t c, std::vector<uint32_t>& out) const {
    using namespace hangul;
    if (c >= SBase && c < SBase + SCount) {
        const uint32_t s = c - SBase;
        out.push_back(LBase + s / NCount);
        out.push_back(VBase + (s % NCount) / TCount);
        if (s % TCount) out.push_back(TBase + s % TCount);
        return;
    }
    auto it = decomp_index_.find(c);
    if (it == decomp_index_.end()) {
        out.push_back(c);
    } else {
        out.insert(out.end(), decomp_data_.begin() + it->second.first,
                   decomp_data_.begin() + it->second.first + it->second.second);
    }
}

inline void Nfc::normalize(const uint8_t* s, size_t n, std::string& out, bool& changed) const {
    changed = false;
    // Quick check: only NFC_Quick_Check=Yes code points in canonical order.
    uint8_t last = 0;
    bool quick = true;
    for (size_t i = 0; i < n;) {
        if (s[i] < 0x80) {  // ASCII is always NFC and a starter: skip it a word at a time
            i += 1 + ascii_prefix(s + i + 1, n - i - 1);
            last = 0;
            continue;
        }
        const uint16_t w = words_.get(next_cp(s, i));
        const uint8_t c = uint8_t(w & 0xFF);
        if ((w & kNfcSlow) || (c && last > c)) { quick = false; break; }
        last = c;
    }
    if (quick) return;

    std::vector<uint32_t> buf;
    buf.reserve(n);
    for (size_t i = 0; i < n;) {
        decompose(next_cp(s, i), buf);
    }
    // Canonical ordering: stable sort of each run of non-starters by combining class.
    for (size_t i = 0; i < buf.size();) {
        if (!ccc(buf[i])) { ++i; continue; }
        size_t j = i;
        while (j < buf.size() && ccc(buf[j])) ++j;
        std::stable_sort(buf.begin() + i, buf.begin() + j,
                         [this](uint32_t a, uint32_t b) { return ccc(a) < ccc(b); });
        i = j;
    }
    // Canonical composition (the UAX #15 sample algorithm).
    if (!buf.empty()) {
        size_t starter = 0, out_len = 1;
        uint32_t starter_ch = buf[0];
        int last_class = ccc(starter_ch) ? 256 : 0;
        for (size_t k = 1; k < buf.size(); ++k) {
            const uint32_t ch = buf[k];
            const int cls = ccc(ch);
            const uint32_t composite = compose(starter_ch, ch);
            if (composite && (last_class < cls || last_class == 0)) {
                buf[starter] = composite;
                starter_ch = composite;
                continue;
            }
            if (cls == 0) { starter = out_len; starter_ch = ch; }
            last_class = cls;
            buf[out_len++] = ch;
        }
        buf.resize(out_len);
    }
    out.clear();
    for (uint32_t cp : buf) put_cp(out, cp);
    changed = out.size() != n || out.compare(0, n, reinterpret_cast<const char*>(s), n) != 0;
}

}  // namespace ft
