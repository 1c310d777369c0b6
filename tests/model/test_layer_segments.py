"""A long input run in preemptible segments (each layer's projection, its attention one KV head
at a time, then its MLP a chunk of tokens at a time) gives exactly the uninterrupted forward and
stores the same K/V, however often it is stopped."""
from __future__ import annotations

import pytest
import torch

from prelude.contract.batch import PrefillRow
from prelude.executor.attention.torch_ref import TorchAttention
from prelude.executor.host_step import host_step
from prelude.executor.kv_cache import KVCache, KVCacheShape
from prelude.model.config import ModelConfig
from prelude.model.layers import MLP_CHUNK_TOKENS
from prelude.model.loader import load_model
from prelude.model.ops import select_ops
from tests.checkpoints import make_checkpoint

TOKENS = 2 * MLP_CHUNK_TOKENS + 5  # three MLP chunks per layer
BLOCK = 16


@pytest.mark.parametrize("stores_kv", [False, True])
def test_stopping_at_every_segment_changes_nothing(tmp_path, stores_kv):
    path = make_checkpoint(tmp_path / "q3", "qwen3")
    config = ModelConfig.from_dir(path)
    model = load_model(path, config, torch.float32, torch.device("cpu"), max_positions=TOKENS,
                       ops=select_ops(torch.device("cpu")))
    blocks = -(-TOKENS // BLOCK)
    ids = torch.randint(0, config.vocab_size, (TOKENS,), generator=torch.Generator().manual_seed(0))
    table = list(range(blocks)) if stores_kv else []  # no table: a OneShot row that keeps no KV
    step = host_step([PrefillRow(0, ids.tolist(), 0, table, None)], (), BLOCK)
    positions = torch.tensor(step.positions)

    def fresh_attention() -> TorchAttention:
        shape = KVCacheShape.for_model(config, num_blocks=blocks, block_size=BLOCK, dtype=torch.float32)
        attention = TorchAttention(KVCache(shape, torch.device("cpu")))
        attention.plan(step.layout(torch.tensor(step.slots)))
        return attention

    with torch.inference_mode():
        whole_attention = fresh_attention()
        whole = model(ids, positions, whole_attention)
        attention = fresh_attention()
        state = model.begin(ids, positions)
        resumes = 1
        while not model.run_layers(state, attention, should_stop=lambda: True):
            resumes += 1
        segmented = model.finish(state)
    # per layer: the projection, one segment per KV head (the last with o_proj and the norm),
    # three MLP chunks
    assert resumes == config.num_layers * (1 + config.num_kv_heads + 3)
    assert torch.equal(segmented, whole)
    assert torch.equal(attention.kv_cache.k, whole_attention.kv_cache.k)
    assert torch.equal(attention.kv_cache.v, whole_attention.kv_cache.v)
