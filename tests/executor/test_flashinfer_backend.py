"""The flashinfer backend, run on CPU against a stand-in of flashinfer's API (fake_flashinfer),
gives the torch reference's logits over a sequence of steps covering every row kind: fresh
prompts, partially stored prompts, chunk continuations, prefix hits whose new tokens are not
stored, decode rows, and a decode step padded to a CUDA-graph bucket. With Triton installed the
fused norm+RoPE+KV-write path runs too (through the interpreter)."""
from __future__ import annotations

import pytest
import torch

from prelude.contract.batch import DecodeRow, OutputSpec, PrefillRow
from prelude.contract.sampling import GREEDY
from prelude.executor.attention.torch_ref import TorchAttention
from prelude.executor.kv_cache import KVCache, KVCacheShape
from prelude.executor.host_step import host_step
from prelude.model.config import ModelConfig
from prelude.model.loader import load_model
from tests.checkpoints import make_checkpoint
from tests.conftest import TRITON_ON_CPU
from tests.executor import fake_flashinfer

BS = 4
NUM_BLOCKS = 32
DUMMY = NUM_BLOCKS - 1
SPEC = OutputSpec(sample=GREEDY)


def _step(prefills=(), decodes=(), slot_buffer=None):
    """The executor's own flattening (host_step) -> (ids, positions, layout); with `slot_buffer`,
    the slots are written into it and the layout points at the whole buffer, as for a graph."""
    step = host_step(prefills, decodes, BS)
    slot_mapping = step.slots
    if slot_buffer is not None:
        slot_buffer[: len(step.slots)] = slot_mapping
        slot_mapping = slot_buffer
    return step.ids, step.positions, step.layout(slot_mapping)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = make_checkpoint(tmp_path_factory.mktemp("fi") / "q3", "qwen3")
    config = ModelConfig.from_dir(path)
    return load_model(path, config, torch.float32, torch.device("cpu"), max_positions=256)


def _cache(model) -> KVCache:
    shape = KVCacheShape.for_model(model.config, NUM_BLOCKS, BS, torch.float32)
    return KVCache(shape, torch.device("cpu"))


def _backends(monkeypatch, model, fuse_rope: bool):
    """(the torch reference, the flashinfer backend on the stand-in), each on its own cache."""
    fake_flashinfer.install(monkeypatch)
    from prelude.executor.attention.flashinfer_backend import FlashInferAttention

    backend = FlashInferAttention(_cache(model), model.config.num_heads, max_pages_per_row=16,
                                  dummy_page=DUMMY, fuse_rope=fuse_rope, workspace_bytes=16)
    return TorchAttention(_cache(model)), backend


def _assert_same_logits(model, reference, backend, steps) -> None:
    """Each step's logits at every position, through both backends."""
    with torch.inference_mode():
        for prefills, decodes in steps:
            ids, positions, layout = _step(prefills, decodes)
            reference.plan(layout)
            expected = model.compute_logits(model(ids, positions, reference))
            backend.plan(layout)
            got = model.compute_logits(model(ids, positions, backend))
            torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("fuse_rope", [False, pytest.param(True, marks=pytest.mark.skipif(
    not TRITON_ON_CPU, reason="the fused RoPE kernel on CPU tensors needs triton's interpreter "
    "(no triton here, or a GPU machine, where the CUDA tests cover it)"))])
def test_flashinfer_backend_matches_torch_reference(monkeypatch, model, fuse_rope):
    reference, backend = _backends(monkeypatch, model, fuse_rope)
    gen = torch.Generator().manual_seed(0)

    def tok(n: int) -> list[int]:
        return torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist()

    a, b, c = tok(11), tok(6), tok(6)
    ta, tb, tc = [3, 7, 12, 14], [20, 5], [9]
    steps = [
        # Fresh prompts: a's first 7 tokens, all of b; c stores only its first block.
        ([PrefillRow(1, a[:7], 0, ta, None), PrefillRow(2, b[:5], 0, tb, SPEC),
          PrefillRow(3, c, 0, tc, SPEC)], []),
        # a continues over its cached 7; a prefix hit on b's first block computes 6 tokens it
        # does not store; b decodes.
        ([PrefillRow(1, a[7:11], 7, ta, SPEC), PrefillRow(4, tok(6), 4, tb[:1], SPEC)],
         [DecodeRow(2, b[5], 5, tb, SPEC)]),
        # Pure decode.
        ([], [DecodeRow(1, tok(1)[0], 11, ta, SPEC), DecodeRow(2, tok(1)[0], 6, tb, SPEC)]),
    ]
    _assert_same_logits(model, reference, backend, steps)
    assert backend.prefix.plan_calls == 1 and backend.decode.plan_calls == 2

    with torch.inference_mode():
        # A decode step padded to a bucket of 4: static buffers, padding rows on the dummy page.
        rows = [DecodeRow(1, tok(1)[0], 12, ta, SPEC), DecodeRow(2, tok(1)[0], 7, tb, SPEC)]
        ids, positions, layout = _step(decodes=rows)
        reference.plan(layout)
        expected = model.compute_logits(model(ids, positions, reference))
        static_slots = torch.full((4,), DUMMY * BS, dtype=torch.long)
        static_ids, static_pos = torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long)
        _, _, graph_layout = _step(decodes=rows, slot_buffer=static_slots)
        static_ids[:2], static_pos[:2] = ids, positions
        backend.plan_graph("decode", graph_layout, bucket=4)
        got = model.compute_logits(model(static_ids, static_pos, backend))[:2]
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
        assert set(backend.graph_decoders) == {4}


def test_multi_item_rows_attend_under_their_mask_like_the_torch_reference(monkeypatch, model):
    """Multi-item rows (a shared part, then items that each see it and themselves only) beside
    ordinary rows, fresh and over a cached prefix, then an ordinary step again: every position's
    logits equal the torch reference's."""
    reference, backend = _backends(monkeypatch, model, fuse_rope=False)
    gen = torch.Generator().manual_seed(1)

    def tok(n: int) -> list[int]:
        return torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist()

    labels = OutputSpec(label_token_ids=(3, 5))
    shared = tok(8)
    steps = [
        # An ordinary prompt beside a fresh multi-item row (5 shared tokens, items of 3, 1, 4).
        ([PrefillRow(1, shared, 0, [2, 3, 4], SPEC),
          PrefillRow(2, tok(5 + 8), 0, [], labels, item_lengths=(3, 1, 4))], []),
        # Over the first's cached first block: 4 more shared tokens, then items of 2 and 5;
        # the first row decodes beside it.
        ([PrefillRow(3, shared[4:] + tok(7), 4, [2], labels, item_lengths=(2, 5))],
         [DecodeRow(1, tok(1)[0], 8, [2, 3, 4], SPEC)]),
        ([PrefillRow(4, tok(6), 0, [], SPEC)], []),
    ]
    _assert_same_logits(model, reference, backend, steps)
    assert backend.masked.plan_calls == 2 and backend.ragged.plan_calls == 1
