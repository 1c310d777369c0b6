// A persistent team of worker threads for the CPU kernels' parallel ranges. Starting a
// std::thread costs tens of µs, and a decode step of a small model runs dozens of parallel pieces
// (every linear layer, the attention, the LM head) of about that size each: spawning per piece
// costs more than it saves. The team's workers poll for a few µs after each piece (within one
// native call the next one follows within that) and then sleep on a condition variable, so an
// idle server does not burn the cores it shares with the event loop; a caller may hold them
// awake across several native calls (Team::hold).
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <unistd.h>
#include <vector>

namespace prelude_cpu {

class Team {
   public:
    // Runs job(t) for t in [0, threads): t = 0 on the caller, the rest on workers. One job at a
    // time: a caller that finds the team busy (another Python thread's kernel) runs all the
    // pieces itself.
    void run(int threads, const std::function<void(int)>& job) {
        std::unique_lock<std::mutex> exclusive(busy_, std::try_to_lock);
        if (threads <= 1 || !exclusive.owns_lock()) {
            for (int t = 0; t < threads || t == 0; ++t) job(t);
            return;
        }
        grow(threads - 1);
        job_ = &job;
        pending_.store(threads - 1, std::memory_order_relaxed);
        {
            std::lock_guard<std::mutex> lock(sleep_);
            const uint64_t next = (signal_.load(std::memory_order_relaxed) >> 32) + 1;
            signal_.store(next << 32 | (uint64_t)(threads - 1), std::memory_order_release);
        }
        wake_.notify_all();
        job(0);
        // A worker the OS has descheduled (the event loop shares the two cores) finishes late.
        // Past kSleepAfter of waiting the caller sleeps until the last worker wakes it, leaving
        // the core to that worker, as spinning on takes the core it needs; sleeping right after
        // the short spin would cost small models' short pieces a wake-up each
        // (`python -m bench.serving.side_by_side`, c=16, on the demo model and a 103M Qwen3).
        const auto sleep_at = std::chrono::steady_clock::now() + kSleepAfter;
        for (long spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
            if (spins < kSpinLimit) continue;
            std::this_thread::yield();
            if (std::chrono::steady_clock::now() < sleep_at) continue;
            std::unique_lock<std::mutex> lock(sleep_);
            done_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
            break;
        }
        job_ = nullptr;
    }

    // While the team is held, its workers wait for the next piece rather than sleep: across
    // `held` native calls with Python between them (an encoder's layers). Without it a worker
    // that slept after its few µs of polling was woken 24 times in all-MiniLM-L6's 1 x 19-token
    // forward, which took 5.6 ms against 4.1 ms held, and more CPU in all (futex round trips in
    // a VM). Not held, a worker that yields on takes a core the event loop and the step thread
    // need: the demo model's decode steps (one team piece each, the LM head) ran 5-25% slower.
    void hold(bool held) { held_.fetch_add(held ? 1 : -1, std::memory_order_relaxed); }

   private:
    static constexpr long kSpinLimit = 1 << 14;  // polls before yielding or sleeping (5-10 µs here)
    static constexpr std::chrono::milliseconds kHeldYield{2};  // a worker's yielding while held, at most
    static constexpr std::chrono::microseconds kSleepAfter{500};  // a caller's wait for late workers

    // The signal once its generation moved past `seen`, or (it has not) when the worker should
    // sleep: after kSpinLimit polls, or while the team is held, after yielding up to kHeldYield.
    uint64_t wait_for_job(uint64_t seen) const {
        uint64_t now = signal_.load(std::memory_order_acquire);
        for (long spins = 0; now >> 32 == seen && spins < kSpinLimit; ++spins) now = signal_.load(std::memory_order_acquire);
        if (now >> 32 != seen || held_.load(std::memory_order_relaxed) <= 0) return now;
        const auto give_up = std::chrono::steady_clock::now() + kHeldYield;
        while (now >> 32 == seen && held_.load(std::memory_order_relaxed) > 0 &&
               std::chrono::steady_clock::now() < give_up) {
            std::this_thread::yield();
            now = signal_.load(std::memory_order_acquire);
        }
        return now;
    }

    void grow(int workers) {
        if (owner_ != getpid()) {  // a forked child inherits the vector, not the threads
            workers_.clear();
            owner_ = getpid();
        }
        while ((int)workers_.size() < workers) {
            const int index = (int)workers_.size() + 1;
            // The generation it has seen is read here, before this job's bump: read in the new
            // thread it could already include the bump, and the job would wait for it forever.
            const uint64_t seen = signal_.load(std::memory_order_acquire) >> 32;
            workers_.emplace_back([this, index, seen] { work(index, seen); });
            workers_.back().detach();
        }
    }

    [[noreturn]] void work(int index, uint64_t seen) {
        for (;;) {
            uint64_t now = wait_for_job(seen);
            if (now >> 32 == seen) {
                std::unique_lock<std::mutex> lock(sleep_);
                wake_.wait(lock, [&] { return signal_.load(std::memory_order_acquire) >> 32 != seen; });
                now = signal_.load(std::memory_order_acquire);
            }
            seen = now >> 32;
            if (index <= (int)(now & 0xffffffffu)) {
                (*job_)(index);
                if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
                    std::lock_guard<std::mutex> lock(sleep_);  // not between the caller's check and its wait
                    done_.notify_one();
                }
            }
        }
    }

    std::mutex busy_;   // held by the caller for the whole job
    std::mutex sleep_;  // guards the sleepers' wake-up
    std::condition_variable wake_;
    std::condition_variable done_;  // the caller's, when it stops spinning for the last worker
    std::vector<std::thread> workers_;  // detached; kept for their count
    pid_t owner_ = 0;
    // A job's generation (high 32 bits) and how many workers it takes, in one word so that a
    // worker reads the count of the generation it saw, never of a later one.
    std::atomic<uint64_t> signal_{0};
    std::atomic<int> pending_{0};  // workers of the current job not yet done
    std::atomic<int> held_{0};     // callers holding the team (hold)
    const std::function<void(int)>* job_ = nullptr;
};

static Team& team() {
    // The process's one team, started on first use and never destroyed: its workers sleep
    // through interpreter shutdown instead of being joined from a static destructor.
    static Team& shared = *new Team;
    return shared;
}

static void hold_team(bool held) { team().hold(held); }

// Below this many floats read, a piece runs on the caller alone: handing it to the team costs a
// few µs, more than such a piece takes. Each kernel asks here, so the decision is made once.
constexpr long kTeamMinFloats = 1 << 16;

static int threads_worth(long floats, int threads) { return floats >= kTeamMinFloats ? threads : 1; }

// Runs fn(t, begin, end) over [0, count) split into at most `threads` ranges whose starts are
// multiples of `align`, on the team; t < threads numbers the range (a slot of per-range scratch).
template <typename Fn>
static void parallel_numbered_ranges(long count, int threads, long align, Fn fn) {
    if (threads < 1) threads = 1;
    const long per = ((count + threads - 1) / threads + align - 1) / align * align;
    const int used = per > 0 ? (int)((count + per - 1) / per) : 1;
    team().run(used, [&](int t) {
        const long begin = t * per, end = begin + per < count ? begin + per : count;
        if (begin < end) fn(t, begin, end);
    });
}

// Runs fn(begin, end) over [0, count) split as parallel_numbered_ranges splits it.
template <typename Fn>
static void parallel_ranges(long count, int threads, long align, Fn fn) {
    parallel_numbered_ranges(count, threads, align, [&](int, long begin, long end) { fn(begin, end); });
}

}  // namespace prelude_cpu
