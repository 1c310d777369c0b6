// Splitting text on added tokens the way HF's AddedVocabulary::find_matches does: a
// leftmost-longest, non-overlapping search, then single_word / lstrip / rstrip adjustments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "ft_unicode.hpp"

namespace ft {

struct Segment {
    size_t begin, end;
    int32_t id;  // the added token's id, or -1 for text still to tokenize
};

struct AddedToken {
    std::string content;  // as matched: normalized content for normalized tokens
    int32_t id;
    bool lstrip, rstrip, single_word;
};

class AddedMatcher {
public:
    void build(const std::vector<AddedToken>& tokens) {
        tokens_ = tokens;
        nodes_.assign(1, Node{});
        for (size_t t = 0; t < tokens_.size(); ++t) {
            const std::string& c = tokens_[t].content;
            if (c.empty()) continue;
            first_byte_[uint8_t(c[0])] = true;
            int32_t node = 0;
            for (unsigned char b : c) {
                int32_t child = find_child(node, b);
                if (child < 0) {
                    child = int32_t(nodes_.size());
                    nodes_.push_back(Node{});
                    nodes_[node].children.emplace_back(b, child);
                }
                node = child;
            }
            // Several patterns with one content: the first one wins, as in aho-corasick.
            if (nodes_[node].token < 0) nodes_[node].token = int32_t(t);
        }
        only_first_ = -1;
        for (int b = 0; b < 256; ++b) {
            if (!first_byte_[b]) continue;
            only_first_ = only_first_ == -1 ? b : -2;
        }
    }
    bool empty() const { return nodes_.size() <= 1; }

    // The tokens go to disk; the trie is rebuilt from them on load (a few hundred at most).
    template <class IO>
    void visit(IO& io) {
        uint64_t n = tokens_.size();
        io.pod(n);
        std::vector<AddedToken> tokens(IO::kLoading ? 0 : n);
        if (IO::kLoading) {
            if (n > (uint64_t(1) << 24)) throw std::runtime_error("fasttoken cache: added tokens");
            tokens.resize(n);
        } else {
            tokens = tokens_;
        }
        for (AddedToken& t : tokens) {
            io.str(t.content);
            io.pod(t.id);
            io.pod(t.lstrip);
            io.pod(t.rstrip);
            io.pod(t.single_word);
        }
        if (IO::kLoading) build(tokens);
    }

    // Appends the segments of s[0, n) to out. Returns false when a single_word check needed
    // the class of a version-dependent code point.
    bool split(const uint8_t* s, size_t n, const ClassTable& classes, std::vector<Segment>& out) const {
        if (empty()) {
            if (n) out.push_back(Segment{0, n, -1});
            return true;
        }
        size_t start_offset = 0, pos = 0;
        while (pos < n) {
            size_t m_begin, m_end;
            int32_t tok;
            if (!find(s, n, pos, m_begin, m_end, tok)) break;
            pos = m_end;  // the search resumes after the raw match, whatever stripping does
            const AddedToken& t = tokens_[tok];
            size_t start = m_begin, stop = m_end;
            if (t.single_word) {
                uint8_t before = 0, after = 0;
                if (start > 0) before = classes.get(last_cp(s, start));
                if (stop < n) { size_t k = stop; after = classes.get(next_cp(s, k)); }
                if ((before | after) & kUnsure) return false;
                if ((before & kWord) || (after & kWord)) continue;
            }
            if (t.lstrip) {
                size_t k = start;
                while (k > 0) {
                    const size_t prev = prev_start(s, k);
                    size_t tmp = prev;
                    if (!(classes.get(next_cp(s, tmp)) & kSpace)) break;
                    k = prev;
                }
                start = k > start_offset ? k : start_offset;
            }
            if (t.rstrip) {
                while (stop < n) {
                    size_t next = stop;
                    if (!(classes.get(next_cp(s, next)) & kSpace)) break;
                    stop = next;
                }
            }
            if (start_offset < start) out.push_back(Segment{start_offset, start, -1});
            out.push_back(Segment{start, stop, t.id});
            start_offset = stop;
        }
        if (start_offset < n) out.push_back(Segment{start_offset, n, -1});
        return true;
    }

private:
    struct Node {
        std::vector<std::pair<uint8_t, int32_t>> children;
        int32_t token = -1;
    };
    int32_t find_child(int32_t node, uint8_t b) const {
        for (const auto& c : nodes_[node].children)
            if (c.first == b) return c.second;
        return -1;
    }
    // Leftmost match at or after pos; the longest among those starting there.
    bool find(const uint8_t* s, size_t n, size_t pos, size_t& begin, size_t& end, int32_t& tok) const {
        for (size_t i = pos; i < n; ++i) {
            if (only_first_ >= 0) {  // usually '<': memchr scans for it many bytes at a time
                const void* hit = std::memchr(s + i, only_first_, n - i);
                if (!hit) return false;
                i = size_t(static_cast<const uint8_t*>(hit) - s);
            } else if (!first_byte_[s[i]]) {
                continue;
            }
            int32_t node = 0, best = -1;
            size_t best_end = 0;
            for (size_t j = i; j < n; ++j) {
                node = find_child(node, s[j]);
                if (node < 0) break;
                if (nodes_[node].token >= 0) { best = nodes_[node].token; best_end = j + 1; }
            }
            if (best >= 0) {
                begin = i;
                end = best_end;
                tok = best;
                return true;
            }
        }
        return false;
    }
    static size_t prev_start(const uint8_t* s, size_t k) {
        do { --k; } while (k > 0 && (s[k] & 0xC0) == 0x80);
        return k;
    }
    static uint32_t last_cp(const uint8_t* s, size_t end) {
        size_t k = prev_start(s, end);
        return next_cp(s, k);
    }

    std::vector<AddedToken> tokens_;
    std::vector<Node> nodes_;
    bool first_byte_[256] = {};
    int only_first_ = -1;  // the one byte every token starts with; -1 none or several
};

}  // namespace ft
