# distutils: language = c++
"""Native CPU kernels. No torch headers: tensors cross as data pointers, and the Python callers
(prelude/model/cpu_linear.py, prelude/executor/attention/torch_ref.py) check dtype, layout
and shapes first. Both run without the GIL."""

cdef extern from "linear.hpp" namespace "prelude_cpu" nogil:
    bint has_int8_products()


def int8_products() -> bool:
    """Whether a packed int8 weight's products run in int8 arithmetic on this CPU (AVX-512 VNNI,
    kernels/cpu/vnni_gemm.hpp, or AVX2, maddubs_gemm.hpp), the rows quantized per row; else in
    fp32, the weight widened."""
    return has_int8_products()


cdef extern from "bf16_gemm.hpp" namespace "prelude_cpu" nogil:
    bint has_avx512_bf16()


def bf16_products() -> bool:
    """Whether a packed bf16 weight's products run in bf16 arithmetic on this CPU (AVX-512 BF16),
    the rows rounded to bf16 (kernels/cpu/bf16_gemm.hpp); else in fp32, the weight widened."""
    return has_avx512_bf16()


cdef extern from "amx_gemm.hpp" namespace "prelude_cpu" nogil:
    bint has_amx()


cdef extern from "simd.hpp" namespace "prelude_cpu" nogil:
    bint has_avx512f()


def wide_vectors() -> bool:
    """Whether the kernels that have sixteen-lane (AVX-512) variants run them on this CPU."""
    return has_avx512f()


def amx_products() -> bool:
    """Whether the bf16 and int8 products of whole 16-row tiles run on AMX's tiles on this CPU
    (and this process may use them; PRELUDE_CPU_AMX=0 turns them off), kernels/cpu/amx_gemm.hpp."""
    return has_amx()


cdef extern from "team.hpp" namespace "prelude_cpu" nogil:
    void hold_team(bint held)


def team_held(held: bool) -> None:
    """Holds the kernels' thread team (True) until released (False): between native calls its
    workers wait for the next one instead of sleeping. Held across a run of native calls with
    Python between them; holds nest."""
    hold_team(held)


from cpython.buffer cimport PyBUF_STRIDED_RO, PyBuffer_Release, PyObject_GetBuffer


def address(object array) -> int:
    """Where an array's data starts (a view's first element; 0 for None), for the kernels' pointer
    arguments: numpy's `.ctypes.data`, which takes about a microsecond a call (it imports a
    module and builds an object each time) where this takes some 50 ns, several times a step."""
    cdef Py_buffer view
    if array is None:
        return 0
    PyObject_GetBuffer(array, &view, PyBUF_STRIDED_RO)
    cdef size_t start = <size_t>view.buf
    PyBuffer_Release(&view)
    return start


# The bindings, one file per family of kernels (Cython's textual include: one extension module).
include "_native_linear.pxi"
include "_native_attention.pxi"
include "_native_elementwise.pxi"
include "_native_step.pxi"
include "_native_vocab.pxi"
include "_native_rows.pxi"
