"""The CUDA runner's graph paths at the edges of their buckets, on the CPU with flashinfer's API
stand-in and eagerly replayed graphs (as test_cuda_executor's logic test): a step that fills its
prefill bucket exactly (no padding row), one with as many rows as a prefill graph takes, one
with more (pieces instead), and a prefix hit whose pieces' bucket it fills exactly. Each step's
results equal the CPU reference's, and each takes the path named."""
from __future__ import annotations

import pytest
import torch

from prelude.contract.batch import OneShotBatch, PrefillRow
from prelude.executor.executors import Executors
from prelude.model.config import ModelConfig
from tests.checkpoints import make_checkpoint
from tests.conftest import TRITON_ON_CPU
from tests.executor.test_cuda_executor import SPEC, _compare, _flashinfer_stand_in_with_eager_graphs, _reference, \
    _runner_on_api_stand_in

pytestmark = pytest.mark.skipif(not TRITON_ON_CPU, reason="prefill graphs need the fused RoPE kernel, which on CPU "
                                "tensors runs in triton's interpreter (no triton here, or a GPU machine, where the "
                                "CUDA tests cover it)")


def test_bucket_edges_replay_the_reference_results(monkeypatch, tmp_path):
    from prelude.executor import cuda_graphs, piecewise_graphs

    _flashinfer_stand_in_with_eager_graphs(monkeypatch)
    paths: list[tuple[str, int]] = []
    run_graph, run_pieces = cuda_graphs.GraphRunner.run, piecewise_graphs.PiecewiseGraphs.run
    monkeypatch.setattr(cuda_graphs.GraphRunner, "run",
                        lambda self, kind, bucket, *a: paths.append((kind, bucket))
                        or run_graph(self, kind, bucket, *a))
    monkeypatch.setattr(piecewise_graphs.PiecewiseGraphs, "run",
                        lambda self, bucket, *a: paths.append(("pieces", bucket)) or run_pieces(self, bucket, *a))
    path = make_checkpoint(tmp_path / "q3", "qwen3")
    config = ModelConfig.from_dir(path)
    gen = torch.Generator().manual_seed(3)

    def row(seq: int, n: int, start: int = 0, table: list[int] | None = None) -> PrefillRow:
        return PrefillRow(seq, torch.randint(0, config.vocab_size, (n,), generator=gen).tolist(), start,
                          table or [], SPEC)

    steps = [
        OneShotBatch([row(i, 4) for i in range(8)]),  # 32 tokens in 8 rows: bucket 32 exactly, 8 rows
        OneShotBatch([row(10 + i, 5) for i in range(8)]),  # 40 tokens in 8 rows: 24 padding tokens
        OneShotBatch([row(20, 64)]),  # one row filling bucket 64
        OneShotBatch([row(30 + i, 3) for i in range(9)]),  # more rows than a prefill graph takes
        OneShotBatch([row(40, 32, 0, [0, 1])]),  # a prompt whose two blocks are stored...
        OneShotBatch([row(41, 32, 32, [0, 1])]),  # ...then 32 tokens over them: pieces, bucket 32
    ]
    reference = Executors.over(_reference(path))  # one cache for all steps, as the runner's
    want = [reference.execute(batch).rows for batch in steps]
    executors = Executors.over(_runner_on_api_stand_in(path, fuse_rope=True))
    got = [executors.execute(batch).rows for batch in steps]
    assert _compare(got, want, atol=1e-4, margin=0.0) == sum(len(batch.rows) for batch in steps)
    assert paths == [("prefill", 32), ("prefill", 64), ("prefill", 64), ("pieces", 32), ("prefill", 32),
                     ("pieces", 32)]
