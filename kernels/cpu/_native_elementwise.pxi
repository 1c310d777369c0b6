# Norms, rotary embedding and gated activations (included by _native.pyx).

cdef extern from "elementwise.hpp" namespace "prelude_cpu" nogil:
    cdef struct Strided3:
        const float* ptr
        long rows, heads, dim, row_stride, head_stride
    void run_rms_norm(Strided3 x, const float* weight, float eps, const float* residual, float* residual_out,
                      float* out)
    void run_rotate(Strided3 x, const float* cos, const float* sin, long cs_stride, float* out)
    void run_silu_and_mul(const float* x, long rows, long width, float* out)
    void run_gelu_and_mul(const float* x, long rows, long width, float* out)
    void team_rms_norm(Strided3 x, const float* weight, float eps, const float* residual, float* residual_out,
                       float* out, int threads)
    void team_rotate(Strided3 x, const float* cos, const float* sin, long cs_stride, float* out, int threads)
    void team_gated(bint gelu, const float* x, long rows, long width, float* out, int threads)
    void team_layer_norm(const float* x, const float* residual, long rows, long dim, const float* weight,
                         const float* bias, float eps, float* out, int threads)
    void run_gelu(const float* x, float* out, long n)

cdef extern from "team.hpp" namespace "prelude_cpu" nogil:
    int threads_worth(long floats, int threads)


cdef Strided3 _strided3(size_t ptr, long rows, long heads, long dim, long row_stride, long head_stride):
    cdef Strided3 s
    s.ptr = <const float*>ptr
    s.rows, s.heads, s.dim, s.row_stride, s.head_stride = rows, heads, dim, row_stride, head_stride
    return s


# The elementwise kernels keep the GIL on few rows (a decode step's: a microsecond or two, less
# than handing the GIL to the event loop and getting it back) and let it go on a prompt's many,
# which they split across the thread team.
def rms_norm(size_t x_ptr, long rows, long heads, long dim, long row_stride, long head_stride, size_t weight_ptr,
             float eps, size_t residual_ptr, size_t residual_out_ptr, size_t out_ptr, int threads) -> None:
    """out = weight * v / sqrt(mean(v^2) + eps) per [dim] vector, v = x (+ residual, written to
    residual_out; 0 pointers when absent). x strided over rows and heads, the rest contiguous."""
    cdef Strided3 x = _strided3(x_ptr, rows, heads, dim, row_stride, head_stride)
    threads = threads_worth(rows * heads * dim, threads)
    if threads == 1:
        run_rms_norm(x, <const float*>weight_ptr, eps, <const float*>residual_ptr, <float*>residual_out_ptr,
                     <float*>out_ptr)
        return
    with nogil:
        team_rms_norm(x, <const float*>weight_ptr, eps, <const float*>residual_ptr, <float*>residual_out_ptr,
                      <float*>out_ptr, threads)


def rotate(size_t x_ptr, long rows, long heads, long dim, long row_stride, long head_stride, size_t cos_ptr,
           size_t sin_ptr, long cs_stride, size_t out_ptr, int threads) -> None:
    """Neox rotary embedding of x (strided over rows and heads) into contiguous out."""
    cdef Strided3 x = _strided3(x_ptr, rows, heads, dim, row_stride, head_stride)
    threads = threads_worth(rows * heads * dim, threads)
    if threads == 1:
        run_rotate(x, <const float*>cos_ptr, <const float*>sin_ptr, cs_stride, <float*>out_ptr)
        return
    with nogil:
        team_rotate(x, <const float*>cos_ptr, <const float*>sin_ptr, cs_stride, <float*>out_ptr, threads)


def silu_and_mul(size_t x_ptr, long rows, long width, size_t out_ptr, int threads) -> None:
    """out[rows, width] = silu(x[:, :width]) * x[:, width:], both contiguous."""
    _gated(False, x_ptr, rows, width, out_ptr, threads)


def gelu_and_mul(size_t x_ptr, long rows, long width, size_t out_ptr, int threads) -> None:
    """out[rows, width] = gelu(x[:, :width]) * x[:, width:] (the erf GELU), both contiguous."""
    _gated(True, x_ptr, rows, width, out_ptr, threads)


cdef void _gated(bint gelu, size_t x_ptr, long rows, long width, size_t out_ptr, int threads):
    threads = threads_worth(2 * rows * width, threads)
    if threads == 1:
        if gelu:
            run_gelu_and_mul(<const float*>x_ptr, rows, width, <float*>out_ptr)
        else:
            run_silu_and_mul(<const float*>x_ptr, rows, width, <float*>out_ptr)
        return
    with nogil:
        team_gated(gelu, <const float*>x_ptr, rows, width, <float*>out_ptr, threads)


# An encoder's LayerNorm runs on the team (where its rows are worth it), without the GIL; its GELU
# on the calling thread, GIL held: kernels/cpu/ops.py hands it only a few rows (BERT's runs in
# its dense layer's epilogue, larger ones stay on torch's threads).
def layer_norm(size_t x_ptr, size_t residual_ptr, long rows, long dim, size_t weight_ptr, size_t bias_ptr,
               float eps, size_t out_ptr, int threads) -> None:
    """out = LayerNorm(x (+ residual)) * weight (+ bias) per row; 0 pointers when absent; all
    contiguous [rows, dim]; rows split across `threads` of the team where it pays."""
    with nogil:
        team_layer_norm(<const float*>x_ptr, <const float*>residual_ptr, rows, dim, <const float*>weight_ptr,
                        <const float*>bias_ptr, eps, <float*>out_ptr, threads_worth(rows * dim, threads))


def gelu(size_t x_ptr, size_t out_ptr, long n) -> None:
    """out = GELU(x) (the erf form; out may be x), n floats, n % 8 == 0."""
    run_gelu(<const float*>x_ptr, <float*>out_ptr, n)
