// A linear layer's product on the CPU in fp32, out[n, outputs] = x[n, inputs] . w^T, on the
// kernel that suits the row count: a few rows are bound by reading the weight, and skinny_gemm
// streams it once; past kStreamRows the product is compute-bound, and packed_gemm runs on the
// weight's packed copy when the caller has one (at 12 rows and more it was faster on every
// layer shape of the demo model and the 103M Qwen3, on 2 threads).
#pragma once
#include "packed_gemm.hpp"
#include "skinny_gemm.hpp"

namespace prelude_cpu {

// packed: pack_weight's copy of w, or null. inputs must be a multiple of 8 (skinny_gemm's).
static void linear_rows(const float* x, long n, const float* w, const float* packed, long inputs, float* out,
                        long outputs, int threads) {
    if (packed != nullptr && n > kStreamRows) packed_gemm(x, n, packed, inputs, out, outputs, threads);
    else skinny_gemm(x, n, w, inputs, out, outputs, threads);
}

}  // namespace prelude_cpu
