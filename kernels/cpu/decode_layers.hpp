// Every decoder layer of a decode step (one new token per row) in one native call, fp32 on the
// CPU: RMSNorm, the fused q/k/v projection, per-head q/k norms, rotary embedding, the new token's
// K/V written into the paged cache, paged attention, the output projection, RMSNorm, SwiGLU, and
// the final norm. Each piece is the same kernel the per-op path calls (elementwise.hpp,
// skinny_gemm.hpp, paged_attention.hpp); what this saves is the dozen torch dispatches, tensor
// allocations and GIL round trips per layer that a small model's decode step spent more time in
// than in its arithmetic. Parallel pieces (the projections, attention) run on the thread team.
#pragma once
#include <cmath>
#include <cstring>
#include <vector>

#include "elementwise.hpp"
#include "paged_attention.hpp"
#include "skinny_gemm.hpp"

namespace prelude_cpu {

// One layer's parameters, fp32 and contiguous, in the model's fused layout; the optional ones
// are null when the architecture has none. Eleven pointers: the Python side fills them as an
// int64 row per layer.
struct DecodeLayerWeights {
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
};

struct DecodeShape {
    long hidden, heads, kv_heads, dim, intermediate, block_size;
    float eps;
};

struct DecodeRows {
    long rows;
    const float* rope;          // [max_positions, dim]: per position dim/2 cosines then dim/2 sines
    const long* positions;      // [rows]
    const long* slots;          // [rows]: flat cache slot of each row's new token
    const long* block_tables;   // [rows, table_width]
    long table_width;
    const long* context_lens;   // [rows]: keys each row attends to, the new one included
};

static void decode_linear(const float* x, long rows, const float* w, const float* bias, long in, long out_features,
                          float* out, int threads) {
    skinny_gemm(x, rows, w, in, out, out_features, threads);
    if (bias != nullptr)
        for (long t = 0; t < rows; ++t)
            for (long o = 0; o < out_features; ++o) out[t * out_features + o] += bias[o];
}

// x: [rows, hidden], the embeddings in, the final-norm hidden states out. The caller checks the
// shapes the kernels need (hidden, q_size and intermediate multiples of 8, dim of 16).
static void decode_layers(const DecodeShape& m, const DecodeLayerWeights* layers, long num_layers,
                          const float* final_norm, const DecodeRows& r, float* x, int threads) {
    const long n = r.rows, hidden = m.hidden, dim = m.dim, inter = m.intermediate;
    const long q_size = m.heads * dim, kv_size = m.kv_heads * dim, qkv_width = q_size + 2 * kv_size;
    std::vector<float> residual(n * hidden), normed(n * hidden), qkv(n * qkv_width), q(n * q_size),
        attended(n * q_size), head_normed(m.heads * dim), gate_up(n * 2 * inter), act(n * inter);
    for (long layer = 0; layer < num_layers; ++layer) {
        const DecodeLayerWeights& w = layers[layer];
        if (layer == 0) {
            std::memcpy(residual.data(), x, n * hidden * sizeof(float));
            run_rms_norm({x, n, 1, hidden, hidden, 0}, w.input_norm, m.eps, nullptr, nullptr, normed.data());
        } else {
            run_rms_norm({x, n, 1, hidden, hidden, 0}, w.input_norm, m.eps, residual.data(), residual.data(),
                         normed.data());
        }
        decode_linear(normed.data(), n, w.qkv, w.qkv_bias, hidden, qkv_width, qkv.data(), threads);
        for (long t = 0; t < n; ++t) {
            const float* cos = r.rope + r.positions[t] * dim;
            const float* sin = cos + dim / 2;
            const float* row = qkv.data() + t * qkv_width;
            const long slot = r.slots[t];
            Strided3 q_heads{row, 1, m.heads, dim, qkv_width, dim}, k_heads{row + q_size, 1, m.kv_heads, dim, qkv_width, dim};
            if (w.q_norm != nullptr) {
                run_rms_norm(q_heads, w.q_norm, m.eps, nullptr, nullptr, head_normed.data());
                q_heads = {head_normed.data(), 1, m.heads, dim, q_size, dim};
            }
            run_rotate(q_heads, cos, sin, 0, q.data() + t * q_size);
            if (w.k_norm != nullptr) {
                run_rms_norm(k_heads, w.k_norm, m.eps, nullptr, nullptr, head_normed.data());
                k_heads = {head_normed.data(), 1, m.kv_heads, dim, kv_size, dim};
            }
            run_rotate(k_heads, cos, sin, 0, w.k_cache + slot * kv_size);
            std::memcpy(w.v_cache + slot * kv_size, row + q_size + kv_size, kv_size * sizeof(float));
        }
        PagedDecode a{q.data(), w.k_cache, w.v_cache, r.block_tables, r.context_lens, attended.data(),
                      n, m.heads, m.kv_heads, dim, m.block_size, r.table_width, 1.0f / std::sqrt((float)dim)};
        paged_decode_attention(a, threads);
        decode_linear(attended.data(), n, w.o_proj, nullptr, q_size, hidden, x, threads);
        run_rms_norm({x, n, 1, hidden, hidden, 0}, w.post_norm, m.eps, residual.data(), residual.data(), normed.data());
        decode_linear(normed.data(), n, w.gate_up, nullptr, hidden, 2 * inter, gate_up.data(), threads);
        run_silu_and_mul(gate_up.data(), n, inter, act.data());
        decode_linear(act.data(), n, w.down, nullptr, inter, hidden, x, threads);
    }
    run_rms_norm({x, n, 1, hidden, hidden, 0}, final_norm, m.eps, residual.data(), residual.data(), x);
}

}  // namespace prelude_cpu
