"""The CPU KV cache costs nothing until used and never stalls a step on a huge-page fault: its
memory comes in small pages, zeroed by the OS on first touch (issue #20's periodic P99 spikes
were 2 MB pages zeroed inside a step)."""
from __future__ import annotations

import sys

import pytest
import torch

from prelude.executor.kv_cache import KVCache, KVCacheShape


def mapping_fields(first: int, last: int) -> dict[str, int]:
    """/proc/self/smaps fields (kB) summed over the mappings overlapping [first, last): an
    madvise over part of an allocation splits it into several."""
    fields: dict[str, int] = {}
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(x, 16) for x in head.split("-"))
                inside = start < last and first < end
            elif inside and line.split()[-1] == "kB":
                name = head.rstrip(":")
                fields[name] = fields.get(name, 0) + int(line.split()[1])
    return fields


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_pool_is_zero_lazy_and_in_small_pages():
    shape = KVCacheShape(num_layers=2, num_blocks=4096, block_size=16, num_kv_heads=2, head_dim=64,
                         dtype=torch.float32)
    cache = KVCache(shape, torch.device("cpu"))
    k, v = cache.layer(1)
    assert float(k[100].abs().sum()) == 0.0 and float(v[4095].abs().sum()) == 0.0
    k[: 2048].fill_(1.0)  # 16 MB written: room for eight 2 MB pages
    fields = mapping_fields(cache.k.data_ptr(), cache.k.data_ptr() + cache.k.numel() * 4)
    assert fields["AnonHugePages"] == 0
    total_kb = 2 * 4096 * 16 * 2 * 64 * 4 // 1024
    assert fields["Rss"] < total_kb // 2, "untouched blocks must not be resident"
