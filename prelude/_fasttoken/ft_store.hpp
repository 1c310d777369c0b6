// Saving a built Engine to bytes and loading it back (the on-disk table cache, loader.py).
//
// One visitor, `visit(io, engine)`, lists every member once; a Writer appends each to a byte
// string and a Reader fills it back, so the two directions cannot drift apart. Large tables
// are flat vectors of plain structs, copied with one memcpy each: a warm load is a file read,
// a checksum and a few memcpys. The Reader checks every length against the bytes left, so a
// truncated or garbled file fails to load (loader.py also checks a checksum first).
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "ft_engine.hpp"

namespace ft {

// 64-bit checksum of the payload, eight bytes per step in four independent lanes.
inline uint64_t checksum(const uint8_t* p, size_t n) {
    uint64_t lane[4] = {0x9E3779B97F4A7C15ULL, 0xC2B2AE3D27D4EB4FULL, 0x165667B19E3779F9ULL, n};
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        for (int k = 0; k < 4; ++k) {
            uint64_t w;
            std::memcpy(&w, p + i + 8 * k, 8);
            lane[k] = (lane[k] ^ w) * 0x100000001B3ULL;
            lane[k] ^= lane[k] >> 31;
        }
    }
    uint64_t h = lane[0] ^ (lane[1] * 3) ^ (lane[2] * 5) ^ (lane[3] * 7);
    for (; i < n; ++i) h = (h ^ p[i]) * 0x100000001B3ULL;
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDULL;
    return h ^ (h >> 33);
}

class Writer {
public:
    static constexpr bool kLoading = false;
    template <class T>
    void pod(T& v) {
        static_assert(std::is_trivially_copyable<T>::value, "plain data only");
        out.append(reinterpret_cast<const char*>(&v), sizeof(T));
    }
    template <class T, class A>
    void vec(std::vector<T, A>& v) {
        static_assert(std::is_trivially_copyable<T>::value, "plain data only");
        uint64_t n = v.size();
        pod(n);
        out.append(reinterpret_cast<const char*>(v.data()), n * sizeof(T));
    }
    void str(std::string& s) {
        uint64_t n = s.size();
        pod(n);
        out.append(s);
    }
    std::string out;
};

class Reader {
public:
    static constexpr bool kLoading = true;
    Reader(const uint8_t* p, size_t n) : p_(p), end_(p + n) {}
    template <class T>
    void pod(T& v) {
        take(&v, sizeof(T));
    }
    template <class T, class A>
    void vec(std::vector<T, A>& v) {
        const uint64_t n = count(sizeof(T));
        v.resize(n);
        take(v.data(), n * sizeof(T));
    }
    void str(std::string& s) {
        const uint64_t n = count(1);
        s.assign(reinterpret_cast<const char*>(p_), n);
        p_ += n;
    }
    bool at_end() const { return p_ == end_; }

private:
    uint64_t count(size_t size) {
        uint64_t n;
        pod(n);
        if (n > uint64_t(end_ - p_) / size) throw std::runtime_error("fasttoken cache: bad length");
        return n;
    }
    void take(void* dst, size_t n) {
        if (n > size_t(end_ - p_)) throw std::runtime_error("fasttoken cache: truncated");
        std::memcpy(dst, p_, n);
        p_ += n;
    }
    const uint8_t* p_;
    const uint8_t* end_;
};

template <class IO>
void visit_strings(IO& io, std::vector<std::string>& v) {
    uint64_t n = v.size();
    io.pod(n);
    if (IO::kLoading) {
        if (n > (uint64_t(1) << 32)) throw std::runtime_error("fasttoken cache: bad count");
        v.resize(n);
    }
    for (std::string& s : v) io.str(s);
}

template <class IO>
void visit(IO& io, Engine& e) {
    e.classes.visit(io);
    e.nfc.visit(io);
    uint64_t n_norm = e.normalizers.size();
    io.pod(n_norm);
    if (IO::kLoading) {
        if (n_norm > 1024) throw std::runtime_error("fasttoken cache: bad count");
        e.normalizers.resize(n_norm);
    }
    for (NormStep& step : e.normalizers) {
        io.pod(step.kind);
        io.str(step.a);
        io.str(step.b);
    }
    e.raw_added.visit(io);
    e.normalized_added.visit(io);
    io.pod(e.pattern);
    io.pod(e.max_digits);
    io.pod(e.byte_level);
    e.vocab.visit(io);
    e.merges.visit(io);
    io.pod(e.byte_ids);
    io.pod(e.ignore_merges);
    io.pod(e.byte_fallback);
    io.pod(e.fallback_ids);
    io.pod(e.unk_id);
    io.pod(e.fuse_unk);
    io.vec(e.prefix_ids);
    io.vec(e.suffix_ids);
    io.str(e.word_boundary);
    io.pod(e.metaspace);
    io.str(e.ms_replacement);
    io.pod(e.ms_prepend);
    io.pod(e.ms_split);
    Decoder& d = e.decoder;
    io.pod(d.byte_level);
    io.str(d.token_bytes);
    io.vec(d.token_offsets);
    io.vec(d.token_flags);
    io.vec(d.token_byte);
    io.str(d.strip_content);
    io.pod(d.strip_start);
    io.str(d.first_token_bytes);
    io.vec(d.first_token_offsets);
    io.pod(e.single_ids);
}

inline std::string save_engine(Engine& e) {
    Writer w;
    visit(w, e);
    return std::move(w.out);
}

// After load_engine: what the tables' own checks do not cover.
inline void check_loaded(const Engine& e) {
    const Decoder& d = e.decoder;
    if (d.token_offsets.empty() || d.token_offsets.back() != d.token_bytes.size() ||
        d.token_flags.size() + 1 != d.token_offsets.size() || d.token_byte.size() != d.token_flags.size())
        throw std::runtime_error("fasttoken cache: decode table");
    for (size_t k = 1; k < d.token_offsets.size(); ++k)
        if (d.token_offsets[k] < d.token_offsets[k - 1]) throw std::runtime_error("fasttoken cache: decode offsets");
    if (!d.first_token_offsets.empty() &&
        (d.first_token_offsets.size() != d.token_offsets.size() ||
         d.first_token_offsets.back() != d.first_token_bytes.size()))
        throw std::runtime_error("fasttoken cache: first-token table");
    for (size_t k = 1; k < d.first_token_offsets.size(); ++k)
        if (d.first_token_offsets[k] < d.first_token_offsets[k - 1])
            throw std::runtime_error("fasttoken cache: first-token offsets");
    if (e.pattern < -1 || e.pattern > 2 || e.ms_prepend < 0 || e.ms_prepend > 2 || !e.classes.built())
        throw std::runtime_error("fasttoken cache: options");
    for (const NormStep& step : e.normalizers)
        if (int(step.kind) < 0 || int(step.kind) > 2 || (step.kind == NormKind::kNfc && !e.nfc.built()))
            throw std::runtime_error("fasttoken cache: normalizers");
}

// Fills a fresh Engine; throws on malformed input.
inline void load_engine(Engine& e, const uint8_t* p, size_t n) {
    Reader r(p, n);
    visit(r, e);
    if (!r.at_end()) throw std::runtime_error("fasttoken cache: trailing bytes");
    check_loaded(e);
    e.derive();
}

}  // namespace ft
