// NFC for fasttoken's normalizer: the quick check, then decomposition, canonical reordering and
// composition with tables built from Python's unicodedata (unicode_data.py).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ft_unicode.hpp"

namespace ft {

// Bit of the per-code-point NFC word (low byte: canonical combining class): the code point
// fails NFC's quick check.
enum : uint16_t { kNfcSlow = 1 << 8 };

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
