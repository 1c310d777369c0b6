// encode_batch: the texts are encoded on the pool in blocks of neighbours, and the calling
// thread turns finished blocks into result lists, under the GIL, between blocks of its own.
// Building the lists (and the cyclic GC's passes over them, which their allocations set off)
// is Python-object work only one thread can do; done after the encode, it would serialize a
// large share of the batch on the calling thread (`python -m bench.tokenizer`). Needs the GIL
// around construction and finish(); only core.pyx includes it.
#pragma once

#include <Python.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "ft_engine.hpp"
#include "ft_pool.hpp"
#include "ft_pyints.hpp"

namespace ft {

// Batches under kParallelBytes stay on the calling thread, where waking the workers would cost
// more than it saves.
constexpr size_t kParallelBytes = 16 * 1024;

// Block buffers kept between batches (up to kKeptIds ids in all): a batch's buffers, freed at
// its end, would go back to the kernel and come back as fresh pages, each first touch a page
// fault on the calling thread.
class BlockBuffers {
public:
    static BlockBuffers& get() {
        static BlockBuffers cache;
        return cache;
    }
    std::vector<int32_t> take() {
        std::lock_guard<std::mutex> lock(mu_);
        if (free_.empty()) return {};
        std::vector<int32_t> v = std::move(free_.back());
        free_.pop_back();
        held_ -= v.capacity();
        return v;
    }
    void give(std::vector<int32_t>&& v) {
        v.clear();
        std::lock_guard<std::mutex> lock(mu_);
        if (held_ + v.capacity() > kKeptIds) return;
        held_ += v.capacity();
        free_.push_back(std::move(v));
    }

private:
    static constexpr size_t kKeptIds = size_t(4) << 20;
    std::mutex mu_;
    std::vector<std::vector<int32_t>> free_;
    size_t held_ = 0;
};

class BatchLists {
public:
    // result: a new list of len(texts) NULL items, which finish() fills with the kOk texts'
    // lists (the other texts' items stay NULL for the caller).
    BatchLists(PyObject* result, PyObject** ints, size_t bound) : result_(result), ints_(ints), bound_(bound) {}
    ~BatchLists() {
        for (size_t k = 0; slots_ && k + 1 < starts_.size(); ++k)
            if (slots_[k].ids.capacity()) BlockBuffers::get().give(std::move(slots_[k].ids));
    }

    // Without the GIL; texts must stay alive until finish().
    void run(const Engine& e, const std::vector<TextRef>& texts, bool add_special) {
        status_.assign(texts.size(), kOk);
        at_.resize(texts.size());
        size_t total = 0;
        for (const TextRef& t : texts) total += t.length;
        cut(texts, total);
        const size_t nb = starts_.size() - 1;
        slots_.reset(new Slot[nb]);
        converted_.assign(nb, 0);
        if (total < kParallelBytes) {
            for (size_t k = 0; k < nb; ++k) encode_block(e, texts, add_special, k);
            return;
        }
        const std::thread::id caller = std::this_thread::get_id();
        const std::function<void(size_t)> task = [&](size_t k) {
            encode_block(e, texts, add_special, k);
            const bool mine = std::this_thread::get_id() == caller;
            slots_[k].done.store(mine ? kByCaller : kByWorker, std::memory_order_release);
            if (mine) convert_ready();
        };
        Pool::get().run(nb, task);
    }

    // With the GIL, after run(): converts what is left. -1 with a Python error set if a list
    // could not be made.
    int finish() {
        for (size_t k = low_; k < converted_.size() && !failed_; ++k)
            if (!converted_[k]) convert(k);
        return failed_ ? -1 : 0;
    }

    int status(size_t i) const { return status_[i]; }

private:
    enum : uint8_t { kByCaller = 1, kByWorker = 2 };

    // Blocks of about total / kBlocksPerThread bytes per thread: small enough that the thread
    // finishing last leaves little behind it, large enough that a block's claim and its GIL
    // hand-off are noise.
    void cut(const std::vector<TextRef>& texts, size_t total) {
        constexpr size_t kBlocksPerThread = 32, kMinBlock = 2048;
        const size_t target = total < kParallelBytes ? total + 1 :  // one block: no pool
            std::max(kMinBlock, total / (kBlocksPerThread * Pool::get().threads()));
        starts_.assign(1, 0);
        size_t bytes = 0;
        for (size_t i = 0; i < texts.size(); ++i) {
            bytes += texts[i].length;
            if (bytes >= target || i + 1 == texts.size()) {
                starts_.push_back(i + 1);
                bytes = 0;
            }
        }
    }

    // A block's ids go to one buffer of its own: one allocation per block, not per text.
    void encode_block(const Engine& e, const std::vector<TextRef>& texts, bool add_special, size_t k) {
        std::vector<int32_t>& buf = slots_[k].ids;
        buf = BlockBuffers::get().take();
        size_t bytes = 0;
        for (size_t i = starts_[k]; i < starts_[k + 1]; ++i) bytes += texts[i].length;
        buf.reserve(bytes / 3 + 64);
        for (size_t i = starts_[k]; i < starts_[k + 1]; ++i) {
            int status;
            size_t count;
            const int32_t* ids = e.encode_scratch(texts[i], add_special, &status, &count);
            status_[i] = status;
            at_[i] = buf.size();
            if (status == kOk) buf.insert(buf.end(), ids, ids + count);
        }
    }

    // The calling thread, between its own blocks and without the GIL: converts every finished
    // block under one hold of the GIL, once a worker has finished one (a batch the pool never
    // joined, busy with another, takes the GIL once, in finish()).
    void convert_ready() {
        bool worker = false;
        for (size_t k = low_; k < converted_.size() && !worker; ++k)
            worker = !converted_[k] && slots_[k].done.load(std::memory_order_acquire) == kByWorker;
        if (!worker) return;
        const PyGILState_STATE gil = PyGILState_Ensure();
        for (size_t k = low_; k < converted_.size() && !failed_; ++k)
            if (!converted_[k] && slots_[k].done.load(std::memory_order_acquire)) convert(k);
        PyGILState_Release(gil);
        while (low_ < converted_.size() && converted_[low_]) ++low_;
    }

    void convert(size_t k) {
        converted_[k] = 1;
        const std::vector<int32_t>& buf = slots_[k].ids;
        for (size_t i = starts_[k]; i < starts_[k + 1]; ++i) {
            if (status_[i] != kOk) continue;
            const size_t end = i + 1 < starts_[k + 1] ? at_[i + 1] : buf.size();
            PyObject* list = new_id_list(ints_, bound_, buf.data() + at_[i], end - at_[i]);
            if (!list) { failed_ = true; return; }
            PyList_SET_ITEM(result_, Py_ssize_t(i), list);
        }
    }

    // A block's ids and state, a cache line apart from the next block's: two threads write
    // them side by side. The buffers are freed with the batch: freeing a worker's buffer while
    // it encodes contends for its malloc arena.
    struct alignas(64) Slot {
        std::atomic<uint8_t> done{0};  // kByCaller or kByWorker once encoded
        std::vector<int32_t> ids;
    };

    PyObject* result_;
    PyObject** ints_;
    size_t bound_;
    std::vector<int> status_;
    std::vector<size_t> at_;  // a text's first id in its block's buffer
    std::vector<size_t> starts_;  // block k is texts starts_[k] .. starts_[k + 1]
    std::unique_ptr<Slot[]> slots_;
    std::vector<uint8_t> converted_;  // the calling thread's own
    size_t low_ = 0;  // blocks below it are converted
    bool failed_ = false;
};

}  // namespace ft
