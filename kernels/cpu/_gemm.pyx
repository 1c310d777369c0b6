# distutils: language = c++
"""Native CPU kernels (no torch headers: tensors cross as data pointers the caller has checked)."""

cdef extern from "skinny_gemm.hpp" namespace "prelude_cpu" nogil:
    void skinny_gemm(const float* x, long n, const float* w, long hidden, float* out, long vocab, int threads)


def skinny_matmul(size_t x_ptr, long n, size_t w_ptr, long hidden, size_t out_ptr, long vocab, int threads) -> None:
    """out[n, vocab] = x[n, hidden] @ w[vocab, hidden].T; fp32, contiguous, hidden % 8 == 0.
    Runs without the GIL."""
    with nogil:
        skinny_gemm(<const float*>x_ptr, n, <const float*>w_ptr, hidden, <float*>out_ptr, vocab, threads)
