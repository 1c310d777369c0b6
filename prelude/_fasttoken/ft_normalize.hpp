// The normalizers HF runs on each text segment before the pre-tokenizer: NFC, Prepend and
// Replace, in the tokenizer's order (Sequence flattened by plan.py).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ft_nfc.hpp"
#include "ft_unicode.hpp"

namespace ft {

enum class NormKind : int { kNfc = 0, kPrepend = 1, kReplace = 2 };
struct NormStep {
    NormKind kind;
    std::string a, b;
};

// Points p/len at the normalized segment (the input itself when no step changes it). Steps
// alternate between the two buffers, so each reads the previous one's output in place.
inline void normalize(const std::vector<NormStep>& steps, const Nfc& nfc, std::string& buf_a,
                      std::string& buf_b, const uint8_t*& p, size_t& len) {
    for (const NormStep& step : steps) {
        std::string& out = (p == reinterpret_cast<const uint8_t*>(buf_a.data())) ? buf_b : buf_a;
        if (step.kind == NormKind::kNfc) {
            bool changed;
            nfc.normalize(p, len, out, changed);
            if (!changed) continue;
        } else if (step.kind == NormKind::kPrepend) {
            if (!len) continue;
            out.assign(step.a);
            out.append(reinterpret_cast<const char*>(p), len);
        } else {
            out.clear();
            const std::string& from = step.a;
            size_t i = 0;
            while (i < len) {
                if (i + from.size() <= len && std::memcmp(p + i, from.data(), from.size()) == 0) {
                    out.append(step.b);
                    i += from.size();
                } else {
                    out.push_back(char(p[i++]));
                }
            }
        }
        p = reinterpret_cast<const uint8_t*>(out.data());
        len = out.size();
    }
}

}  // namespace ft
