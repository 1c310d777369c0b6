// Every decoder layer of a step in one native call, fp32 on the CPU: RMSNorm, the fused q/k/v
// projection, per-head q/k norms, rotary embedding, the new tokens' K/V written into the paged
// cache, attention, the output projection, RMSNorm, SwiGLU, and the final norm. Each piece is the
// same kernel the per-op path calls (elementwise.hpp, linear.hpp, paged_attention.hpp,
// prefill_attention.hpp). What this saves is a dozen torch dispatches, tensor allocations and
// GIL round trips per layer. A small model's decode step spent more time in those than in its
// arithmetic. A prompt step paid for them again in the server, where the event loop took the GIL
// between ops: a one-row Mixed step of the demo model took 12-18 ms while tokens streamed at
// c=4, against 6.1-6.8 ms alone. Parallel pieces run on the thread team.
#pragma once
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "elementwise.hpp"
#include "paged_attention.hpp"
#include "linear.hpp"
#include "prefill_attention.hpp"

namespace prelude_cpu {

// One layer's parameters, fp32 and contiguous, in the model's fused layout; the optional ones
// are null when the architecture has none; each projection also comes packed (pack_weight).
// Fifteen pointers: the Python side fills them as an int64 row per layer.
struct LayerWeights {
    const float* input_norm;  // [hidden]
    const float* qkv;         // [q_size + 2 kv_size, hidden]
    const float* qkv_bias;    // [q_size + 2 kv_size] (Qwen2) or null
    const float* q_norm;      // [dim] (Qwen3) or null; k_norm with it
    const float* k_norm;
    const float* o_proj;      // [hidden, q_size]
    const float* post_norm;   // [hidden]
    const float* gate_up;     // [2 intermediate, hidden]
    const float* down;        // [hidden, intermediate]
    float* k_cache;           // [blocks, block_size, kv_heads, dim]
    float* v_cache;
    const float* qkv_packed;
    const float* o_proj_packed;
    const float* gate_up_packed;
    const float* down_packed;
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
};

// Rows of the MLP at a time, so its largest activation stays bounded (prelude/model/layers.py).
constexpr long kMlpRows = 2048;

static void step_linear(const float* x, long rows, const float* w, const float* packed, const float* bias, long in,
                        long out_features, float* out, int threads) {
    linear_rows(x, rows, w, packed, in, out, out_features, threads);
    if (bias != nullptr)
        for (long t = 0; t < rows; ++t)
            for (long o = 0; o < out_features; ++o) out[t * out_features + o] += bias[o];
}

// Each token's q and k heads normed (Qwen3) and rotated, into q [tokens, q_size] and k
// [tokens, kv_size]; the stored tokens' K and V copied to their cache slots.
static void project_heads(const ModelShape& m, const LayerWeights& w, const StepRows& r, const float* qkv, float* q,
                          float* k, int threads) {
    const long dim = m.dim, q_size = m.heads * dim, kv_size = m.kv_heads * dim, width = q_size + 2 * kv_size;
    parallel_ranges(r.tokens, threads_worth(r.tokens * width, threads), 1, [&](long begin, long end) {
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

// Every row's attention into out [tokens, q_size]: prompt rows one at a time over their cached
// context and fresh keys, decode rows together from the cache (their keys are stored by now).
static void attend_rows(const ModelShape& m, const LayerWeights& w, const StepRows& r, const float* q, const float* k,
                        const float* qkv, const long* decode_lens, float* out, int threads) {
    const long dim = m.dim, q_size = m.heads * dim, kv_size = m.kv_heads * dim, width = q_size + 2 * kv_size;
    const float scale = 1.0f / std::sqrt((float)dim);
    for (long row = 0; row < r.decode_from; ++row) {
        const long first = r.query_starts[row], n = r.query_starts[row + 1] - first, context = r.context_lens[row];
        PrefillAttention a{q + first * q_size, k + first * kv_size, qkv + first * width + q_size + kv_size,
                           out + first * q_size, n, context + n, m.heads, m.kv_heads, dim, q_size, kv_size, width,
                           scale, w.k_cache, w.v_cache, r.block_tables + row * r.table_width, context,
                           m.block_size, m.block_size * kv_size, kv_size};
        prefill_attention(a, threads);
    }
    if (r.decode_from < r.rows) {
        const long first = r.query_starts[r.decode_from];
        PagedDecode a{q + first * q_size, w.k_cache, w.v_cache, r.block_tables + r.decode_from * r.table_width,
                      decode_lens, out + first * q_size, r.rows - r.decode_from, m.heads, m.kv_heads, dim,
                      m.block_size, r.table_width, scale};
        paged_decode_attention(a, threads);
    }
}

// Rows `keep` lists moved to the front of x [*, width], in order (keep is increasing).
static void keep_rows(float* x, long width, const long* keep, long kept) {
    for (long i = 0; i < kept; ++i)
        if (keep[i] != i) std::memcpy(x + i * width, x + keep[i] * width, width * sizeof(float));
}

// x: [tokens, hidden], the embeddings in; out, the final-norm hidden states of every token, or
// of the kept ones in its first `kept` rows. The caller checks the shapes the kernels need
// (hidden, q_size and intermediate multiples of 8, dim of 16) and that the row layout holds.
static void step_layers(const ModelShape& m, const LayerWeights* layers, long num_layers, const float* final_norm,
                        const StepRows& r, float* x, int threads) {
    const long n = r.tokens, hidden = m.hidden, inter = m.intermediate;
    const long q_size = m.heads * m.dim, kv_size = m.kv_heads * m.dim, qkv_width = q_size + 2 * kv_size;
    const long mlp_rows = n < kMlpRows ? n : kMlpRows;
    // Uninitialized: every buffer is written before it is read, and zero-filling them cost an
    // 8K-token step of a small model about 50 MB of memset.
    const auto scratch = [](long floats) { return std::unique_ptr<float[]>(new float[floats]); };
    const auto residual = scratch(n * hidden), normed = scratch(n * hidden), qkv = scratch(n * qkv_width),
               q = scratch(n * q_size), k = scratch(n * kv_size), attended = scratch(n * q_size),
               gate_up = scratch(mlp_rows * 2 * inter), act = scratch(mlp_rows * inter);
    std::vector<long> decode_lens;
    for (long row = r.decode_from; row < r.rows; ++row) decode_lens.push_back(r.context_lens[row] + 1);
    const int norm_threads = threads_worth(n * hidden, threads);
    long live = n;  // rows still computed: all of them until the last layer's attention
    for (long layer = 0; layer < num_layers; ++layer) {
        const LayerWeights& w = layers[layer];
        if (layer == 0) {
            std::memcpy(residual.get(), x, n * hidden * sizeof(float));
            team_rms_norm({x, n, 1, hidden, hidden, 0}, w.input_norm, m.eps, nullptr, nullptr, normed.get(),
                          norm_threads);
        } else {
            team_rms_norm({x, n, 1, hidden, hidden, 0}, w.input_norm, m.eps, residual.get(), residual.get(),
                          normed.get(), norm_threads);
        }
        step_linear(normed.get(), n, w.qkv, w.qkv_packed, w.qkv_bias, hidden, qkv_width, qkv.get(), threads);
        project_heads(m, w, r, qkv.get(), q.get(), k.get(), threads);
        attend_rows(m, w, r, q.get(), k.get(), qkv.get(), decode_lens.data(), attended.get(), threads);
        if (layer == num_layers - 1 && r.keep != nullptr) {
            // Past its attention the last layer computes only the tokens whose states are read.
            keep_rows(attended.get(), q_size, r.keep, r.kept);
            keep_rows(residual.get(), hidden, r.keep, r.kept);
            live = r.kept;
        }
        step_linear(attended.get(), live, w.o_proj, w.o_proj_packed, nullptr, q_size, hidden, x, threads);
        team_rms_norm({x, live, 1, hidden, hidden, 0}, w.post_norm, m.eps, residual.get(), residual.get(),
                      normed.get(), threads_worth(live * hidden, threads));
        for (long first = 0; first < live; first += kMlpRows) {
            const long rows = live - first < kMlpRows ? live - first : kMlpRows;
            step_linear(normed.get() + first * hidden, rows, w.gate_up, w.gate_up_packed, nullptr, hidden, 2 * inter,
                        gate_up.get(), threads);
            team_silu_and_mul(gate_up.get(), rows, inter, act.get(), threads_worth(rows * 2 * inter, threads));
            step_linear(act.get(), rows, w.down, w.down_packed, nullptr, inter, hidden, x + first * hidden, threads);
        }
    }
    team_rms_norm({x, live, 1, hidden, hidden, 0}, final_norm, m.eps, residual.get(), residual.get(), x,
                  threads_worth(live * hidden, threads));
}

}  // namespace prelude_cpu
