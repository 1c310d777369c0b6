"""A long input run in preemptible segments (each layer's projection a chunk of tokens at a time,
its attention a chunk of queries of one KV head at a time, then its output projection and MLP a
chunk of tokens at a time) gives the uninterrupted forward within float32 rounding and stores the
same K/V, however often it is stopped: fresh rows, rows that keep their K/V, rows over a cached
prefix, and steps whose heads read only some tokens (the last layer runs its MLP for those alone)."""
from __future__ import annotations

import pytest
import torch

from prelude.contract.batch import PrefillRow
from prelude.executor.attention.torch_ref import TorchAttention
from prelude.executor.host_step import host_step
from prelude.executor.kv_cache import KVCache, KVCacheShape
from prelude.model.config import ModelConfig
from prelude.model.layers import MLP_CHUNK_TOKENS
from prelude.model import segments
from prelude.model.segments import SEGMENT_TOKENS
from prelude.model.loader import load_model
from prelude.model.ops import select_ops
from tests.checkpoints import make_checkpoint

TOKENS = max(2 * SEGMENT_TOKENS, MLP_CHUNK_TOKENS) + 5  # long enough to segment
PREFIX = 37
BLOCK = 16


@pytest.mark.parametrize("case", ["fresh", "stores_kv", "cached_prefix", "multi_item", "reads_two_tokens"])
@pytest.mark.parametrize("wide", [False, True])
def test_stopping_at_every_segment_changes_nothing(tmp_path, monkeypatch, case, wide):
    path = make_checkpoint(tmp_path / "q3", "qwen3")
    config = ModelConfig.from_dir(path)
    if wide:  # segments sized as for a model whose MLP is more work per token: 300 tokens
        monkeypatch.setattr(segments, "SEGMENT_MLP_MACS", 3 * config.hidden_size * config.intermediate_size * 300)
    segment = segments.segment_tokens(config.hidden_size, config.intermediate_size)
    assert segment == (300 if wide else SEGMENT_TOKENS)
    token_chunks = -(-TOKENS // segment)
    model = load_model(path, config, torch.float32, torch.device("cpu"), max_positions=PREFIX + TOKENS,
                       ops=select_ops(torch.device("cpu")))
    blocks = -(-(PREFIX + TOKENS) // BLOCK)
    ids = torch.randint(0, config.vocab_size, (PREFIX + TOKENS,), generator=torch.Generator().manual_seed(0))
    table = list(range(blocks)) if case not in ("fresh", "reads_two_tokens") else []  # no table: a OneShot row that keeps no KV
    start = PREFIX if case == "cached_prefix" else 0
    items = (20, 30) if case == "multi_item" else ()  # the last 50 tokens: two items after the query
    step = host_step([PrefillRow(0, ids[start:start + TOKENS].tolist(), start, table, None, item_lengths=items)],
                     (), BLOCK)
    positions = torch.tensor(step.positions)

    def attention_with_prefix() -> TorchAttention:
        shape = KVCacheShape.for_model(config, num_blocks=blocks, block_size=BLOCK, dtype=torch.float32)
        attention = TorchAttention(KVCache(shape, torch.device("cpu")))
        if start:
            first = host_step([PrefillRow(0, ids[:start].tolist(), 0, table, None)], (), BLOCK)
            attention.plan(first.layout(torch.tensor(first.slots)))
            model(ids[:start], torch.tensor(first.positions), attention)
        attention.plan(step.layout(torch.tensor(step.slots)))
        return attention

    with torch.inference_mode():
        whole_attention = attention_with_prefix()
        whole = model(ids[start:start + TOKENS], positions, whole_attention)
        attention = attention_with_prefix()
        keep = torch.tensor([3, TOKENS - 1]) if case == "reads_two_tokens" else None
        state = model.begin(ids[start:start + TOKENS], positions, keep)
        resumes = 1
        while not model.run_layers(state, attention, should_stop=lambda: True):
            resumes += 1
        segmented = model.finish(state)
    # per layer: the projection's token chunks, the query chunks of each KV head (one for a
    # multi-item row, which attends under its mask whole), the output projection's token chunks,
    # the MLP's token chunks
    chunks = 1 if items else len(segments.query_chunks(start, TOKENS, config.head_dim))
    skipped = 2 * (token_chunks - 1) if keep is not None else 0  # the last layer's output and MLP: two tokens, one chunk
    assert resumes == config.num_layers * (3 * token_chunks + chunks * config.num_kv_heads) - skipped
    torch.testing.assert_close(segmented, whole if keep is None else whole[keep], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(attention.kv_cache.k, whole_attention.kv_cache.k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(attention.kv_cache.v, whole_attention.kv_cache.v, rtol=1e-5, atol=1e-5)
