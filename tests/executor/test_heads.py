"""Heads grouped per step give each row what it would get alone: a mixed step (last-token and
mean pooling, compact-head label rows with two different label sets, vocabulary-normalized
label rows read at the last token and at item ends) run as one step equals each row run by
itself."""
from __future__ import annotations

import math
from concurrent.futures import Future

import torch

from prelude.contract.batch import DecodeRow, OutputSpec, PrefillRow
from prelude.contract.sampling import GREEDY, SamplingParams
from prelude.executor.attention.torch_ref import TorchAttention
from prelude.executor.fused_step import native_step
from prelude.executor.heads import row_results
from prelude.executor.host_step import host_step
from prelude.executor.kv_cache import KVCache, KVCacheShape
from prelude.executor.runner import ModelRunner
from prelude.executor.sampler import RowMasks, sample
from prelude.model.attention import StepLayout
from prelude.model.config import ModelConfig
from prelude.model.loader import load_model
from prelude.model.ops import select_ops
from prelude.structured.masks import StepMasks
from tests.checkpoints import make_checkpoint

SPECS = [
    OutputSpec(pooling="last"),
    OutputSpec(label_token_ids=(5, 9), label_vocab_normalized=False),
    OutputSpec(pooling="mean", normalize=False),
    OutputSpec(label_token_ids=(3, 4, 7), label_vocab_normalized=False),
    OutputSpec(label_token_ids=(5, 9), label_vocab_normalized=False),
    OutputSpec(label_token_ids=(5, 9), label_vocab_normalized=True),
    OutputSpec(label_token_ids=(5, 9), label_vocab_normalized=False),  # with items, below
    OutputSpec(label_token_ids=(5, 9), label_vocab_normalized=True),  # with items, below
    OutputSpec(pooling="last", normalize=False),
]
ITEMS = {6: (3, 2), 7: (4, 1, 2)}
LENGTHS = [9, 12, 7, 10, 8, 11, 13, 9, 6]


def _layout(lengths: list[int]) -> StepLayout:
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    return StepLayout(query_starts=starts, context_lens=[0] * len(lengths), block_tables=[() for _ in lengths],
                      store_kv=[False] * len(lengths), num_prefill_rows=len(lengths),
                      slot_mapping=torch.full((starts[-1],), -1))


def _last_hidden(hidden: torch.Tensor, layout: StepLayout, rows: list[int]) -> torch.Tensor:
    return hidden[torch.tensor([layout.query_starts[i + 1] - 1 for i in rows])]


def test_grouped_heads_equal_rows_alone(demo_model):
    config = ModelConfig.from_dir(demo_model)
    model = load_model(demo_model, config, torch.float32, torch.device("cpu"), 64)
    rows = [PrefillRow(i, [7] * n, 0, (), spec, item_lengths=ITEMS.get(i, ()))
            for i, (spec, n) in enumerate(zip(SPECS, LENGTHS))]
    hidden = torch.randn(sum(LENGTHS), config.hidden_size, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        together = row_results(model, hidden, rows, (), _layout(LENGTHS), _last_hidden)
        offsets = _layout(LENGTHS).query_starts
        alone = [row_results(model, hidden[offsets[i]:offsets[i + 1]], [row], (), _layout([LENGTHS[i]]),
                             _last_hidden)[0] for i, row in enumerate(rows)]

    def close(a, b) -> bool:
        if a is None or b is None:
            return a is b
        if isinstance(a, list) and a and isinstance(a[0], list):
            return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
        return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-5) for x, y in zip(a, b))

    for i, (x, y) in enumerate(zip(together, alone)):
        assert x.seq_id == y.seq_id == i
        for field in ("pooled", "label_logprobs", "item_label_logprobs"):
            assert close(getattr(x, field), getattr(y, field)), (i, field)
    assert together[6].item_label_logprobs is not None and len(together[6].item_label_logprobs) == 2
    assert together[7].item_label_logprobs is not None and len(together[7].item_label_logprobs) == 3
    assert together[3].label_logprobs is not None and len(together[3].label_logprobs) == 3


