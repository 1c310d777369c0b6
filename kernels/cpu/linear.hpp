// A linear layer's product on the CPU, out[n, outputs] = x[n, inputs] . w^T, in fp32 from a weight
// stored in fp32, bf16 or int8 (weights.hpp), on the kernel of the weight's layout: packed panels
// (the decoder layers' weights: a few rows stream them, more go through register tiles; int8
// ones in int8 arithmetic where the CPU has VNNI, bf16 ones in bf16 where it has AVX-512 BF16,
// whole 16-row tiles of either on AMX where it has that) or rows
// (an LM head tied to its embedding, which needs the rows for its lookups).
#pragma once
#include "bf16_gemm.hpp"
#include "packed_gemm.hpp"
#include "skinny_gemm.hpp"
#include "vnni_gemm.hpp"
#include "weights.hpp"

namespace prelude_cpu {

// inputs must be a multiple of 8. `bias` (or null) and `activation`: packed_gemm.hpp's epilogue,
// in the panel kernels' blocks; the by-rows and int8-product kernels apply it after the product.
static void linear_rows(const float* x, long n, const Weight& w, long inputs, float* out, long outputs, int threads,
                        const float* bias = nullptr, long activation = kNoActivation) {
    if (w.layout == kByRows || (w.format == kI8 && has_avx512_vnni())) {
        if (w.layout == kByRows) skinny_gemm(x, n, w, inputs, out, outputs, threads);
        else vnni_gemm(x, n, w, inputs, out, outputs, threads);
        finish_block(out, n, outputs, 0, outputs, bias, activation);
    } else if (w.format == kBF16 && has_avx512_bf16()) {
        bf16_gemm(x, n, w, inputs, out, outputs, threads, bias, activation);
    } else {
        packed_gemm(x, n, w, inputs, out, outputs, threads, bias, activation);
    }
}

}  // namespace prelude_cpu
