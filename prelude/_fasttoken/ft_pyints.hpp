// The result list of an encode, filled from a table of shared int objects (core.pyx IntTable).
// Needs the GIL; only core.pyx includes it.
#pragma once

#include <Python.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "ft_inline.hpp"
#include "ft_out.hpp"

namespace ft {

inline bool fail(PyObject** rest, size_t n) {
    for (size_t i = 0; i < n; ++i) rest[i] = nullptr;
    return false;
}

// A new reference to the int of id, creating the table's object on the id's first use (or,
// for an id past the table, a fresh int); NULL with a Python error set if that fails.
__attribute__((noinline)) inline PyObject* new_int(PyObject** ints, size_t bound, uint32_t id) {
    if (id >= bound) return PyLong_FromLong(long(int32_t(id)));
    PyObject* item = PyLong_FromLong(long(id));
    if (!item) return nullptr;
    ints[id] = item;  // the table's reference
    Py_INCREF(item);
    return item;
}

// Stores the int object of each id at items (new references). Returns false with a Python
// error set if an int cannot be created (items past that point are then NULL).
// An id's table slot and its object are both random reads (the table is 8 bytes per vocabulary
// entry, a few hundred KiB of it hot); the slots are prefetched kAhead ids ahead so the waits
// overlap instead of following one another. The main loop runs while an id kAhead on exists, so
// it needs no bound on the look-ahead, and the rare paths (an id's first use) are out of line:
// the loop is about half the instructions of one with both checks inline.
inline bool fill_ids(PyObject** items, PyObject** ints, size_t bound, const int32_t* ids, size_t n) {
    constexpr size_t kAhead = 16;
    for (size_t i = 0; i < n && i < kAhead; ++i)
        if (uint32_t(ids[i]) < bound) __builtin_prefetch(&ints[ids[i]]);
    auto one = [&](size_t i) FT_INLINE_LAMBDA {
        const uint32_t id = uint32_t(ids[i]);
        PyObject* item = id < bound ? ints[id] : nullptr;
        if (__builtin_expect(item != nullptr, 1)) {
            Py_INCREF(item);
        } else if (!(item = new_int(ints, bound, id))) {
            return false;
        }
        items[i] = item;
        return true;
    };
    size_t i = 0;
    for (; i + kAhead < n; ++i) {
        const uint32_t ahead = uint32_t(ids[i + kAhead]);
        __builtin_prefetch(&ints[ahead < bound ? ahead : 0]);
        if (!one(i)) return fail(items + i, n - i);
    }
    for (; i < n; ++i)
        if (!one(i)) return fail(items + i, n - i);
    return true;
}

// The list of the n ids, or NULL with an error. PyList_New(n) would calloc its items, which
// fill_ids writes over anyway (a 15 KiB memset on an 8K-character encode).
inline PyObject* new_id_list(PyObject** ints, size_t bound, const int32_t* ids, size_t n) {
    if (n == 0) return PyList_New(0);
    if (n > size_t(PY_SSIZE_T_MAX) / sizeof(PyObject*)) return PyErr_NoMemory();
    PyObject** items = static_cast<PyObject**>(PyMem_Malloc(n * sizeof(PyObject*)));
    if (!items) return PyErr_NoMemory();
    PyObject* list = PyList_New(0);
    if (!list) {
        PyMem_Free(items);
        return nullptr;
    }
    PyListObject* l = reinterpret_cast<PyListObject*>(list);
    l->ob_item = items;
    l->allocated = Py_ssize_t(n);
    Py_SET_SIZE(l, Py_ssize_t(n));
    if (!fill_ids(items, ints, bound, ids, n)) Py_CLEAR(list);  // the NULL items are skipped
    return list;
}

// The result list of a long encode, built while the encode runs: its Sink (ft_out.hpp) turns
// each run of finished ids into items under the GIL, in a PyMem block the list then adopts.
// Lives in the calling Python frame; init() before the encode, finish() or the destructor
// after it, both with the GIL.
class ListSink {
public:
    void init(PyObject** ints, size_t bound, size_t expected) {
        ints_ = ints;
        bound_ = bound;
        expected_ = expected;
        sink_ = Sink{&ListSink::take, this};
    }
    Sink* sink() { return &sink_; }
    ~ListSink() { release(); }

    // The list of all count ids (those not taken yet from ids + taken), or NULL with an error.
    PyObject* finish(const int32_t* ids, size_t count) {
        if (!failed_ && !n_) {  // the encode never handed anything over
            return new_id_list(ints_, bound_, ids, count);
        }
        expected_ = count;
        if (!append(ids + n_, count - n_)) { release(); return nullptr; }
        if (cap_ > n_ + n_ / 8) {  // the guess was high: give the rest back
            if (void* p = PyMem_Realloc(items_, n_ * sizeof(PyObject*))) {
                items_ = static_cast<PyObject**>(p);
                cap_ = n_;
            }
        }
        PyObject* list = PyList_New(0);
        if (!list) { release(); return nullptr; }
        PyListObject* l = reinterpret_cast<PyListObject*>(list);
        l->ob_item = items_;
        l->allocated = Py_ssize_t(cap_);
        Py_SET_SIZE(l, Py_ssize_t(n_));
        items_ = nullptr;
        n_ = cap_ = 0;
        return list;
    }

private:
    static void take(void* ctx, const int32_t* ids, size_t n) {
        const PyGILState_STATE gil = PyGILState_Ensure();
        static_cast<ListSink*>(ctx)->append(ids, n);
        PyGILState_Release(gil);
    }
    bool append(const int32_t* ids, size_t count) {
        if (failed_) return false;
        if (n_ + count > cap_) {
            const size_t want = std::max({n_ + count, 2 * cap_, expected_});
            void* p = PyMem_Realloc(items_, want * sizeof(PyObject*));
            if (!p) { PyErr_NoMemory(); failed_ = true; return false; }
            items_ = static_cast<PyObject**>(p);
            cap_ = want;
        }
        if (!fill_ids(items_ + n_, ints_, bound_, ids, count)) {
            for (size_t i = 0; i < count; ++i) Py_XDECREF(items_[n_ + i]);
            failed_ = true;
            return false;
        }
        n_ += count;
        return true;
    }
    void release() {
        for (size_t i = 0; i < n_; ++i) Py_DECREF(items_[i]);
        PyMem_Free(items_);
        items_ = nullptr;
        n_ = cap_ = 0;
    }

    Sink sink_{};
    PyObject** ints_ = nullptr;
    size_t bound_ = 0, expected_ = 0;
    PyObject** items_ = nullptr;  // PyMem block of cap_ pointers, n_ of them references
    size_t n_ = 0, cap_ = 0;
    bool failed_ = false;  // a Python error is set
};

}  // namespace ft