def test_step_skips_unread_tokens_without_changing_results(tmp_path):
    """The last layer runs after its attention only for the positions the heads read; a step
    mixing every kind of output (and a chunk with none) gives the results of a full forward."""
    path = make_checkpoint(tmp_path / "qwen3", "qwen3")
    config = ModelConfig.from_dir(path)
    model = load_model(path, config, torch.float32, torch.device("cpu"), 256, ops=select_ops(torch.device("cpu")))
    block = 4
    cache = KVCache(KVCacheShape.for_model(config, num_blocks=64, block_size=block, dtype=torch.float32),
                    torch.device("cpu"))
    runner = ModelRunner(model, TorchAttention(cache), torch.device("cpu"), block,
                         native_step(model, select_ops(torch.device("cpu"))))
    specs = [OutputSpec(sample=GREEDY), OutputSpec(pooling="last"), OutputSpec(pooling="mean"),
             OutputSpec(sample=GREEDY, prompt_logprobs=2), OutputSpec(label_token_ids=(5, 9)), None]
    lengths = [9, 6, 7, 5, 11, 8]
    gen = torch.Generator().manual_seed(1)
    prefills = [PrefillRow(i, torch.randint(0, config.vocab_size, (n,), generator=gen).tolist(), 0,
                           list(range(4 * i, 4 * i + 4)), spec, item_lengths=(4, 3) if i == 4 else ())
                for i, (spec, n) in enumerate(zip(specs, lengths))]
    decodes = [DecodeRow(9, 17, 5, list(range(40, 44)), OutputSpec(sample=GREEDY))]
    step = host_step(prefills, decodes, block)
    assert step.read is not None and len(step.read) < step.num_tokens
    with torch.inference_mode():
        pruned = runner.run(prefills, decodes).rows
        input_ids, positions, layout = runner.upload(step)
        runner.attention.plan(layout)
        full = row_results(model, model(input_ids, positions, runner.attention), prefills, decodes, layout,
                           runner.last_hidden)
    assert [r.seq_id for r in pruned] == [r.seq_id for r in full] == [0, 1, 2, 3, 4, 9]
    for a, b in zip(pruned, full):
        assert a.token == b.token
        for field in ("pooled", "label_logprobs", "item_label_logprobs"):
            x, y = getattr(a, field), getattr(b, field)
            assert (x is None) == (y is None), field
            if x is not None:
                assert torch.allclose(torch.tensor(x), torch.tensor(y), atol=1e-5), field
        assert (a.prompt_logprobs is None) == (b.prompt_logprobs is None)
        for p, q in zip(a.prompt_logprobs or [], b.prompt_logprobs or []):
            assert p.token_id == q.token_id and p.rank == q.rank and math.isclose(p.logprob, q.logprob, abs_tol=1e-5)


def _bitmask(allowed: list[int], vocab: int) -> torch.Tensor:
    words = torch.zeros((vocab + 31) // 32, dtype=torch.int64)
    for t in allowed:
        words[t // 32] |= 1 << (t % 32)
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)  # int32 words, bit 31 too


def test_rows_that_can_take_few_tokens_sample_and_report_as_over_the_whole_vocabulary(demo_model):
    """A row whose grammar allows a few tokens, or that is restricted to a few allowed_token_ids,
    gets logits for just those: the tokens it samples (greedy, seeded) and the logprobs it
    reports (a grammar's over the tokens it allows, as vLLM's; allowed_token_ids' over the whole
    vocabulary) are those of the whole head's row under its restriction. Rows whose grammar
    allows most tokens, or with none, are unchanged beside them."""
    config = ModelConfig.from_dir(demo_model)
    model = load_model(demo_model, config, torch.float32, torch.device("cpu"), 64)
    vocab = config.vocab_size
    few, many = [3, 31, 32, 95, vocab - 1], [t for t in range(vocab) if t % 7]  # many: past NARROW_HEAD_TOKENS
    params = [SamplingParams(max_tokens=1, temperature=0.0, logprobs=3),
              SamplingParams(max_tokens=1, temperature=0.8, seed=7),
              SamplingParams(max_tokens=1, temperature=0.0, logprobs=2),
              SamplingParams(max_tokens=1, temperature=0.0),
              SamplingParams(max_tokens=1, temperature=0.0, allowed_token_ids=(4, 40, 400)),
              SamplingParams(max_tokens=1, temperature=0.9, seed=3, allowed_token_ids=(4, 40, 400), logprobs=2)]
    masked = {0: few, 1: few, 2: many}  # the other rows have no grammar
    lengths = [5, 6, 7, 4, 8, 3]
    rows = [PrefillRow(i, [9] * n, 0, (), OutputSpec(sample=p)) for i, (p, n) in enumerate(zip(params, lengths))]
    bitmask = torch.stack([_bitmask(masked[i], vocab) for i in sorted(masked)])
    ready: Future = Future()
    ready.set_result(StepMasks(bitmask.numpy(), {i: k for k, i in enumerate(sorted(masked))}))
    hidden = torch.randn(sum(lengths), config.hidden_size, generator=torch.Generator().manual_seed(5))
    layout = _layout(lengths)
    with torch.inference_mode():
        got = row_results(model, hidden, rows, (), layout, _last_hidden, masks=ready)
        logits = model.compute_logits(_last_hidden(hidden, layout, list(range(len(rows))))).float()
        want = sample(logits, params, [0] * len(rows), masks=RowMasks(bitmask, sorted(masked)))
    for a, b in zip(got, want):
        assert a.token is not None
        assert a.token.token_id == b.token_id and math.isclose(a.token.logprob, b.logprob, abs_tol=1e-5)
        assert [t for t, _ in a.token.top] == [t for t, _ in b.top]
    assert got[0].token.token_id in few and got[1].token.token_id in few and got[2].token.token_id in many
    assert all(t in few for t, _ in got[0].token.top)
    assert got[4].token.token_id in (4, 40, 400) and got[5].token.token_id in (4, 40, 400)
