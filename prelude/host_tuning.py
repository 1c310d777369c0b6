"""Process-wide settings the server makes once at startup, before the model loads, and the
memory the KV pools live in.

glibc malloc returns freed memory to the kernel (trimming the heap top, unmapping large chunks)
and takes it back on the next allocation through page faults. A server that allocates and frees
the same large, short-lived tensors every step pays those faults periodically: the P99 stalls
measured on CPU (issue #20; LD_PRELOAD of tcmalloc removed them). Keeping the memory instead:
large allocations stay on the heap, and the heap is never trimmed. RSS then stays at its peak, as
it does with tcmalloc. Past glibc's ceiling for the mmap threshold (32 MB) it would still map each
allocation afresh and fault its pages in on every use: 32 passages' up-projection output (37.5 MB)
took 10 ms to allocate and touch against 1 ms from the heap, six times a forward, so nothing is mapped
(a worker thread's arena still maps what its 64 MB heaps cannot hold)."""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import mmap
import os
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
MMAP_THRESHOLD_MAX = 32 * 2**20  # glibc's ceiling on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
NEVER_TRIM = 2**31 - 1  # the largest value mallopt takes: the heap top is never returned


def _glibc_function(name: str):
    """The C library's `name` on Linux, or None (another OS, or a libc without it: musl has no
    mallopt or malloc_trim)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None


def keep_freed_memory() -> bool:
    """Applies the malloc settings above on glibc; False (and nothing changed) elsewhere."""
    mallopt = _glibc_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = (bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(mallopt(M_MMAP_MAX, 0))
          and bool(mallopt(M_TRIM_THRESHOLD, NEVER_TRIM)))
    if not ok:
        logger.debug("mallopt refused the settings; glibc's defaults stay")
    return ok


def release_startup_memory() -> None:
    """Returns the heap's free pages to the kernel once, when the engine is warm: the checkpoint's
    fp32 copies of weights stored narrower or packed (model.cpu_linear) were freed into a heap
    that is otherwise never trimmed (keep_freed_memory), 100 MB on checkpoint B."""
    malloc_trim = _glibc_function("malloc_trim")
    if malloc_trim is not None:
        malloc_trim(0)


# Allocations between two young-generation collections once serving (Python's default is 700). A
# request allocates a few hundred tracked objects, so at the default the collector ran every few
# requests and rescanned what the requests in flight hold each time; at this threshold it runs a
# few times a second under load (about 5% fewer instructions per request at c=64,
# `python -m bench.serving.instructions`), each pass under a few milliseconds.
YOUNG_COLLECTION_THRESHOLD = 20_000


def freeze_startup_objects() -> None:
    """Moves every object alive now (imports, model, tokenizer: about 180K on the demo model) out
    of the garbage collector's reach, then runs the collector as serving wants it. A full
    collection otherwise rescans them all, tens of milliseconds on a small machine, and lands on
    whichever request is in flight when it triggers; they live as long as the process anyway.
    Where the collector was paused for startup (`python -m prelude`), what is alive is startup's own
    and is frozen as it is: the few thousand objects of import-time cycles among it stay, which
    spares startup a full collection (80-120 ms). Elsewhere (a process that ran before serving:
    tests, an application embedding the server) a collection first keeps garbage from being
    frozen. Called once, when the engine is warm."""
    if gc.isenabled():
        gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, *gc.get_threshold()[1:])
    gc.enable()


def set_compute_threads(threads: int | None) -> int:
    """Sets torch's intra-op threads (None: its default, one per core) and returns the count.
    The event loop and the tokenizer pool share the cores with them; docs/design/cpu.md
    ("Threads") has the measurements behind the default."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def default_compute_threads() -> int:
    """torch's default intra-op threads, found without torch: OMP_NUM_THREADS where set, else
    one per physical core this process may run on."""
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        siblings = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        cores.add(siblings.read_text().strip() if siblings.is_file() else str(cpu))
    return max(1, len(cores))


def zeroed_pages(nbytes: int) -> mmap.mmap:
    """Zeros without a startup memset: an anonymous mapping, whose pages the OS hands out already
    zeroed on first touch. In small pages: with 2 MB huge pages (numpy's zeros), each first touch
    zeroes a whole one inside a step, a P99 spike until the whole pool has been used once (issue
    #20)."""
    raw = mmap.mmap(-1, max(1, nbytes))
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # Linux: even where transparent huge pages are "always"
        raw.madvise(mmap.MADV_NOHUGEPAGE)
    return raw
