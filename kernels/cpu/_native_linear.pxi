# Linear layers: weight conversion and packing, and their products (included by _native.pyx).
from libc.stdint cimport int64_t

cdef extern from "weights.hpp" namespace "prelude_cpu" nogil:
    cdef struct Weight:
        const void* data
        const float* scales
        long format
        long layout
    void convert_rows(const void* w, long source, long outputs, long inputs, long format, void* dst, float* scales,
                      int threads)

cdef extern from "packed_gemm.hpp" namespace "prelude_cpu" nogil:
    long packed_elements(long outputs, long inputs)
    long panel_outputs(long outputs)
    void pack_weight(const void* w, long source, long outputs, long inputs, long format, void* packed,
                     float* scales, int threads)

cdef extern from "linear.hpp" namespace "prelude_cpu" nogil:
    void linear_rows(const float* x, long n, const Weight& w, long inputs, float* out, long outputs, int threads,
                     const float* bias, long activation)
    void weight_rows(const Weight& w, long inputs, const int64_t* ids, long n, float* out)


def packed_size(long outputs, long inputs) -> int:
    """Elements of pack_linear's copy of an [outputs, inputs] weight."""
    return packed_elements(outputs, inputs)


def scales_size(long outputs) -> int:
    """Floats of pack_linear's int8 scales of a weight of `outputs` rows: a scale per output
    (padded to whole panels), then as many int32 weight sums (kernels/cpu/packed_gemm.hpp)."""
    return 2 * panel_outputs(outputs)


def pack_linear(size_t w_ptr, long outputs, long inputs, long format, size_t packed_ptr, size_t scales_ptr,
                int threads, long source=0) -> None:
    """Copies w [outputs, inputs] (contiguous; `source` 0 fp32, 1 bf16) into packed panels at
    packed_ptr (packed_size elements of `format`: 0 fp32, 1 bf16, 2 int8, which also writes
    scales_size floats of per-output scales at scales_ptr)."""
    with nogil:
        pack_weight(<const void*>w_ptr, source, outputs, inputs, format, <void*>packed_ptr, <float*>scales_ptr,
                    threads)


def convert_weight(size_t w_ptr, long outputs, long inputs, long format, size_t dst_ptr, size_t scales_ptr,
                   int threads, long source=0) -> None:
    """Copies w [outputs, inputs] (contiguous; `source` 0 fp32, 1 bf16) into the same layout in
    `format` at dst_ptr (int8: and its per-row scales, `outputs` floats, at scales_ptr)."""
    with nogil:
        convert_rows(<const void*>w_ptr, source, outputs, inputs, format, <void*>dst_ptr, <float*>scales_ptr,
                     threads)


def rows_of(size_t w_ptr, size_t scales_ptr, long format, long inputs, long rows, size_t ids_ptr, long n,
            size_t out_ptr, long layout=0) -> None:
    """out[n, inputs] (fp32) = rows ids[n] (int64) of a weight of `rows` rows in `format` (fp32,
    bf16 or int8), by rows (layout 0, convert_weight's) or in panels (1, pack_weight's), widened
    (int8: times each row's scale). An id outside 0..rows-1 raises IndexError before anything is
    read: the kernel reads unchecked, and the panels' index arithmetic would take a negative id, or
    one in the last panel's padding, for a row."""
    cdef const int64_t* ids = <const int64_t*>ids_ptr
    cdef long i
    for i in range(n):
        if ids[i] < 0 or ids[i] >= rows:
            raise IndexError(f"row index {ids[i]} out of range for a weight of {rows} rows")
    cdef Weight w
    w.data, w.scales, w.format, w.layout = <const void*>w_ptr, <const float*>scales_ptr, format, layout
    with nogil:
        weight_rows(w, inputs, ids, n, <float*>out_ptr)


def matmul(size_t x_ptr, long n, size_t w_ptr, size_t scales_ptr, long format, long layout, long inputs,
           size_t out_ptr, long outputs, int threads, size_t bias_ptr=0, long activation=0) -> None:
    """out[n, outputs] = act(x[n, inputs] @ w.T + bias) (kernels/cpu/linear.hpp), x and out fp32; w
    in `format` (0 fp32, 1 bf16, 2 int8 with its scales, 3 bf16x3: the bf16 panels of an fp32
    weight's rounding, then of the rest, inputs % 32 == 0, on a CPU with AMX) by rows (layout 0) or
    packed (1, pack_linear's); bias fp32 (0: none), activation 0 none or 1 GELU (the erf form). Contiguous,
    inputs % 8 == 0."""
    cdef Weight w
    w.data, w.scales, w.format, w.layout = <const void*>w_ptr, <const float*>scales_ptr, format, layout
    with nogil:
        linear_rows(<const float*>x_ptr, n, w, inputs, <float*>out_ptr, outputs, threads, <const float*>bias_ptr,
                    activation)

