// Load-time helpers that fill an Engine from flat buffers prepared by plan.py; keeping them in
// C++ keeps core.pyx's declarations small.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ft_engine.hpp"

namespace ft {

inline void build_vocab(Engine& e, const std::string& keys, const uint32_t* offsets, const int32_t* ids,
                        size_t n) {
    e.vocab.reserve(n);
    for (size_t k = 0; k < n; ++k)
        e.vocab.insert(reinterpret_cast<const uint8_t*>(keys.data()) + offsets[k],
                       offsets[k + 1] - offsets[k], ids[k]);
}

// triples: (left, right, merged) in rank order; a repeated pair keeps its last rank, as HF's
// HashMap built from the merge list does.
inline void build_merges(Engine& e, const int32_t* triples, size_t n) {
    e.merges.reserve(n);
    for (size_t k = 0; k < n; ++k)
        e.merges.insert(triples[3 * k], triples[3 * k + 1], int32_t(k), triples[3 * k + 2]);
    e.merges.finish();
}

inline void add_normalizer(Engine& e, int kind, const std::string& a, const std::string& b) {
    e.normalizers.push_back(NormStep{NormKind(kind), a, b});
}

inline void build_nfc(Engine& e, const std::string& words, const std::vector<uint32_t>& decomp_flat,
                      const std::vector<uint32_t>& pairs_flat) {
    // decomp_flat: cp, length, then that many code points, repeated.
    std::vector<std::pair<uint32_t, std::vector<uint32_t>>> decomp;
    for (size_t i = 0; i < decomp_flat.size();) {
        const uint32_t cp = decomp_flat[i], len = decomp_flat[i + 1];
        decomp.emplace_back(cp, std::vector<uint32_t>(decomp_flat.begin() + i + 2,
                                                      decomp_flat.begin() + i + 2 + len));
        i += 2 + len;
    }
    std::vector<std::array<uint32_t, 3>> pairs;
    for (size_t i = 0; i + 2 < pairs_flat.size(); i += 3)
        pairs.push_back({pairs_flat[i], pairs_flat[i + 1], pairs_flat[i + 2]});
    e.nfc.build(reinterpret_cast<const uint16_t*>(words.data()), decomp, pairs);
}

inline void build_classes(Engine& e, const std::string& table) {
    e.classes.build(reinterpret_cast<const uint8_t*>(table.data()));
}

inline void build_added(Engine& e, bool normalized, const std::vector<std::string>& contents,
                        const std::vector<int32_t>& ids, const std::vector<uint8_t>& flags) {
    std::vector<AddedToken> tokens;
    for (size_t k = 0; k < contents.size(); ++k)
        tokens.push_back(AddedToken{contents[k], ids[k], bool(flags[k] & 1), bool(flags[k] & 2),
                                    bool(flags[k] & 4)});
    (normalized ? e.normalized_added : e.raw_added).build(tokens);
}

}  // namespace ft
