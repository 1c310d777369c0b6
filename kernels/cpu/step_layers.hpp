// Every decoder layer of a step in one native call, computed in fp32 on the CPU (the projections'
// weights stored in fp32, bf16 or int8): RMSNorm, the fused q/k/v projection, per-head q/k norms,
// rotary embedding, the new tokens' K/V written into the paged cache, attention, the output
// projection, RMSNorm, SwiGLU, and the final norm. Each piece is the
// same kernel the per-op path calls (elementwise.hpp, linear.hpp, paged_attention.hpp,
// prefill_attention.hpp). What this saves is a dozen torch dispatches, tensor allocations and
// GIL round trips per layer, which cost a small model's steps more than their arithmetic, and
// gave the event loop the GIL between every two ops. Parallel pieces run on the thread team.
//
// A step can also run resumably (StepProgress): it looks at a stop flag between pieces of about
// a given number of multiply-adds (token chunks of the projections and the MLP, slices of a
// row's attention items) and returns there when the flag is up, to be advanced later from the
// same place, with the same results as a run straight through. Looking costs one load per piece.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "elementwise.hpp"
#include "paged_attention.hpp"
#include "linear.hpp"
#include "prefill_attention.hpp"
#include "prompt_attention.hpp"

namespace prelude_cpu {

// One layer's parameters in the model's fused layout, norms and biases fp32, the optional ones
// null when the architecture has none; the projections in any stored precision (weights.hpp).
// Twenty-three 8-byte fields: the Python side fills them as an int64 row per layer.
struct LayerWeights {
    const float* input_norm;  // [hidden]
    const float* qkv_bias;    // [q_size + 2 kv_size] (Qwen2) or null
    const float* q_norm;      // [dim] (Qwen3) or null; k_norm with it
    const float* k_norm;
    const float* post_norm;   // [hidden]
    float* k_cache;           // [blocks, block_size, kv_heads, dim]
    float* v_cache;
    Weight qkv;      // [q_size + 2 kv_size, hidden]
    Weight o_proj;   // [hidden, q_size]
    Weight gate_up;  // [2 intermediate, hidden]
    Weight down;     // [hidden, intermediate]
};

struct ModelShape {
    long hidden, heads, kv_heads, dim, intermediate, block_size;
    float eps;
};

// A step's rows, flattened: row i owns tokens [query_starts[i], query_starts[i + 1]). Rows
// before decode_from are prompt rows: any number of new tokens over a cached context, attended
// from the fresh keys they compute. Rows from decode_from on are decode rows: one new token,
// stored, attended from the cache in one batched call.
struct StepRows {
    long rows, tokens, decode_from;
    const long* query_starts;   // [rows + 1]
    const long* context_lens;   // [rows]: tokens cached before the row's new ones
    const long* block_tables;   // [rows, table_width]
    long table_width;
    const float* rope;          // [max_positions, dim]: per position dim/2 cosines then dim/2 sines
    const long* positions;      // [tokens]
    const long* slots;          // [tokens]: flat cache slot of each new token, -1 where not stored
    const long* keep;           // [kept] tokens whose final states are wanted, in order; null: all
    long kept;
    // Multi-item rows: row i ends with items of lengths item_lengths[item_starts[i] ..
    // item_starts[i + 1]) ([rows + 1] offsets), each seen as if it alone followed the part
    // before them. Null: no row has items.
    const long* item_starts;
    const long* item_lengths;
};

static void step_linear(const float* x, long rows, const Weight& w, const float* bias, long in, long out_features,
                        float* out, int threads) {
    linear_rows(x, rows, w, in, out, out_features, threads, bias);
}

// Tokens [first, last): their q and k heads normed (Qwen3) and rotated, into q [tokens, q_size]
// and k [tokens, kv_size]; the stored tokens' K and V copied to their cache slots.
static void project_heads(const ModelShape& m, const LayerWeights& w, const StepRows& r, long first, long last,
                          const float* qkv, float* q, float* k, int threads) {
    const long dim = m.dim, q_size = m.heads * dim, kv_size = m.kv_heads * dim, width = q_size + 2 * kv_size;
    parallel_ranges(last - first, threads_worth((last - first) * width, threads), 1, [&](long begin, long end) {
        begin += first;
        end += first;
        std::vector<float> normed(m.heads * dim);
        for (long t = begin; t < end; ++t) {
            const float* cos = r.rope + r.positions[t] * dim;
            const float* sin = cos + dim / 2;
            const float* row = qkv + t * width;
            Strided3 q_heads{row, 1, m.heads, dim, width, dim}, k_heads{row + q_size, 1, m.kv_heads, dim, width, dim};
            if (w.q_norm != nullptr) {
                run_rms_norm(q_heads, w.q_norm, m.eps, nullptr, nullptr, normed.data());
                q_heads = {normed.data(), 1, m.heads, dim, q_size, dim};
            }
            run_rotate(q_heads, cos, sin, 0, q + t * q_size);
            if (w.k_norm != nullptr) {
                run_rms_norm(k_heads, w.k_norm, m.eps, nullptr, nullptr, normed.data());
                k_heads = {normed.data(), 1, m.kv_heads, dim, kv_size, dim};
            }
            run_rotate(k_heads, cos, sin, 0, k + t * kv_size);
            const long slot = r.slots[t];
            if (slot >= 0) {
                std::memcpy(w.k_cache + slot * kv_size, k + t * kv_size, kv_size * sizeof(float));
                std::memcpy(w.v_cache + slot * kv_size, row + q_size + kv_size, kv_size * sizeof(float));
            }
        }
    });
}

// A prompt row's attention comes in parts: its tokens before its items (all of them when it
// has none), over its cached context and their own causally; then each item, over the context,
// the part before the items and its own tokens causally (not the items between).
static long row_parts(const StepRows& r, long row) {
    return r.item_starts == nullptr ? 1 : 1 + r.item_starts[row + 1] - r.item_starts[row];
}

// Part `part` of prompt row `row`'s attention (see row_parts).
static PrefillAttention part_attention(const ModelShape& m, const LayerWeights& w, const StepRows& r, long row,
                                       long part, const float* q, const float* k, const float* qkv, float* out) {
    const long dim = m.dim, q_size = m.heads * dim, kv_size = m.kv_heads * dim, width = q_size + 2 * kv_size;
    const long first = r.query_starts[row], context = r.context_lens[row];
    long shared = r.query_starts[row + 1] - first, begin = first, items_before = 0;
    if (r.item_starts != nullptr) {
        for (long i = r.item_starts[row]; i < r.item_starts[row + 1]; ++i) shared -= r.item_lengths[i];
        for (long i = r.item_starts[row]; i < r.item_starts[row] + part - 1; ++i) items_before += r.item_lengths[i];
    }
    long n = shared;
    if (part > 0) {
        n = r.item_lengths[r.item_starts[row] + part - 1];
        begin = first + shared + items_before;
    }
    PrefillAttention a{q + begin * q_size, k + first * kv_size, qkv + first * width + q_size + kv_size,
                       out + begin * q_size, n, context + (part > 0 ? shared : 0) + n, m.heads, m.kv_heads, dim,
                       q_size, kv_size, width, 1.0f / std::sqrt((float)dim), w.k_cache, w.v_cache,
                       r.block_tables + row * r.table_width, context, m.block_size, m.block_size * kv_size,
                       kv_size};
    a.gap_from = shared;
    a.gap = items_before;
    return a;
}

// The decode rows' attention, together, from the cache (their keys are stored by now).
static void attend_decodes(const ModelShape& m, const LayerWeights& w, const StepRows& r, const float* q,
                           const long* decode_lens, float* out, int threads) {
    const long q_size = m.heads * m.dim, first = r.query_starts[r.decode_from];
    PagedDecode a{q + first * q_size, w.k_cache, w.v_cache, r.block_tables + r.decode_from * r.table_width,
                  decode_lens, out + first * q_size, r.rows - r.decode_from, m.heads, m.kv_heads, m.dim,
                  m.block_size, r.table_width, 1.0f / std::sqrt((float)m.dim)};
    paged_decode_attention(a, threads);
}

// Rows `keep` lists moved to the front of x [*, width], in order (keep is increasing).
static void keep_rows(float* x, long width, const long* keep, long kept) {
    for (long i = 0; i < kept; ++i)
        if (keep[i] != i) std::memcpy(x + i * width, x + keep[i] * width, width * sizeof(float));
}

// Rows of the MLP at a time, so its largest activation stays bounded (prelude/model/layers.py).
constexpr long kMlpRows = 2048;
// A resumable step's token chunks are at least this long: shorter ones lose more in the
// products than a shorter wait gains.
constexpr long kMinChunkRows = 64;
// A multiply-add of attention takes about this many of a projection's on these kernels; pieces
// of attention are sized by the same budget in these units, so that they last about as long.
constexpr long kAttentionMacCost = 2;
// A bf16x3 projection (on AMX's tiles) multiplies about this many times as fast as fp32's panels
// (B's layer shapes at 128-2,048 rows: 3.3-4.5x), so its token chunks take as many times the rows
// for a piece to last about as long: at fp32's chunks a preemptible step of the demo model
// served 5% fewer 512-token requests at c=16 than an unpreemptible one.
constexpr long kBf16x3Speedup = 3;

// The budget of a piece of products by `w`, in multiply-adds of `w`'s format.
static inline long projection_budget(long segment_macs, const Weight& w) {
    return w.format == kBF16x3 || w.format == kBF16x2 ? segment_macs * kBf16x3Speedup : segment_macs;
}

// Where a step stands between two calls, and the scratch it keeps meanwhile. Phases of a layer:
// the input norm and q/k/v (by token chunks), the attention (prompt rows by slices of their work
// items, then the decode rows), and the output projection, norm and MLP (by token chunks).
struct StepProgress {
    enum Phase { kProject, kAttend, kFeedForward, kDone };
    // `at`: the next token, or the next work item of prompt row `row`'s attention part `part`
    long layer = 0, phase = kProject, row = 0, part = 0, at = 0;
    long live = -1;  // tokens computed past the attention: all of them, or the kept ones in the last layer
    std::unique_ptr<float[]> residual, normed, qkv, q, k, attended, gate_up, act;
    std::vector<long> decode_lens;
};

// Whether the step may go on: the flag is down, or nothing ran yet in this call (each call makes
// progress, so a step asked to stop at every chance still finishes).
static inline bool go_on(const int* stop, bool& ran) {
    if (ran && stop != nullptr && __atomic_load_n(stop, __ATOMIC_RELAXED) != 0) return false;
    ran = true;
    return true;
}

// Chunk rows for `macs_per_row` multiply-adds a row within `segment_macs` (0: one chunk of `most`).
static long chunk_rows(long segment_macs, long macs_per_row, long most) {
    if (segment_macs <= 0) return most;
    const long rows = segment_macs / macs_per_row;
    return rows < kMinChunkRows ? kMinChunkRows : rows > most ? most : rows;
}

// x: [tokens, hidden], the embeddings in; out, the final-norm hidden states of every token, or
// of the kept ones in its first `kept` rows. Runs from where `s` stands (a fresh StepProgress: the
// start) until the end, or until `stop` (may be null) is up between two pieces of about
// `segment_macs` multiply-adds (0: whole phases); returns whether the step finished. The caller
// checks the shapes the kernels need (hidden, q_size and intermediate multiples of 8, dim of 16)
// and that the row layout holds, and keeps every pointer valid until the step finished.
static bool advance_step(const ModelShape& m, const LayerWeights* layers, long num_layers, const float* final_norm,
                         const StepRows& r, float* x, StepProgress& s, long segment_macs, const int* stop,
                         int threads) {
    const long n = r.tokens, hidden = m.hidden, inter = m.intermediate;
    const long q_size = m.heads * m.dim, kv_size = m.kv_heads * m.dim, qkv_width = q_size + 2 * kv_size;
    const long mlp_rows = n < kMlpRows ? n : kMlpRows;
    if (s.live < 0) {
        // Uninitialized: every buffer is written before it is read, and zero-filling them cost an
        // 8K-token step of a small model about 50 MB of memset.
        const auto scratch = [](long floats) { return std::unique_ptr<float[]>(new float[floats]); };
        s.residual = scratch(n * hidden), s.normed = scratch(n * hidden), s.qkv = scratch(n * qkv_width);
        s.q = scratch(n * q_size), s.k = scratch(n * kv_size), s.attended = scratch(n * q_size);
        s.gate_up = scratch(mlp_rows * 2 * inter), s.act = scratch(mlp_rows * inter);
        for (long row = r.decode_from; row < r.rows; ++row) s.decode_lens.push_back(r.context_lens[row] + 1);
        s.live = n;
    }
    const long project_chunk = chunk_rows(projection_budget(segment_macs, layers[0].qkv), hidden * qkv_width, n);
    const long forward_chunk = chunk_rows(projection_budget(segment_macs, layers[0].gate_up),
                                          q_size * hidden + 3 * hidden * inter, mlp_rows);
    bool ran = false;
    for (; s.layer < num_layers; ++s.layer, s.phase = StepProgress::kProject, s.at = 0) {
        const LayerWeights& w = layers[s.layer];
        const bool last = s.layer == num_layers - 1;
        for (; s.phase == StepProgress::kProject && s.at < n; s.at += project_chunk) {
            if (!go_on(stop, ran)) return false;
            const long rows = n - s.at < project_chunk ? n - s.at : project_chunk;
            float *in = x + s.at * hidden, *residual = s.residual.get() + s.at * hidden;
            float* normed = s.normed.get() + s.at * hidden;
            if (s.layer == 0) std::memcpy(residual, in, rows * hidden * sizeof(float));
            team_rms_norm({in, rows, 1, hidden, hidden, 0}, w.input_norm, m.eps, s.layer == 0 ? nullptr : residual,
                          s.layer == 0 ? nullptr : residual, normed, threads_worth(rows * hidden, threads));
            step_linear(normed, rows, w.qkv, w.qkv_bias, hidden, qkv_width,
                        s.qkv.get() + s.at * qkv_width, threads);
            project_heads(m, w, r, s.at, s.at + rows, s.qkv.get(), s.q.get(), s.k.get(), threads);
        }
        if (s.phase == StepProgress::kProject) s.phase = StepProgress::kAttend, s.row = 0, s.part = 0, s.at = 0;
        for (; s.phase == StepProgress::kAttend && s.row < r.decode_from; ++s.row, s.part = 0) {
            for (; s.part < row_parts(r, s.row); ++s.part, s.at = 0) {
                const PrefillAttention a = part_attention(m, w, r, s.row, s.part, s.q.get(), s.k.get(), s.qkv.get(),
                                                          s.attended.get());
                if (a.n == 0) continue;
                const long items = prompt_items(a), item_macs = prompt_item_macs(a);
                const long slice =
                    segment_macs <= 0 ? items : std::max(1L, segment_macs / std::max(1L, kAttentionMacCost * item_macs));
                for (; s.at < items; s.at += slice) {
                    if (!go_on(stop, ran)) return false;
                    prompt_attention_items(a, s.at, std::min(items, s.at + slice), threads);
                }
            }
        }
        if (s.phase == StepProgress::kAttend) {
            if (r.decode_from < r.rows) {
                if (!go_on(stop, ran)) return false;
                attend_decodes(m, w, r, s.q.get(), s.decode_lens.data(), s.attended.get(), threads);
            }
            if (last && r.keep != nullptr) {
                // Past its attention the last layer computes only the tokens whose states are read.
                keep_rows(s.attended.get(), q_size, r.keep, r.kept);
                keep_rows(s.residual.get(), hidden, r.keep, r.kept);
                s.live = r.kept;
            }
            s.phase = StepProgress::kFeedForward, s.at = 0;
        }
        for (; s.at < s.live; s.at += forward_chunk) {
            if (!go_on(stop, ran)) return false;
            const long rows = s.live - s.at < forward_chunk ? s.live - s.at : forward_chunk;
            float *out = x + s.at * hidden, *residual = s.residual.get() + s.at * hidden;
            float* normed = s.normed.get() + s.at * hidden;
            step_linear(s.attended.get() + s.at * q_size, rows, w.o_proj, nullptr, q_size, hidden,
                        out, threads);
            team_rms_norm({out, rows, 1, hidden, hidden, 0}, w.post_norm, m.eps, residual, residual, normed,
                          threads_worth(rows * hidden, threads));
            step_linear(normed, rows, w.gate_up, nullptr, hidden, 2 * inter, s.gate_up.get(),
                        threads);
            team_gated(false, s.gate_up.get(), rows, inter, s.act.get(), threads_worth(rows * 2 * inter, threads));
            step_linear(s.act.get(), rows, w.down, nullptr, inter, hidden, out, threads);
        }
    }
    if (s.phase != StepProgress::kDone) {
        team_rms_norm({x, s.live, 1, hidden, hidden, 0}, final_norm, m.eps, s.residual.get(), s.residual.get(), x,
                      threads_worth(s.live * hidden, threads));
        s.phase = StepProgress::kDone;
    }
    return true;
}

// The whole step in one call.
static void step_layers(const ModelShape& m, const LayerWeights* layers, long num_layers, const float* final_norm,
                        const StepRows& r, float* x, int threads) {
    StepProgress progress;
    advance_step(m, layers, num_layers, final_norm, r, x, progress, 0, nullptr, threads);
}

}  // namespace prelude_cpu
