# cython: language_level=3
# distutils: language = c++
"""Cython binding of the fasttoken engine. A Core owns one immutable C++ Engine; every call
converts its arguments, releases the GIL for the C++ work (except for decode steps over a few
ids, where the work is shorter than a GIL hand-off), and converts the result once."""

from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE, PyList_New, PyList_SET_ITEM
from cpython.object cimport PyObject, PyTypeObject
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_CheckExact, PyLong_FromLong
from cpython.ref cimport Py_INCREF, Py_XDECREF
from libc.stdlib cimport free
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t, uint8_t, uint32_t, uint64_t
from libcpp.string cimport string
from libcpp.vector cimport vector

from prelude._fasttoken.patterns import reference_pieces
from prelude.tokenizer.base import DecodeStep

cdef enum:
    SMALL_STEP = 16  # ids in a decode_step window below which the GIL is kept
    SMALL_TEXT = 128  # characters of an encode below which the GIL is kept
    LONG_TEXT = 16384  # characters from which the list is built during the encode (_encode_long)


cdef list _ids_list(IntTable* table, const int32_t* ids, size_t count):
    """The ids as a list. Ints are immutable, so each id shares one object (see IntTable)
    instead of an allocation and a free per id. The list is made in C++ (ft_pyints.hpp) for its
    prefetches."""
    return new_id_list(table.ints, table.n, ids, count)


cdef inline TextRef _text_ref(str text) except *:
    """The str's own buffer for the engine to read without the GIL (ft_text.hpp): ASCII is
    UTF-8 already (kind 0); other kinds are transcoded by the encoding thread."""
    cdef TextRef t
    PyUnicode_READY(text)
    t.data = PyUnicode_DATA(text)
    t.length = <size_t>PyUnicode_GET_LENGTH(text)
    t.kind = 0 if PyUnicode_IS_ASCII(text) else PyUnicode_KIND(text)
    return t


cdef object _DecodeStep = DecodeStep


cdef inline object _step(object text, object prefix_offset, object read_offset):
    """DecodeStep(text, prefix_offset, read_offset) without the Python-level NamedTuple __new__:
    allocate the tuple subclass and fill it, as CPython's tuple_subtype_new does."""
    step = PyType_GenericAlloc(<PyTypeObject*>_DecodeStep, 3)
    Py_INCREF(text)
    PyTuple_SET_ITEM(step, 0, text)
    Py_INCREF(prefix_offset)
    PyTuple_SET_ITEM(step, 1, prefix_offset)
    Py_INCREF(read_offset)
    PyTuple_SET_ITEM(step, 2, read_offset)
    return step


cdef inline Py_ssize_t _clamp(Py_ssize_t i, Py_ssize_t n):
    """Python slice-bound semantics, so ids[a:b] here means what it means in base.py."""
    if i < 0:
        i += n
        if i < 0:
            return 0
    return n if i > n else i


cdef void _copy_ids(list items, Py_ssize_t start, Py_ssize_t stop, int32_t* dst) except *:
    # Cython's uint32_t conversion reads small ints' digits directly and raises OverflowError
    # for negative or too large ids, as HF's u32 conversion does.
    cdef Py_ssize_t i
    cdef uint32_t value
    for i in range(start, stop):
        value = <object>PyList_GET_ITEM(items, i)
        dst[i - start] = <int32_t>value


cdef void _fill_ids(object ids, Py_ssize_t start, vector[int32_t]& out) except *:
    cdef list items = ids if type(ids) is list else list(ids)
    cdef Py_ssize_t n = PyList_GET_SIZE(items)
    out.resize(n - start if n > start else 0)
    _copy_ids(items, start, n, out.data())


