"""A long input run in preemptible segments (each layer's attention, then its MLP a chunk of
tokens at a time) gives exactly the uninterrupted forward, however often it is stopped."""
from __future__ import annotations

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


def test_stopping_at_every_segment_changes_nothing(tmp_path):
    path = make_checkpoint(tmp_path / "q3", "qwen3")
    config = ModelConfig.from_dir(path)
    tokens = 2 * MLP_CHUNK_TOKENS + 5  # three MLP chunks per layer
    model = load_model(path, config, torch.float32, torch.device("cpu"), max_positions=tokens,
                       ops=select_ops(torch.device("cpu")))
    cache = KVCache(KVCacheShape.for_model(config, num_blocks=4, block_size=4, dtype=torch.float32),
                    torch.device("cpu"))
    attention = TorchAttention(cache)
    ids = torch.randint(0, config.vocab_size, (tokens,), generator=torch.Generator().manual_seed(0))
    step = host_step([PrefillRow(0, ids.tolist(), 0, [], None)], (), 4)  # no KV kept: a OneShot row
    layout = step.layout(torch.tensor(step.slots))
    positions = torch.tensor(step.positions)
    with torch.inference_mode():
        attention.plan(layout)
        whole = model(ids, positions, attention)
        state = model.begin(ids, positions)
        resumes = 1
        while not model.run_layers(state, attention, should_stop=lambda: True):
            resumes += 1
        segmented = model.finish(state)
    assert resumes == config.num_layers * (1 + 3)
    assert torch.equal(segmented, whole)
