// The decoder's norms, rotary embedding and SwiGLU activation (and an encoder's LayerNorm and
// GELU) for fp32 on the CPU, one pass over the data each. In torch each is six to nine ops, and on a decode step's few rows every op
// costs more in dispatch than in arithmetic: they were a seventh of a small model's step.
// Inputs may be strided over rows and heads (q and k are views into the fused qkv output); each
// vector of `dim` floats is contiguous, dim a multiple of 8 (16 for the rotation's halves).
#pragma once
#include <cmath>

#include "simd.hpp"
#include "team.hpp"

namespace prelude_cpu {

// A [rows, heads, dim] operand: element (t, h, i) at ptr[t * row_stride + h * head_stride + i].
struct Strided3 {
    const float* ptr;
    long rows, heads, dim, row_stride, head_stride;
};

// out[t, h] = weight * v / sqrt(mean(v^2) + eps) with v = x[t, h] (+ residual[t], when given,
// with heads == 1; the sum is also written to residual_out). out, residual, residual_out:
// contiguous. Sums in the same order as the torch reference: v * inv first, then the weight.
__attribute__((always_inline)) static inline void rms_norm_body(Strided3 x, const float* weight, float eps,
                                                                 const float* residual, float* residual_out, float* out) {
    const long d = x.dim;
    for (long t = 0; t < x.rows; ++t) {
        for (long h = 0; h < x.heads; ++h) {
            const float* src = x.ptr + t * x.row_stride + h * x.head_stride;
            float* dst = out + (t * x.heads + h) * d;
            if (residual != nullptr) {
                float* sum = residual_out + t * d;
                for (long i = 0; i < d; i += 8) store8(sum + i, load8(src + i) + load8(residual + t * d + i));
                src = sum;
            }
            v8f acc = {};
            for (long i = 0; i < d; i += 8) { v8f v = load8(src + i); acc += v * v; }
            const float inv = 1.0f / std::sqrt(hsum(acc) / (float)d + eps);
            for (long i = 0; i < d; i += 8) store8(dst + i, load8(weight + i) * (load8(src + i) * inv));
        }
    }
}

// Neox rotation (halves): out[t, h] = [x1 cos - x2 sin, x2 cos + x1 sin], cos and sin rows of
// dim / 2 at cos + t * cs_stride and sin + t * cs_stride. out contiguous.
__attribute__((always_inline)) static inline void rotate_body(Strided3 x, const float* cos, const float* sin, long cs_stride,
                                                               float* out) {
    const long half = x.dim / 2;
    for (long t = 0; t < x.rows; ++t) {
        const float* c = cos + t * cs_stride;
        const float* s = sin + t * cs_stride;
        for (long h = 0; h < x.heads; ++h) {
            const float* src = x.ptr + t * x.row_stride + h * x.head_stride;
            float* dst = out + (t * x.heads + h) * x.dim;
            for (long i = 0; i < half; i += 8) {
                v8f x1 = load8(src + i), x2 = load8(src + half + i), ci = load8(c + i), si = load8(s + i);
                store8(dst + i, x1 * ci - x2 * si);
                store8(dst + half + i, x2 * ci + x1 * si);
            }
        }
    }
}

// out[t] = act(x[t, :width]) * x[t, width:], x [rows, 2 * width] and out [rows, width] contiguous;
// act is SiLU (a decoder's SwiGLU) or, with kGelu, the erf GELU (ModernBERT's GeGLU).
template <bool kGelu>
__attribute__((always_inline)) static inline void gated_body(const float* x, long rows, long width, float* out) {
    for (long t = 0; t < rows; ++t) {
        const float* gate = x + t * 2 * width;
        const float* up = gate + width;
        float* dst = out + t * width;
        for (long i = 0; i < width; i += 8) {
            v8f g = load8(gate + i);
            store8(dst + i, (kGelu ? gelu8(g) : g / (1.0f + exp8(v8f{} - g))) * load8(up + i));
        }
    }
}

// An encoder's LayerNorm, after its residual add: out[t] = (v - mean) / sqrt(var + eps) * weight
// + bias with v = x[t] (+ residual[t]), var the biased variance, both over the row's dim floats
// (bias may be null). All contiguous [rows, dim].
__attribute__((always_inline)) static inline void layer_norm_body(const float* x, const float* residual, long rows,
                                                                   long dim, const float* weight, const float* bias,
                                                                   float eps, float* out) {
    for (long t = 0; t < rows; ++t) {
        const float* src = x + t * dim;
        float* dst = out + t * dim;
        if (residual != nullptr) {
            for (long i = 0; i < dim; i += 8) store8(dst + i, load8(src + i) + load8(residual + t * dim + i));
            src = dst;
        }
        v8f acc = {};
        for (long i = 0; i < dim; i += 8) acc += load8(src + i);
        const float mean = hsum(acc) / (float)dim;
        v8f sq = {};
        for (long i = 0; i < dim; i += 8) { const v8f c = load8(src + i) - mean; sq += c * c; }
        const float inv = 1.0f / std::sqrt(hsum(sq) / (float)dim + eps);
        for (long i = 0; i < dim; i += 8) {
            v8f y = (load8(src + i) - mean) * inv * load8(weight + i);
            if (bias != nullptr) y += load8(bias + i);
            store8(dst + i, y);
        }
    }
}

// out = GELU(x) (simd.hpp's gelu8; out may be x), n a multiple of 8.
__attribute__((always_inline)) static inline void gelu_body(const float* x, float* out, long n) {
    for (long i = 0; i < n; i += 8) store8(out + i, gelu8(load8(x + i)));
}

PRELUDE_CPU_VARIANTS(layer_norm, (const float* x, const float* residual, long rows, long dim, const float* weight,
                                  const float* bias, float eps, float* out),
                     (x, residual, rows, dim, weight, bias, eps, out))
PRELUDE_CPU_VARIANTS(gelu, (const float* x, float* out, long n), (x, out, n))

PRELUDE_CPU_VARIANTS(rms_norm, (Strided3 x, const float* weight, float eps, const float* residual, float* residual_out, float* out),
                     (x, weight, eps, residual, residual_out, out))
PRELUDE_CPU_VARIANTS(rotate, (Strided3 x, const float* cos, const float* sin, long cs_stride, float* out),
                     (x, cos, sin, cs_stride, out))
PRELUDE_CPU_VARIANTS_OF(silu_and_mul, gated_body<false>, (const float* x, long rows, long width, float* out),
                        (x, rows, width, out))
PRELUDE_CPU_VARIANTS_OF(gelu_and_mul, gated_body<true>, (const float* x, long rows, long width, float* out),
                        (x, rows, width, out))

// The same three over a prompt's many rows, split by rows across `threads` of the team (the
// caller asked threads_worth): on one thread a prefill's SwiGLU is a visible share of a layer.
static void team_rms_norm(Strided3 x, const float* weight, float eps, const float* residual, float* residual_out,
                          float* out, int threads) {
    const long d = x.dim;
    parallel_ranges(x.rows, threads, 1, [&](long begin, long end) {
        Strided3 part = x;
        part.ptr = x.ptr + begin * x.row_stride;
        part.rows = end - begin;
        run_rms_norm(part, weight, eps, residual ? residual + begin * d : nullptr,
                     residual_out ? residual_out + begin * d : nullptr, out + begin * x.heads * d);
    });
}

static void team_rotate(Strided3 x, const float* cos, const float* sin, long cs_stride, float* out, int threads) {
    parallel_ranges(x.rows, threads, 1, [&](long begin, long end) {
        Strided3 part = x;
        part.ptr = x.ptr + begin * x.row_stride;
        part.rows = end - begin;
        run_rotate(part, cos + begin * cs_stride, sin + begin * cs_stride, cs_stride, out + begin * x.heads * x.dim);
    });
}

static void team_gated(bool gelu, const float* x, long rows, long width, float* out, int threads) {
    parallel_ranges(rows, threads, 1, [&](long begin, long end) {
        (gelu ? run_gelu_and_mul : run_silu_and_mul)(x + begin * 2 * width, end - begin, width, out + begin * width);
    });
}

// An encoder's LayerNorm over many rows, split the same way.
static void team_layer_norm(const float* x, const float* residual, long rows, long dim, const float* weight,
                            const float* bias, float eps, float* out, int threads) {
    parallel_ranges(rows, threads, 1, [&](long begin, long end) {
        run_layer_norm(x + begin * dim, residual ? residual + begin * dim : nullptr, end - begin, dim, weight, bias,
                       eps, out + begin * dim);
    });
}

}  // namespace prelude_cpu
