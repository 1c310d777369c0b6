"""The native kernels' parallel ranges (kernels/cpu/parallel.hpp) run on torch's own OpenMP
threads, and give the single-thread result for any sequence of thread counts, growing, shrinking
and idling between calls, and from several Python threads at once."""
from __future__ import annotations

import random
import subprocess
import sys
import threading
import time

import pytest
import torch

from prelude.model.skinny_linear import skinny_matmul

pytestmark = pytest.mark.skipif(skinny_matmul is None, reason="kernels.cpu is not built")


def _product(x: torch.Tensor, w: torch.Tensor, threads: int) -> torch.Tensor:
    assert skinny_matmul is not None
    out = torch.empty(x.shape[0], w.shape[0])
    skinny_matmul(x.data_ptr(), x.shape[0], w.data_ptr(), w.shape[1], out.data_ptr(), w.shape[0], threads)
    return out


def test_any_sequence_of_thread_counts_gives_the_same_product():
    gen = torch.Generator().manual_seed(0)
    # 2048 x 64: just past the size the kernels hand to the team (kernels/cpu/parallel.hpp).
    w, x = torch.randn(2048, 64, generator=gen), torch.randn(3, 64, generator=gen)
    expected = _product(x, w, 1)
    counts = random.Random(1)
    for i in range(300):
        if i % 100 == 99:
            time.sleep(0.01)  # long enough for the workers to fall asleep
        torch.testing.assert_close(_product(x, w, counts.randint(1, 4)), expected, rtol=0, atol=0)


def test_concurrent_callers_each_get_their_own_product():
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(2000, 64, generator=gen)
    inputs = [torch.randn(2, 64, generator=gen) for _ in range(3)]
    expected = [_product(x, w, 1) for x in inputs]
    failures: list[int] = []

    def call(k: int) -> None:
        for _ in range(100):
            if not torch.equal(_product(inputs[k], w, 2), expected[k]):
                failures.append(k)

    workers = [threading.Thread(target=call, args=(k,)) for k in range(3)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in workers), "a caller hung"
    assert failures == []


SHARED_TEAM_PROBE = """
import os, torch
from prelude.model.skinny_linear import skinny_matmul
torch.set_num_threads(2)
torch.randn(512, 512) @ torch.randn(512, 512)  # torch starts its OpenMP worker
before = set(os.listdir("/proc/self/task"))
w, x, out = torch.randn(4096, 64), torch.randn(2, 64), torch.empty(2, 4096)
skinny_matmul(x.data_ptr(), 2, w.data_ptr(), 64, out.data_ptr(), 4096, 2)
started = set(os.listdir("/proc/self/task")) - before
runtimes = {line.split()[-1] for line in open("/proc/self/maps") if "libgomp" in line}
print(len(started), len(runtimes))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_kernels_run_on_torchs_openmp_threads():
    """One OpenMP runtime and one set of workers for torch's ops and the kernels: two pools on two
    cores left a step's threads waiting for each other's idle workers."""
    result = subprocess.run([sys.executable, "-c", SHARED_TEAM_PROBE], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "1"]  # no thread started by the kernel; one libgomp