cdef class Core:
    cdef Engine* engine
    cdef object reference  # callable(text, add_special_tokens) used for kNeedReference inputs
    cdef object regexes  # Split regexes the `regex` module runs, or None when a scanner does
    cdef IntTable ints

    def __cinit__(self):
        self.engine = new Engine()

    def __dealloc__(self):
        cdef size_t i
        if self.ints.ints != NULL:
            for i in range(self.ints.n):
                Py_XDECREF(self.ints.ints[i])
            free(self.ints.ints)
        del self.engine

    cdef void _make_int_table(self) except *:
        cdef size_t n = self.engine.decoder.token_offsets.size()
        n = n - 1 if n else 0
        self.ints.ints = <PyObject**>huge_zeroed((n if n else 1) * sizeof(PyObject*))
        self.ints.n = n

    def __init__(self, plan, reference, const uint8_t[::1] tables=None):
        """From a Plan, or (plan None) from bytes `save` wrote; `tables` must then be checked
        against checksum first. Loading re-checks every length and offset, and raises
        RuntimeError on anything malformed."""
        self.reference = reference
        if plan is None:
            load_engine(self.engine[0], &tables[0] if tables.shape[0] else NULL, tables.shape[0])
            self.regexes = None
            self._make_int_table()
            return
        self.regexes = plan.regexes
        cdef Engine* e = self.engine
        cdef int32_t[::1] ids_view
        cdef uint32_t[::1] offsets_view
        build_classes(e[0], plan.classes)
        if plan.nfc is not None:
            words, decompositions, pairs = plan.nfc
            build_nfc(e[0], words, [x for cp, seq in decompositions for x in (cp, len(seq), *seq)],
                      [x for triple in pairs for x in triple])
        for kind, a, b in plan.normalizers:
            add_normalizer(e[0], kind, a, b)
        for normalized, entries in ((False, plan.raw_added), (True, plan.normalized_added)):
            build_added(e[0], normalized, [c for c, _, _ in entries], [i for _, i, _ in entries],
                        [f for _, _, f in entries])
        e.pattern = plan.pattern
        e.max_digits = plan.max_digits
        e.byte_level = plan.byte_level
        ids_view = plan.vocab_ids
        offsets_view = plan.vocab_offsets
        if ids_view.shape[0]:
            build_vocab(e[0], plan.vocab_keys, &offsets_view[0], &ids_view[0], ids_view.shape[0])
        ids_view = plan.merges
        if ids_view.shape[0]:
            build_merges(e[0], &ids_view[0], ids_view.shape[0] // 3)
        for b in range(256):
            e.byte_ids[b] = plan.byte_ids[b]
            e.fallback_ids[b] = plan.fallback_ids[b]
        e.ignore_merges = plan.ignore_merges
        e.byte_fallback = plan.byte_fallback
        e.unk_id = plan.unk_id
        e.fuse_unk = plan.fuse_unk
        e.prefix_ids = plan.prefix_ids
        e.suffix_ids = plan.suffix_ids
        e.word_boundary = plan.word_boundary
        e.decoder.byte_level = plan.byte_level
        e.decoder.token_bytes = plan.token_bytes
        e.decoder.token_offsets = plan.token_offsets
        e.decoder.token_flags = plan.token_flags
        e.decoder.token_byte = plan.token_byte
        e.decoder.strip_content = plan.strip_content
        e.decoder.strip_start = plan.strip_start
        e.decoder.first_token_bytes = plan.first_token_bytes
        e.decoder.first_token_offsets = plan.first_token_offsets
        if plan.metaspace is not None:
            e.metaspace = True
            e.ms_replacement, e.ms_prepend, e.ms_split = plan.metaspace
        e.finalize()
        self._make_int_table()

    def save(self):
        """The built tables as bytes (see ft_store.hpp); only for scanner-split tokenizers."""
        if self.regexes is not None:
            raise ValueError("tokenizers split by the regex module are not cached")
        return <bytes>save_engine(self.engine[0])

    def encode(self, str text, bint add_special_tokens=True):
        if self.regexes is not None:
            return self._encode_with_regex(text, add_special_tokens)
        cdef TextRef t = _text_ref(text)
        cdef const int32_t* out
        cdef size_t count
        cdef int status
        if t.length < SMALL_TEXT:
            # As for decode steps: a short text is less work than handing the GIL over and back.
            out = self.engine.encode_scratch(t, add_special_tokens, &status, &count)
        elif t.length < LONG_TEXT:
            with nogil:
                out = self.engine.encode_scratch(t, add_special_tokens, &status, &count)
        else:
            return self._encode_long(text, t, add_special_tokens)
        if status != kOk:
            return self._unencoded(text, status, add_special_tokens)
        return _ids_list(&self.ints, out, count)

    cdef object _unencoded(self, str text, int status, bint add_special_tokens):
        """What an encode answers for a status other than kOk: HF's ids (kNeedReference), or the
        UnicodeEncodeError CPython's UTF-8 conversion raises (kNotUtf8, a lone surrogate)."""
        cdef Py_ssize_t n
        if status == kNotUtf8:
            PyUnicode_AsUTF8AndSize(text, &n)  # raises
        return self.reference(text, add_special_tokens)

    cdef object _encode_long(self, str text, TextRef t, bint add_special_tokens):
        """A text long enough for the parallel split (ft_parallel.hpp): the list is built from
        the chunks already finished while the pool encodes the rest (ft_pyints.hpp ListSink), so
        building it overlaps the encode instead of following it."""
        cdef ListSink result
        cdef const int32_t* out
        cdef size_t count
        cdef int status
        result.init(self.ints.ints, self.ints.n, t.length // 3)
        cdef Sink* sink = result.sink()
        with nogil:
            out = self.engine.encode_scratch(t, add_special_tokens, &status, &count, sink)
        if status != kOk:
            return self._unencoded(text, status, add_special_tokens)
        return result.finish(out, count)

    cdef object _encode_with_regex(self, str text, bint add_special_tokens):
        """The path for unrecognized Split regexes: C++ up to the pre-tokenizer, the `regex`
        module for the split, C++ again for the BPE."""
        cdef Py_ssize_t n
        cdef const uint8_t* s = <const uint8_t*>PyUnicode_AsUTF8AndSize(text, &n)
        cdef vector[Segment] segs
        cdef vector[Segment] items
        cdef vector[int32_t] out
        cdef string arena
        cdef Segment item
        cdef int status
        with nogil:
            status = self.engine.segment(s, <size_t>n, segs, arena)
        if status == kNeedReference:
            return self.reference(text, add_special_tokens)
        cdef bytes normalized = arena
        cdef bytearray pieces = bytearray()
        for seg in segs:
            if seg.id >= 0:
                items.push_back(seg)
                continue
            for piece in reference_pieces(self.regexes, normalized[seg.begin:seg.end].decode("utf-8")):
                encoded = (<str>piece).encode("utf-8")
                item.begin = len(pieces)
                item.end = item.begin + len(encoded)
                item.id = -1
                items.push_back(item)
                pieces += encoded
        cdef bytes buf = bytes(pieces)
        cdef const uint8_t* p = <const uint8_t*><const char*>buf
        with nogil:
            self.engine.encode_items(p, items, add_special_tokens, out)
        return _ids_list(&self.ints, out.data(), out.size())

    def encode_batch(self, texts, bint add_special_tokens=True):
        if self.regexes is not None:
            return [self._encode_with_regex(t, add_special_tokens) for t in texts]
        cdef list items = list(texts)
        cdef Py_ssize_t count = len(items), i
        cdef vector[TextRef] refs
        refs.resize(count)
        for i in range(count):
            if type(items[i]) is not str:
                raise TypeError(f"encode_batch expects str items, got {type(items[i]).__name__}")
            refs[i] = _text_ref(items[i])
        cdef list result = PyList_New(count)
        if count == 0:
            return result
        # The lists are built during run(), between the calling thread's own blocks (ft_batch.hpp).
        cdef BatchLists* batch = new BatchLists(<PyObject*>result, self.ints.ints, self.ints.n)
        try:
            with nogil:
                batch.run(self.engine[0], refs, add_special_tokens)
            batch.finish()
            for i in range(count):
                if batch.status(i) != kOk:
                    item = self._unencoded(items[i], batch.status(i), add_special_tokens)
                    Py_INCREF(item)
                    PyList_SET_ITEM(result, i, item)
        finally:
            del batch
        return result

    def decode(self, ids, bint skip_special_tokens=False):
        cdef vector[int32_t] v
        cdef string out
        _fill_ids(ids, 0, v)
        with nogil:
            self.engine.decode(v.data(), v.size(), skip_special_tokens, out)
        return PyUnicode_DecodeUTF8(out.data(), <Py_ssize_t>out.size(), NULL)

    def decode_step(self, ids, prefix_offset, read_offset, bint skip_special_tokens=False):
        cdef list items = ids if type(ids) is list else list(ids)
        cdef Py_ssize_t n = PyList_GET_SIZE(items)
        cdef Py_ssize_t p = _clamp(prefix_offset, n)
        cdef Py_ssize_t r = _clamp(read_offset, n)
        cdef size_t n_prefix = <size_t>(r - p if r > p else 0)
        cdef size_t n_all = <size_t>(n - p)
        cdef int32_t small[SMALL_STEP]
        cdef vector[int32_t] large
        cdef const int32_t* window
        cdef string text
        cdef bint has_text
        if n_all <= SMALL_STEP:
            # A streaming step usually decodes a handful of ids: handing the GIL over and back
            # would cost more than the work, and holding it this briefly blocks no one.
            _copy_ids(items, p, n, small)
            has_text = self.engine.decode_step(small, n_prefix, n_all, skip_special_tokens, text)
        else:
            _fill_ids(items, p, large)
            window = large.data()
            with nogil:
                has_text = self.engine.decode_step(window, n_prefix, n_all, skip_special_tokens, text)
        if has_text:
            return _step(PyUnicode_DecodeUTF8(text.data(), <Py_ssize_t>text.size(), NULL),
                         read_offset, n)
        return _step("", prefix_offset, read_offset)


def payload_checksum(const uint8_t[::1] data):
    """The checksum the table cache stores beside the tables (ft_store.hpp)."""
    cdef uint64_t h
    with nogil:
        h = checksum(&data[0] if data.shape[0] else NULL, data.shape[0])
    return h


def first_invalid_id(list ids, long long limit):
    """The index of ids' first item that is not a token id in [0, limit) (an int, not a bool),
    or -1: one pass in C where Python's type, min and max passes took some 80K instructions for
    a 128-token prompt, 6% of what the event loop spends on a request."""
    cdef Py_ssize_t i
    cdef object item
    cdef long long value
    cdef int overflow
    for i in range(PyList_GET_SIZE(ids)):
        item = <object>PyList_GET_ITEM(ids, i)
        if not PyLong_CheckExact(item):
            return i
        value = PyLong_AsLongLongAndOverflow(item, &overflow)
        if overflow or value < 0 or value >= limit:
            return i
    return -1
