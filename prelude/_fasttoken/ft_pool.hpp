// A process-wide pool of worker threads for batch encode. The workers live as long as the
// process, so their per-thread Scratch (and its warm piece cache) survives between batches,
// and a batch pays a wake-up, not a thread start.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace ft {

class Pool {
public:
    // The pool of this process (a forked child gets its own: threads do not survive fork).
    static Pool& get() {
        static std::mutex guard;
        static Pool* pool = nullptr;
        std::lock_guard<std::mutex> lock(guard);
        if (!pool || pool->pid_ != getpid()) pool = new Pool();  // a pre-fork pool is leaked
        return *pool;
    }

    size_t threads() const { return workers_.size() + 1; }

    // Calls task(i) for every i < n on the workers and the calling thread; returns when all
    // are done. The caller only waits for tasks a worker has started: on a busy machine a worker
    // that wakes late finds the work already taken. A caller that finds the pool busy with
    // another batch runs its tasks itself.
    void run(size_t n, const std::function<void(size_t)>& task) {
        std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
        if (!busy.owns_lock() || workers_.empty() || n < 2) {
            for (size_t i = 0; i < n; ++i) task(i);
            return;
        }
        auto job = std::make_shared<Job>(task, n);
        {
            std::lock_guard<std::mutex> lock(mu_);
            job_ = job;
            ++generation_;
        }
        wake_.notify_all();
        job->work();
        std::unique_lock<std::mutex> lock(job->mu);
        job->done.wait(lock, [&] { return job->finished == n; });
    }

private:
    struct Job {
        Job(const std::function<void(size_t)>& t, size_t count) : task(t), n(count) {}
        const std::function<void(size_t)>& task;  // valid while finished < n
        const size_t n;
        std::atomic<size_t> next{0};
        size_t finished = 0;  // under mu
        std::mutex mu;
        std::condition_variable done;
        void work() {
            size_t mine = 0;
            for (size_t i; (i = next.fetch_add(1)) < n; ++mine) task(i);
            if (!mine) return;
            std::lock_guard<std::mutex> lock(mu);
            if ((finished += mine) == n) done.notify_all();
        }
    };

    Pool() : pid_(getpid()) {
        const size_t n = std::max<unsigned>(std::thread::hardware_concurrency(), 1) - 1;
        for (size_t k = 0; k < std::min<size_t>(n, 63); ++k) {
            workers_.emplace_back([this] { loop(); });
            workers_.back().detach();  // lives until exit; never joined
        }
    }
    void loop() {
        size_t seen = 0;
        for (;;) {
            std::shared_ptr<Job> job;
            {
                std::unique_lock<std::mutex> lock(mu_);
                wake_.wait(lock, [&] { return generation_ != seen; });
                seen = generation_;
                job = job_;
            }
            job->work();
        }
    }

    const pid_t pid_;
    std::vector<std::thread> workers_;
    std::mutex busy_, mu_;
    std::condition_variable wake_;
    std::shared_ptr<Job> job_;
    size_t generation_ = 0;
};

}  // namespace ft
