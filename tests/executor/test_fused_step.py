"""A step run as one native call (prelude/executor/fused_step.py) equals the same step run layer by
layer: the same hidden states and K/V written to the cache, within fp32 rounding (prompt rows
multiply on other GEMM kernels). For q/k norms (Qwen3),
q/k/v bias (Qwen2) and plain Llama, GQA, on one thread and on the thread team: fresh prompts,
prompt chunks over a cached context in scattered blocks, prompt rows beside decode rows (a Mixed
step), rows whose K/V is not stored, only some tokens' states kept, and decode steps over
ragged contexts, multi-item rows. Models on other ops have no native step: they run layer by layer."""
from __future__ import annotations

import pytest
import torch

from kernels.cpu import ops as cpu_ops
from prelude.contract.batch import DecodeRow, OutputSpec, PrefillRow
from prelude.contract.sampling import GREEDY
from prelude.contract.stop import StopFlag
from prelude.executor.attention.torch_ref import TorchAttention
from prelude.executor.fused_step import native_step
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
    keep = None if step.read is None else torch.tensor(step.read)
    return step.ids, step.positions, step.layout(step.slots), keep


def _model_and_attention(path, weight_format: str = "float32"):
    """The config, the model, its native step (asserted present) and an attention backend."""
    config = ModelConfig.from_dir(path)
    ops = select_ops(torch.device("cpu"))
    model = load_model(path, config, torch.float32, torch.device("cpu"), max_positions=256, ops=ops,
                       weight_format=weight_format)
    native = native_step(model, ops)
    assert native is not None
    cache = KVCache(KVCacheShape.for_model(config, num_blocks=64, block_size=BLOCK, dtype=torch.float32),
                    torch.device("cpu"))
    return config, model, native, TorchAttention(cache)


def _check_step(model, native, attention, step):
    """Runs the planned step natively, then layer by layer from the same cache: equal results."""
    ids, positions, layout, keep = step
    attention.plan(layout)
    cache = attention.kv_cache
    before_k, before_v = cache.k.clone(), cache.v.clone()
    fused = native.try_forward(ids, positions, attention, keep)
    assert fused is not None
    fused_k, fused_v = cache.k.clone(), cache.v.clone()
    cache.k.copy_(before_k)
    cache.v.copy_(before_v)
    expected = model(ids, positions, attention, keep)
    torch.testing.assert_close(fused, expected, atol=3e-5, rtol=3e-5)
    torch.testing.assert_close(fused_k, cache.k, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(fused_v, cache.v, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "llama"])
@pytest.mark.parametrize("threads", [1, 2])
def test_fused_step_equals_layer_by_layer(tmp_path, family, threads):
    # Hidden 256: the MLP's weights are large enough for the kernels to split them on the team.
    path = make_checkpoint(tmp_path / family, family, hidden_size=256, intermediate_size=512)
    config, model, native, attention = _model_and_attention(path)
    # Small models decode on one thread by default; the team's split is checked too.
    native.single_threaded_decode = threads == 1
    gen = torch.Generator().manual_seed(7)
    lengths = [9, 1, 30, 5]
    free = list(range(63, -1, -1))
    tables = [[free.pop(3 * i % len(free)) for i in range(12)] for _ in lengths]
    prompts = [torch.randint(0, config.vocab_size, (n + 6,), generator=gen).tolist() for n in lengths]
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            # Fresh prompts, the last token's state read (each step also fills the cache).
            _check_step(model, native, attention, _step([PrefillRow(i, p[:n], 0, t, SPEC)
                                                 for i, (p, n, t) in enumerate(zip(prompts, lengths, tables))]))
            for step in range(3):
                tokens = torch.randint(0, config.vocab_size, (len(lengths),), generator=gen).tolist()
                rows = zip(tokens, lengths, tables)
                _check_step(model, native, attention, _step(decodes=[DecodeRow(i, tok, n + step, t, SPEC)
                                                             for i, (tok, n, t) in enumerate(rows)]))
            # A Mixed step: a prompt chunk over 12 cached tokens (no state read: not the last
            # chunk), a row over a 4-token cached prefix whose K/V is not stored (its table ends
            # there), every token's state read, and two decode rows.
            logprobs = OutputSpec(prompt_logprobs=0)
            chunks = [PrefillRow(0, prompts[0][12:15], 12, tables[0], None),
                      PrefillRow(2, prompts[2][4:9], 4, tables[2][:1], logprobs)]
            decodes = [DecodeRow(i, 5 + i, lengths[i] + 3, tables[i], SPEC) for i in (1, 3)]
            _check_step(model, native, attention, _step(chunks, decodes))
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("weight_format", ["bfloat16", "int8"])
def test_narrow_weights_run_the_same_natively_as_layer_by_layer(tmp_path, weight_format):
    # Both paths multiply by the same stored weights (model.cpu_linear), so they agree as closely
    # as in fp32; how close the formats come to fp32 is tests/model/test_weight_formats.py's.
    path = make_checkpoint(tmp_path / "q3", "qwen3", hidden_size=256, intermediate_size=512, tie=True)
    config, model, native, attention = _model_and_attention(path, weight_format)
    tables = [list(range(0, 6)), list(range(6, 12))]
    with torch.inference_mode():
        _check_step(model, native, attention, _step([PrefillRow(0, list(range(3, 20)), 0, tables[0], SPEC),
                                                     PrefillRow(1, list(range(40, 45)), 0, tables[1], SPEC)]))
        _check_step(model, native, attention, _step(decodes=[DecodeRow(0, 7, 17, tables[0], SPEC),
                                                             DecodeRow(1, 9, 5, tables[1], SPEC)]))


