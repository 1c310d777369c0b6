// Memory for the large, randomly probed tables (piece cache, vocabulary, merge ranks), asked to
// sit on 2 MiB pages.
//
// A new word's BPE is a chain of dependent lookups in tables of megabytes, and each lookup that
// misses the CPU caches on 4 KiB pages usually misses the TLB as well; under virtualization
// that page walk is two-dimensional and can cost as much as the miss itself. On 2 MiB pages the
// Qwen3 tables need a handful of TLB entries. Where the kernel gives no huge page (THP off, no
// free huge page) this is ordinary memory.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>

#include <sys/mman.h>

namespace ft {

constexpr size_t kHugePage = size_t(1) << 21;
// Below this a table is not worth a 2 MiB page (the rounding would waste more than it saves).
constexpr size_t kHugeMin = size_t(1) << 20;

inline void* huge_alloc(size_t bytes) {
    if (bytes < kHugeMin) {
        void* p = std::malloc(bytes ? bytes : 1);
        if (!p) throw std::bad_alloc();
        return p;
    }
    const size_t size = (bytes + kHugePage - 1) & ~(kHugePage - 1);
    void* p = nullptr;
    if (posix_memalign(&p, kHugePage, size) != 0) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    madvise(p, size, MADV_HUGEPAGE);
#endif
    return p;
}

inline void* huge_zeroed(size_t bytes) {
    void* p = huge_alloc(bytes);
    std::memset(p, 0, bytes);
    return p;
}

// For std::vector: the tables stay vectors (sizes, copies, the store's visitor), only their
// storage moves.
template <class T>
struct HugeAllocator {
    using value_type = T;
    HugeAllocator() = default;
    template <class U>
    HugeAllocator(const HugeAllocator<U>&) {}
    T* allocate(size_t n) { return static_cast<T*>(huge_alloc(n * sizeof(T))); }
    void deallocate(T* p, size_t) { std::free(p); }
    template <class U>
    bool operator==(const HugeAllocator<U>&) const { return true; }
    template <class U>
    bool operator!=(const HugeAllocator<U>&) const { return false; }
};

}  // namespace ft
