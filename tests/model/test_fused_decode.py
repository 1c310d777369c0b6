"""A decode step run as one native call (prelude/model/fused_decode.py) equals the same step run
layer by layer: the same hidden states and the same K/V written to the cache, for q/k norms
(Qwen3), q/k/v bias (Qwen2) and plain Llama, GQA, ragged contexts over scattered blocks, on one
thread and on the thread team. Steps it does not take (prompts, other ops) run layer by layer."""
from __future__ import annotations

import pytest
import torch

from kernels.cpu import ops as cpu_ops
from prelude.contract.batch import DecodeRow, OutputSpec, PrefillRow
from prelude.contract.sampling import GREEDY
from prelude.executor.attention.torch_ref import TorchAttention
from prelude.executor.host_step import host_step
from prelude.executor.kv_cache import KVCache, KVCacheShape
from prelude.model.config import ModelConfig
from prelude.model.loader import load_model
from prelude.model.ops import TORCH_OPS, select_ops
from tests.checkpoints import make_checkpoint

pytestmark = pytest.mark.skipif(not cpu_ops.built, reason="kernels.cpu is not built")

BLOCK = 4
SPEC = OutputSpec(sample=GREEDY)


def _step(prefills=(), decodes=()):
    step = host_step(prefills, decodes, BLOCK)
    return torch.tensor(step.ids), torch.tensor(step.positions), step.layout(torch.tensor(step.slots))


def _model_and_attention(path):
    config = ModelConfig.from_dir(path)
    model = load_model(path, config, torch.float32, torch.device("cpu"), max_positions=256,
                       ops=select_ops(torch.device("cpu")))
    cache = KVCache(KVCacheShape.for_model(config, num_blocks=48, block_size=BLOCK, dtype=torch.float32),
                    torch.device("cpu"))
    return config, model, TorchAttention(cache)


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "llama"])
@pytest.mark.parametrize("threads", [1, 2])
def test_fused_decode_equals_layer_by_layer(tmp_path, family, threads):
    # Hidden 256: the MLP's weights are large enough for the kernels to split them on the team.
    path = make_checkpoint(tmp_path / family, family, hidden_size=256, intermediate_size=512)
    config, model, attention = _model_and_attention(path)
    assert model.fused_decode is not None
    # Small models decode on one thread by default; the team's split is checked too.
    model.fused_decode.single_threaded = threads == 1
    gen = torch.Generator().manual_seed(7)
    lengths = [9, 1, 30, 5]
    free = list(range(47, -1, -1))
    tables = [[free.pop(3 * i % len(free)) for i in range(10)] for _ in lengths]
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            prompts = [torch.randint(0, config.vocab_size, (n,), generator=gen).tolist() for n in lengths]
            ids, positions, layout = _step([PrefillRow(i, p, 0, t, SPEC) for i, (p, t) in enumerate(zip(prompts, tables))])
            attention.plan(layout)
            assert model.fused_decode.try_forward(ids, positions, attention) is None  # prompts: layer by layer
            model(ids, positions, attention)
            for step in range(4):
                tokens = torch.randint(0, config.vocab_size, (len(lengths),), generator=gen).tolist()
                ids, positions, layout = _step(decodes=[DecodeRow(i, tok, n + step, t, SPEC)
                                                        for i, (tok, n, t) in enumerate(zip(tokens, lengths, tables))])
                attention.plan(layout)
                cache = attention.kv_cache
                before_k, before_v = cache.k.clone(), cache.v.clone()
                fused = model.fused_decode.try_forward(ids, positions, attention)
                assert fused is not None
                fused_k, fused_v = cache.k.clone(), cache.v.clone()
                cache.k.copy_(before_k)
                cache.v.copy_(before_v)
                fused_decode, model.fused_decode = model.fused_decode, None
                try:
                    expected = model(ids, positions, attention)
                finally:
                    model.fused_decode = fused_decode
                torch.testing.assert_close(fused, expected, atol=2e-5, rtol=2e-5)
                torch.testing.assert_close(fused_k, cache.k, atol=2e-5, rtol=2e-5)
                torch.testing.assert_close(fused_v, cache.v, atol=0, rtol=0)
    finally:
        torch.set_num_threads(previous)


def test_torch_ops_run_layer_by_layer(tmp_path):
    path = make_checkpoint(tmp_path / "q3", "qwen3")
    model = load_model(path, ModelConfig.from_dir(path), torch.float32, torch.device("cpu"), max_positions=64,
                       ops=TORCH_OPS)
    assert model.fused_decode is None
