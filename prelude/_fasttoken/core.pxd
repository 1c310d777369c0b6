# cython: language_level=3
"""The C++ fasttoken engine and the CPython internals core.pyx calls, declared for Cython.
Cython reads this file into core.pyx (same module name), so these names are core.pyx's own."""

from cpython.object cimport PyObject, PyTypeObject
from libc.stdint cimport int32_t, uint8_t, uint32_t, uint64_t
from libcpp.string cimport string
from libcpp.vector cimport vector

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object text, Py_ssize_t* size) except NULL
    object PyType_GenericAlloc(PyTypeObject* cls, Py_ssize_t n)
    void PyTuple_SET_ITEM(object tup, Py_ssize_t i, object item)
    void _incref "Py_INCREF"(PyObject* o)
    void _list_set "PyList_SET_ITEM"(object lst, Py_ssize_t i, PyObject* item)
    int PyUnicode_READY(object text) except -1
    bint PyUnicode_IS_ASCII(object text)
    int PyUnicode_KIND(object text)
    void* PyUnicode_DATA(object text)
    Py_ssize_t PyUnicode_GET_LENGTH(object text)

cdef extern from "ft_engine.hpp" namespace "ft" nogil:
    enum Status:
        kOk
        kNeedReference  # the input needs the reference (HF) encoder
        kNotUtf8  # a lone surrogate: CPython's UTF-8 conversion raises the error

    cdef struct TextRef:
        const void* data
        size_t length
        int kind

    cdef cppclass Sink:
        pass

    cdef cppclass Segment:
        size_t begin
        size_t end
        int32_t id

    cdef cppclass Decoder:
        bint byte_level
        string token_bytes
        vector[uint32_t] token_offsets
        vector[uint8_t] token_flags
        vector[uint8_t] token_byte
        string strip_content
        int strip_start
        string first_token_bytes
        vector[uint32_t] first_token_offsets

    cdef cppclass Engine:
        int pattern
        int max_digits
        bint byte_level
        bint ignore_merges
        bint byte_fallback
        bint fuse_unk
        int32_t byte_ids[256]
        int32_t fallback_ids[256]
        int32_t unk_id
        vector[int32_t] prefix_ids
        vector[int32_t] suffix_ids
        Decoder decoder
        bint metaspace
        string word_boundary
        string ms_replacement
        int ms_prepend
        bint ms_split
        int encode(const uint8_t* s, size_t n, bint add_special, vector[int32_t]& out) except +
        const int32_t* encode_scratch(const TextRef& t, bint add_special, int* status,
                                      size_t* count) except +
        const int32_t* encode_scratch(const TextRef& t, bint add_special, int* status,
                                      size_t* count, Sink* sink) except +
        void finalize() except +
        int segment(const uint8_t* s, size_t n, vector[Segment]& segs, string& arena) except +
        void encode_items(const uint8_t* buf, const vector[Segment]& items, bint add_special,
                          vector[int32_t]& out) except +
        void decode(const int32_t* ids, size_t n, bint skip, string& out) except +
        bint decode_step(const int32_t* ids, size_t n_prefix, size_t n_all, bint skip,
                         string& text) except +

cdef extern from "ft_build.hpp" namespace "ft":
    void build_vocab(Engine& e, const string& keys, const uint32_t* offsets, const int32_t* ids,
                     size_t n) except +
    void build_merges(Engine& e, const int32_t* triples, size_t n) except +
    void add_normalizer(Engine& e, int kind, const string& a, const string& b) except +
    void build_nfc(Engine& e, const string& words, const vector[uint32_t]& decomp_flat,
                   const vector[uint32_t]& pairs_flat) except +
    void build_classes(Engine& e, const string& table) except +
    void build_added(Engine& e, bint normalized, const vector[string]& contents,
                     const vector[int32_t]& ids, const vector[uint8_t]& flags) except +

cdef extern from "ft_store.hpp" namespace "ft":
    string save_engine(Engine& e) except +
    void load_engine(Engine& e, const uint8_t* p, size_t n) except +
    uint64_t checksum(const uint8_t* p, size_t n) nogil

cdef struct IntTable:
    # One shared int object per token id, created on first use (NULL until then): an id costs
    # an increment and a store instead of an allocation, and the list's death a decrement
    # instead of a free. Sized by the decode table (every id the engine can return). The
    # pointers are zeroed at load on a 2 MiB page where the table is 1 MiB or more (ft_mem.hpp):
    # calloc'ed 4 KiB pages leave each first touch to a page fault inside an encode and each
    # later random read to a TLB miss.
    PyObject** ints
    size_t n


cdef extern from "ft_mem.hpp" namespace "ft":
    void* huge_zeroed(size_t n) except +

cdef extern from "ft_pyints.hpp" namespace "ft":
    object new_id_list(PyObject** ints, size_t bound, const int32_t* ids, size_t n)
    cdef cppclass ListSink:
        void init(PyObject** ints, size_t bound, size_t expected)
        Sink* sink()
        object finish(const int32_t* ids, size_t count)

cdef extern from "ft_batch.hpp" namespace "ft":
    cdef cppclass BatchLists:
        BatchLists(PyObject* result, PyObject** ints, size_t bound)
        void run(const Engine& e, const vector[TextRef]& texts, bint add_special) except + nogil
        int finish() except -1
        int status(size_t i)
