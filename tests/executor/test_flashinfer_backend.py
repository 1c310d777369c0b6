"""The flashinfer backend, run on CPU against a stand-in of flashinfer's API (fake_flashinfer),
gives the torch reference's logits over a sequence of steps covering every row kind: fresh
prompts, partially stored prompts, chunk continuations, prefix hits whose new tokens are not
stored, decode rows, and a decode step padded to a CUDA-graph bucket. With Triton installed the
fused norm+RoPE+KV-write path runs too (through the interpreter)."""
from __future__ import annotations

import pytest
import torch

from prelude.executor.attention.base import StepLayout
from prelude.executor.attention.torch_ref import TorchAttention
from prelude.executor.kv_cache import KVCache, KVCacheShape
from prelude.model.config import ModelConfig
from prelude.model.loader import load_model
from tests.checkpoints import make_checkpoint
from tests.conftest import TRITON_ON_CPU
from tests.executor import fake_flashinfer

BS = 4
NUM_BLOCKS = 32
DUMMY = NUM_BLOCKS - 1


def _step(rows, num_prefill, slot_buffer=None):
    """rows: (token ids, context_len, block_table) -> (ids, positions, layout)."""
    ids, positions, slots, starts, stored = [], [], [], [0], []
    for tokens, ctx, table in rows:
        ids += tokens
        positions += range(ctx, ctx + len(tokens))
        row = [table[p // BS] * BS + p % BS if p // BS < len(table) else -1 for p in range(ctx, ctx + len(tokens))]
        slots += row
        stored.append(-1 not in row)
        starts.append(starts[-1] + len(tokens))
    slot_mapping = torch.tensor(slots)
    if slot_buffer is not None:
        slot_buffer[: len(slots)] = slot_mapping
        slot_mapping = slot_buffer
    layout = StepLayout(starts, [c for _, c, _ in rows], [t for _, _, t in rows], stored, num_prefill,
                        slot_mapping, host_slots=slots)
    return torch.tensor(ids), torch.tensor(positions), layout


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = make_checkpoint(tmp_path_factory.mktemp("fi") / "q3", "qwen3")
    config = ModelConfig.from_dir(path)
    return load_model(path, config, torch.float32, torch.device("cpu"), max_positions=256)


def _cache(model) -> KVCache:
    shape = KVCacheShape.for_model(model.config, NUM_BLOCKS, BS, torch.float32)
    return KVCache(shape, torch.device("cpu"))


@pytest.mark.parametrize("fuse_rope", [False, pytest.param(True, marks=pytest.mark.skipif(
    not TRITON_ON_CPU, reason="the fused RoPE kernel on CPU tensors needs triton's interpreter "
    "(no triton here, or a GPU machine, where the CUDA tests cover it)"))])
def test_flashinfer_backend_matches_torch_reference(monkeypatch, model, fuse_rope):
    fake_flashinfer.install(monkeypatch)
    from prelude.executor.attention.flashinfer_backend import FlashInferAttention

    reference = TorchAttention(_cache(model))
    backend = FlashInferAttention(_cache(model), model.config.num_heads, max_pages_per_row=16,
                                  dummy_page=DUMMY, fuse_rope=fuse_rope, workspace_bytes=16)
    gen = torch.Generator().manual_seed(0)
    tok = lambda n: torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist()
    a, b, c = tok(11), tok(6), tok(6)
    ta, tb, tc = [3, 7, 12, 14], [20, 5], [9]
    steps = [
        # Fresh prompts: a's first 7 tokens, all of b; c stores only its first block.
        ([(a[:7], 0, ta), (b[:5], 0, tb), (c, 0, tc)], 3),
        # a continues over its cached 7; a prefix hit on b's first block computes 6 tokens it
        # does not store; b decodes.
        ([(a[7:11], 7, ta), (tok(6), 4, tb[:1]), (b[5:6], 5, tb)], 2),
        # Pure decode.
        ([(tok(1), 11, ta), (tok(1), 6, tb)], 0),
    ]
    with torch.inference_mode():
        for rows, num_prefill in steps:
            ids, positions, layout = _step(rows, num_prefill)
            reference.plan(layout)
            expected = model.compute_logits(model(ids, positions, reference))
            backend.plan(layout)
            got = model.compute_logits(model(ids, positions, backend))
            torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
        assert backend.prefix.plan_calls == 1 and backend.decode.plan_calls == 2

        # A decode step padded to a bucket of 4: static buffers, padding rows on the dummy page.
        rows = [(tok(1), 12, ta), (tok(1), 7, tb)]
        ids, positions, layout = _step(rows, 0)
        reference.plan(layout)
        expected = model.compute_logits(model(ids, positions, reference))
        static_slots = torch.full((4,), DUMMY * BS, dtype=torch.long)
        static_ids, static_pos = torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long)
        _, _, graph_layout = _step(rows, 0, slot_buffer=static_slots)
        static_ids[:2], static_pos[:2] = ids, positions
        backend.plan_graph_decode(graph_layout, bucket=4)
        got = model.compute_logits(model(static_ids, static_pos, backend))[:2]
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
        assert set(backend.graph_decoders) == {4}
