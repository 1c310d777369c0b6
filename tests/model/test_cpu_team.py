"""The native kernels' thread team (kernels/cpu/team.hpp) gives the single-thread result for any
sequence of thread counts, growing, shrinking and idling between calls, and from several Python
threads at once (a caller that finds the team busy runs its pieces itself)."""
from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from prelude.model import cpu_linear

pytestmark = pytest.mark.skipif(not cpu_linear.built, reason="kernels.cpu is not built")


def _product(x: torch.Tensor, w: torch.Tensor, threads: int) -> torch.Tensor:
    assert cpu_linear._native is not None
    out = torch.empty(x.shape[0], w.shape[0])
    cpu_linear._native.matmul(x.data_ptr(), x.shape[0], w.data_ptr(), 0, 0, cpu_linear.BY_ROWS, w.shape[1],
                              out.data_ptr(), w.shape[0], threads)
    return out


def test_any_sequence_of_thread_counts_gives_the_same_product():
    gen = torch.Generator().manual_seed(0)
    # 2048 x 64: just past the size the kernels hand to the team (kernels/cpu/team.hpp).
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
