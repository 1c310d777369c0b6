// How the CPU kernels split their work across threads: on torch's own OpenMP team.
//
// The extension is built with -fopenmp and links libgomp.so.1 by that soname. torch loads first
// (kernels.cpu imports it), so the loader resolves it to the libgomp torch already loaded: the
// kernels' parallel ranges and torch's GEMMs run on the same worker threads. A team of the
// kernels' own (std::threads that spun, then slept) alternated with torch's within every layer;
// each pool's idle worker spun or slept while the other's worked, so on the 2-core machine a
// step waited on three runnable threads for two cores, or woke a sleeping one at every handoff.
// One team took 8-15% off a one-token step (103M model and the demo) at the same CPU time
// (README "CPU threads"). How long its workers spin between pieces is the process's
// GOMP_SPINCOUNT, which `python -m prelude` sets (prelude/__main__.py).
#pragma once
#include <omp.h>

namespace prelude_cpu {

// Below this many floats read, a piece runs on the caller alone: handing it to the team costs a
// few µs, more than such a piece takes. Each kernel asks here, so the decision is made once.
constexpr long kTeamMinFloats = 1 << 16;

static int threads_worth(long floats, int threads) { return floats >= kTeamMinFloats ? threads : 1; }

// Runs fn(begin, end) over [0, count) split into at most `threads` ranges whose starts are
// multiples of `align`, one range per thread of the team.
template <typename Fn>
static void parallel_ranges(long count, int threads, long align, Fn fn) {
    if (threads < 1) threads = 1;
    const long per = ((count + threads - 1) / threads + align - 1) / align * align;
    const int used = per > 0 ? (int)((count + per - 1) / per) : 1;
    if (used <= 1) {
        if (count > 0) fn(0, count);
        return;
    }
#pragma omp parallel num_threads(used)
    {
        const long begin = omp_get_thread_num() * per, end = begin + per < count ? begin + per : count;
        if (begin < end) fn(begin, end);
    }
}

}  // namespace prelude_cpu