@pytest.mark.parametrize("threads", [1, 2])
def test_multi_item_rows_run_natively(tmp_path, threads):
    """Each item sees the part before the items and its own tokens (kernels/cpu/prefill_attention.hpp's
    key gap): a fresh row, and one over a cached prefix whose remaining query part is empty."""
    path = make_checkpoint(tmp_path / "q3", "qwen3", hidden_size=256, intermediate_size=512)
    config, model, native, attention = _model_and_attention(path)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            first = _step([PrefillRow(0, list(range(5, 17)), 0, list(range(3)), None)])
            attention.plan(first[2])
            native.try_forward(*first[:2], attention, first[3])
            rows = [PrefillRow(0, list(range(5, 17)) + list(range(30, 37)), 0, list(range(3, 6)), SPEC,
                               item_lengths=(3, 4)),
                    PrefillRow(1, list(range(40, 49)), 12, list(range(3)), SPEC, item_lengths=(2, 5, 2))]
            _check_step(model, native, attention, _step(rows))
    finally:
        torch.set_num_threads(previous)


def test_torch_ops_run_layer_by_layer(tmp_path):
    path = make_checkpoint(tmp_path / "q3", "qwen3")
    config = ModelConfig.from_dir(path)
    model = load_model(path, config, torch.float32, torch.device("cpu"), max_positions=64, ops=TORCH_OPS)
    assert native_step(model, TORCH_OPS) is None


@pytest.mark.parametrize("threads", [1, 2])
def test_a_resumable_step_stopped_at_every_chance_equals_one_call(tmp_path, threads):
    """The native step run in calls that each stop at the first chance (pieces of a few tokens
    and attention items: a flag raised throughout) gives the one call's hidden states and K/V."""
    path = make_checkpoint(tmp_path / "q3", "qwen3", hidden_size=256, intermediate_size=512)
    config, model, native, attention = _model_and_attention(path)
    gen = torch.Generator().manual_seed(3)
    # A prompt over a cached context (filled by a first step), and a fresh one; the last tokens kept.
    prompts = [torch.randint(0, config.vocab_size, (n,), generator=gen).tolist() for n in (150, 90)]
    tables = [list(range(0, 40)), list(range(40, 64))]
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            first = _step([PrefillRow(0, prompts[0][:40], 0, tables[0], None)])
            attention.plan(first[2])
            native.try_forward(*first[:2], attention, first[3])
            ids, positions, layout, keep = _step([PrefillRow(0, prompts[0][40:], 40, tables[0], SPEC),
                                                  PrefillRow(1, prompts[1], 0, tables[1], SPEC)])
            cache = attention.kv_cache
            before_k, before_v = cache.k.clone(), cache.v.clone()
            attention.plan(layout)
            whole = native.try_forward(ids, positions, attention, keep).clone()
            whole_k, whole_v = cache.k.clone(), cache.v.clone()
            cache.k.copy_(before_k)
            cache.v.copy_(before_v)
            stop = StopFlag(check_every_macs=1)
            stop.set()
            forward = native.begin(ids, positions, attention, keep, stop.check_every_macs)
            assert forward is not None
            calls, hidden = 1, forward.advance(attention, stop)
            while hidden is None:
                calls, hidden = calls + 1, forward.advance(attention, stop)
    finally:
        torch.set_num_threads(previous)
    # Per layer: at least two token chunks in each projection, items of two rows, and the MLP.
    assert calls > 4 * config.num_layers
    # Within fp32 rounding: short chunks multiply on the skinny GEMM, long ones on the packed.
    torch.testing.assert_close(hidden, whole, atol=3e-5, rtol=3e-5)
    torch.testing.assert_close(cache.k, whole_k, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(cache.v, whole_v, atol=2e-5, rtol=2e-5)


def test_a_resumable_step_with_its_flag_down_runs_in_one_call(tmp_path):
    path = make_checkpoint(tmp_path / "q3", "qwen3", hidden_size=256, intermediate_size=512)
    config, model, native, attention = _model_and_attention(path)
    ids, positions, layout, keep = _step([PrefillRow(0, list(range(3, 200)), 0, list(range(50)), SPEC)])
    with torch.inference_mode():
        attention.plan(layout)
        whole = native.try_forward(ids, positions, attention, keep).clone()
        stop = StopFlag(check_every_macs=1)
        forward = native.begin(ids, positions, attention, keep, stop.check_every_macs)
        assert forward is not None
        hidden = forward.advance(attention, stop)
    assert hidden is not None
    torch.testing.assert_close(hidden, whole, atol=3e-5, rtol=3e-5)
