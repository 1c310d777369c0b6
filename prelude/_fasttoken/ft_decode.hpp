// Decoding ids to text as HF's decoders do: ByteLevel (token bytes from an arena, then lossy
// UTF-8), or the SentencePiece-style chain (Replace pre-applied per token, ByteFallback, Fuse,
// Strip), or Metaspace. All tables are filled once at load and only read afterwards.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ft_unicode.hpp"

namespace ft {

struct Decoder {
    enum : uint8_t { kKnown = 1, kSpecial = 2, kByteToken = 4 };

    bool byte_level = true;
    std::string token_bytes;              // per id: bytes (byte-level) or decoded text (chain)
    std::vector<uint32_t> token_offsets;  // size vocab+1
    std::vector<uint8_t> token_flags;     // kKnown | kSpecial | kByteToken
    std::vector<uint8_t> token_byte;      // the byte of a <0xNN> token
    std::string strip_content;
    int strip_start = 0;
    // Metaspace decoder: the first token (after skipping) is shown from this arena instead
    std::string first_token_bytes;
    std::vector<uint32_t> first_token_offsets;  // empty when not used

    // The reference decode_step, computed on bytes: decode ids[prefix:read] and ids[prefix:],
    // emit the tail of the second past the first's length unless it ends in U+FFFD.
    // ids points at ids[prefix]; returns true and sets `text` when there is new text.
    bool step(const int32_t* ids, size_t n_prefix, size_t n_all, bool skip_special, std::string& text,
              std::string& prefix_text, std::string& full, std::string& bytes, std::string& tmp) const {
        prefix_text.clear();
        full.clear();
        decode(ids, n_prefix, skip_special, prefix_text, bytes, tmp);
        decode(ids, n_all, skip_special, full, bytes, tmp);
        const size_t prefix_cps = count_cps(prefix_text);
        size_t cps = 0, i = 0;
        for (; i < full.size() && cps < prefix_cps; ++cps) {
            ++i;
            while (i < full.size() && (uint8_t(full[i]) & 0xC0) == 0x80) ++i;
        }
        if (i >= full.size()) return false;  // not longer than the prefix
        if (full.size() >= 3 && full.compare(full.size() - 3, 3, "\xEF\xBF\xBD") == 0) return false;
        text.assign(full, i, std::string::npos);
        return true;
    }

    // Appends decode(ids) as valid UTF-8; bytes and text are scratch buffers.
    void decode(const int32_t* ids, size_t n, bool skip_special, std::string& out, std::string& bytes,
                std::string& text) const {
        const size_t vocab_n = token_flags.size();
        bytes.clear();
        if (byte_level) {
            // Gather straight into `out`; only text with invalid UTF-8 takes the lossy rewrite.
            const size_t start = out.size();
            const uint8_t* flags = token_flags.data();
            const uint32_t* offsets = token_offsets.data();
            const char* arena = token_bytes.data();
            out.reserve(start + 8 * n);
            for (size_t k = 0; k < n; ++k) {
                const uint32_t id = uint32_t(ids[k]);
                if (id >= vocab_n) continue;
                const uint8_t f = flags[id];
                if (!(f & kKnown) || (skip_special && (f & kSpecial))) continue;
                out.append(arena + offsets[id], offsets[id + 1] - offsets[id]);
            }
            const uint8_t* written = reinterpret_cast<const uint8_t*>(out.data()) + start;
            if (!valid_utf8(written, out.size() - start)) {
                bytes.assign(out, start, std::string::npos);
                out.resize(start);
                append_lossy(out, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
            }
            return;
        }
        // Replace (pre-applied per token), ByteFallback, Fuse, Strip; or Metaspace, which is a
        // Replace except that the first token loses its replacement characters instead.
        text.clear();
        auto flush = [&]() {
            if (bytes.empty()) return;
            if (valid_utf8(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size())) {
                text.append(bytes);
            } else {
                for (size_t k = 0; k < bytes.size(); ++k) text.append("\xEF\xBF\xBD");
            }
            bytes.clear();
        };
        bool emitted = false;
        for (size_t k = 0; k < n; ++k) {
            const uint32_t id = uint32_t(ids[k]);
            if (id >= vocab_n) continue;
            const uint8_t f = token_flags[id];
            if (!(f & kKnown) || (skip_special && (f & kSpecial))) continue;
            if (f & kByteToken) {
                emitted = true;
                bytes.push_back(char(token_byte[id]));
                continue;
            }
            flush();
            if (!first_token_offsets.empty() && !emitted)
                text.append(first_token_bytes, first_token_offsets[id], first_token_offsets[id + 1] - first_token_offsets[id]);
            else
                text.append(token_bytes, token_offsets[id], token_offsets[id + 1] - token_offsets[id]);
            emitted = true;
        }
        flush();
        size_t cut = 0;
        for (int k = 0; k < strip_start && !strip_content.empty(); ++k) {
            if (text.compare(cut, strip_content.size(), strip_content) != 0) break;
            cut += strip_content.size();
        }
        out.append(text, cut, std::string::npos);
    }
};

}  // namespace ft
