// The result list of an encode, filled from a table of shared int objects (core.pyx IntTable).
// Needs the GIL; only core.pyx includes it.
#pragma once

#include <Python.h>

#include <cstddef>
#include <cstdint>

namespace ft {

// Stores the int object of each id into the new list `list` (PyList_New(n)), creating the
// table's object for an id on its first use. Returns false with a Python error set if an int
// cannot be created (the list then holds NULLs past that point, which list_dealloc accepts).
// An id's table slot and its object are both random reads (the table is 8 bytes per vocabulary
// entry, a few hundred KiB of it hot); they are prefetched kAhead ids ahead so the waits
// overlap instead of following one another.
inline bool fill_id_list(PyObject* list, PyObject** ints, size_t bound, const int32_t* ids, size_t n) {
    constexpr size_t kAhead = 16;
    PyObject** items = reinterpret_cast<PyListObject*>(list)->ob_item;
    for (size_t i = 0; i < n && i < kAhead; ++i)
        if (uint32_t(ids[i]) < bound) __builtin_prefetch(&ints[ids[i]]);
    for (size_t i = 0; i < n; ++i) {
        if (i + kAhead < n && uint32_t(ids[i + kAhead]) < bound) __builtin_prefetch(&ints[ids[i + kAhead]]);
        const uint32_t id = uint32_t(ids[i]);
        PyObject* item;
        if (id < bound) {
            item = ints[id];
            if (!item) {
                item = PyLong_FromLong(long(id));
                if (!item) return false;
                ints[id] = item;  // the table's reference
            }
            Py_INCREF(item);
        } else {
            item = PyLong_FromLong(long(int32_t(id)));
            if (!item) return false;
        }
        items[i] = item;
    }
    return true;
}

}  // namespace ft
