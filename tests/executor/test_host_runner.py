"""The runner without torch (executor.host_runner over model.native_decoder) gives the torch
runner's results (executor.runner over model.loader's DecoderLM and executor.fused_step) on the
same checkpoint and the same steps: for Qwen3 (q/k norms), Qwen2 (q/k/v bias) and Llama, from fp32
and bf16 checkpoints, in fp32, bf16 and int8; prompt rows beside decode rows over the paged cache,
tokens drawn greedily with their logprobs, a seeded top-p draw, restricted draws (allowed ids,
logit bias, min_tokens, penalties; allowed ids reporting logprobs), label logprobs (over the
vocabulary or the labels, per item or not), prompt logprobs, last, first and mean pooling, and
rows under a grammar (masked, narrowed to the few tokens it allows, their forced tokens).
A long step run resumably parks while its flag is up and then ends with the same results."""
from __future__ import annotations

import json

import pytest
import torch

from kernels.cpu import ops as cpu_ops
from prelude.contract.batch import DecodeRow, OutputSpec, PrefillRow
from prelude.contract.sampling import GREEDY, SamplingParams
from prelude.contract.stop import StopFlag
from prelude.executor.attention.torch_ref import TorchAttention
from prelude.executor.fused_step import native_step
from prelude.executor.host_runner import HostKVCache, HostRunner
from prelude.executor.kv_cache import KVCache, KVCacheShape
from prelude.executor.runner import ModelRunner
from prelude.model.config import ModelConfig
from prelude.model.loader import cpu_weight_format, load_model
from prelude.model.checkpoint_arrays import checkpoint_files
from prelude.model.native_decoder import NativeDecoder, NotNative
from prelude.model.weight_formats import stored_format
from prelude.model.ops import select_ops
from prelude.structured.compiler import Constraint, GrammarCompiler
from tests.checkpoints import make_checkpoint

pytestmark = pytest.mark.skipif(not cpu_ops.built, reason="kernels.cpu is not built")

BLOCK = 4
BLOCKS = 64
SCHEMA = {"type": "object", "properties": {"verdict": {"enum": ["accepted", "rejected"]},
                                           "confidence": {"type": "integer", "minimum": 1, "maximum": 5}},
          "required": ["verdict", "confidence"], "additionalProperties": False}


def _runners(path, dtype: str = "auto", quantization: str = "none") -> tuple[ModelRunner, HostRunner]:
    """Both runners over the checkpoint, as runner_setup builds them, each with its own cache."""
    config = ModelConfig.from_dir(path)
    dtype_t = {"auto": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    compute, format = cpu_weight_format(dtype_t, quantization, config)
    ops = select_ops(torch.device("cpu"))
    model = load_model(path, config, compute, torch.device("cpu"), max_positions=256, ops=ops, weight_format=format)
    cache = KVCache(KVCacheShape.for_model(config, BLOCKS, BLOCK, torch.float32), torch.device("cpu"))
    torch_runner = ModelRunner(model, TorchAttention(cache), torch.device("cpu"), BLOCK, native_step(model, ops))
    assert torch_runner.native is not None
    native = NativeDecoder.load(checkpoint_files(path), config, stored_format(dtype, quantization, config), 256,
                                torch.get_num_threads())
    kv = HostKVCache(config.num_layers, BLOCKS, BLOCK, config.num_kv_heads, config.head_dim)
    return torch_runner, HostRunner(native, kv, torch.get_num_threads())


def _assert_same(torch_results, host_results, logprob_tolerance: float = 2e-4):
    assert len(torch_results.rows) == len(host_results.rows)
    for expected, got in zip(torch_results.rows, host_results.rows):
        assert got.seq_id == expected.seq_id
        if expected.token is not None:
            assert got.token.token_id == expected.token.token_id
            assert got.token.logprob == pytest.approx(expected.token.logprob, abs=logprob_tolerance)
            assert [t for t, _ in got.token.top] == [t for t, _ in expected.token.top]
            assert [v for _, v in got.token.top] == pytest.approx([v for _, v in expected.token.top],
                                                                  abs=logprob_tolerance)
            assert got.token.rank == expected.token.rank
        for field in ("pooled", "label_logprobs", "item_label_logprobs", "scores"):
            want, have = getattr(expected, field), getattr(got, field)
            assert (want is None) == (have is None), field
            if want is not None and field == "item_label_logprobs":
                assert [v for item in have for v in item] == pytest.approx(
                    [v for item in want for v in item], abs=logprob_tolerance), field
            elif want is not None:
                assert have == pytest.approx(want, abs=logprob_tolerance), field
        if expected.prompt_logprobs is not None:
            assert [e.token_id for e in got.prompt_logprobs] == [e.token_id for e in expected.prompt_logprobs]
            assert [e.logprob for e in got.prompt_logprobs] == pytest.approx(
                [e.logprob for e in expected.prompt_logprobs], abs=logprob_tolerance)


def _prompt(seed: int, n: int, vocab: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


CASES = [("qwen3", None, "auto", "none"), ("qwen2", None, "auto", "none"), ("llama", None, "auto", "none"),
         ("qwen3", torch.bfloat16, "auto", "none"), ("qwen3", None, "bfloat16", "none"),
         ("qwen3", torch.bfloat16, "auto", "int8"), ("llama", None, "auto", "int8")]


@pytest.mark.parametrize("family,saved,dtype,quantization", CASES)
def test_host_runner_gives_the_torch_runners_results(tmp_path, family, saved, dtype, quantization):
    path = make_checkpoint(tmp_path / family, family, dtype=saved, hidden_size=128, intermediate_size=256)
    try:
        torch_runner, host = _runners(path, dtype, quantization)
    except NotNative as exc:  # fp32 weights on AMX are bf16x3, which only the torch runner keeps
        pytest.skip(str(exc))
    vocab = torch_runner.model.config.vocab_size
    reported = OutputSpec(sample=SamplingParams(temperature=0.0, logprobs=3))
    # A step of prompts stored in the cache (their first chunks and a whole one).
    first = [PrefillRow(1, _prompt(1, 9, vocab), 0, [0, 1, 2], reported),
             PrefillRow(2, _prompt(2, 6, vocab), 0, [5, 3], OutputSpec(sample=GREEDY)),
             PrefillRow(3, _prompt(3, 4, vocab), 0, [9], None)]
    _assert_same(torch_runner.run(first, ()), host.run(first, ()))
    # Then decode rows over that cache beside a chunk over a cached context and a OneShot prompt.
    second_prefills = [PrefillRow(3, _prompt(4, 5, vocab), 4, [9, 10, 11], OutputSpec(sample=GREEDY)),
                       PrefillRow(4, _prompt(5, 7, vocab), 0, [], OutputSpec(pooling="last"))]
    decodes = [DecodeRow(1, 17, 9, [0, 1, 2], reported), DecodeRow(2, 23, 6, [5, 3], OutputSpec(sample=GREEDY))]
    _assert_same(torch_runner.run(second_prefills, decodes), host.run(second_prefills, decodes))
    # Decision heads: labels over the vocabulary and over themselves, at the last position and at
    # each item's end, and prompt logprobs, beside a seeded top-p draw and a greedy one.
    decisions = [PrefillRow(5, _prompt(6, 8, vocab), 0, [], OutputSpec(sample=SamplingParams(top_p=0.5, seed=3))),
                 PrefillRow(6, _prompt(7, 8, vocab), 0, [], OutputSpec(label_token_ids=(3, 7, 11))),
                 PrefillRow(7, _prompt(8, 8, vocab), 0, [], OutputSpec(sample=GREEDY, prompt_logprobs=2)),
                 PrefillRow(8, _prompt(9, 9, vocab), 0, [], OutputSpec(label_token_ids=(4, 9)),
                            item_lengths=(2, 3)),
                 PrefillRow(9, _prompt(10, 8, vocab), 0, [], OutputSpec(label_token_ids=(4, 9, 20),
                                                                        label_vocab_normalized=False)),
                 PrefillRow(10, _prompt(12, 10, vocab), 0, [], OutputSpec(label_token_ids=(5, 6),
                                                                          label_vocab_normalized=False),
                            item_lengths=(3, 3)),
                 PrefillRow(11, _prompt(13, 8, vocab), 0, [], OutputSpec(sample=GREEDY))]
    _assert_same(torch_runner.run(decisions, ()), host.run(decisions, ()))
    # Mean and first-state pooling beside labels and a draw.
    pooled = [PrefillRow(12, _prompt(14, 40, vocab), 0, [], OutputSpec(pooling="mean")),
              PrefillRow(13, _prompt(15, 6, vocab), 0, [], OutputSpec(pooling="cls", normalize=True)), *decisions[:3]]
    _assert_same(torch_runner.run(pooled, ()), host.run(pooled, ()))
    # Restricted draws (allowed ids, a logit bias, min_tokens, penalties over a history), seeded
    # and greedy, with logprobs of the model's own distribution.
    history = _prompt(11, 12, vocab)
    restricted = [SamplingParams(temperature=1.0, seed=5, allowed_token_ids=(3, 7, 11, 40)),
                  SamplingParams(temperature=0.0, logit_bias=((9, 30.0),), logprobs=2),
                  SamplingParams(temperature=0.9, seed=6, min_tokens=3, min_tokens_blocked=(2, 5)),
                  SamplingParams(temperature=0.8, seed=7, repetition_penalty=1.3, frequency_penalty=0.5,
                                 presence_penalty=0.4, top_k=10, logprobs=1),
                  SamplingParams(temperature=0.0, allowed_token_ids=(3, 7, 11, 40, 41), logprobs=3)]
    rows = [DecodeRow(20 + k, history[-1], len(history) - 1, [40 + 4 * k, 41 + 4 * k, 42 + 4 * k, 43 + 4 * k],
                      OutputSpec(sample=p), sample_step=2, history=history) for k, p in enumerate(restricted)]
    _assert_same(torch_runner.run((), rows), host.run((), rows))


def test_rows_under_a_grammar_give_the_torch_runners_results(demo_model):
    """Masked rows, sampled and greedy, with logprobs over what the grammar allows or forced
    tokens after their draw, narrowed (a choice's few first tokens) or not (free text), beside a
    row without a grammar and one still in its reasoning block (unconstrained); then the rows
    that forced nothing decode their next token under the same states."""
    torch_runner, host = _runners(demo_model)
    config = host.model.config
    compiler = GrammarCompiler(demo_model / "tokenizer.json", config.vocab_size, (config.vocab_size - 1,))
    grammars = [compiler.compile(Constraint.json_schema(SCHEMA, "structured_outputs")),
                compiler.compile(Constraint("choice", json.dumps(["accepted", "rejected", "unsure"]))),
                compiler.compile(Constraint("regex", "[a-z ]{1,40}"))]
    params = [SamplingParams(temperature=0.0, logprobs=2, max_tokens=30), SamplingParams(seed=3, max_tokens=8),
              SamplingParams(temperature=0.8, seed=4, logprobs=1, max_tokens=8), SamplingParams(max_tokens=30, seed=5),
              SamplingParams(temperature=0.0, max_tokens=8), SamplingParams(seed=6, max_tokens=8)]
    kinds = [0, 1, 2, 0, None, 0]
    prompts = [_prompt(30 + k, 6 + k, config.vocab_size) for k in range(len(params))]
    tables = [[3 * k, 3 * k + 1, 3 * k + 2] for k in range(len(params))]

    def prefills():  # each runner's rows with grammar states of their own: a draw moves them on
        states = [None if g is None else grammars[g].new_state(reasoning_end=7 if k == 5 else None)
                  for k, g in enumerate(kinds)]
        return [PrefillRow(30 + k, prompts[k], 0, tables[k], OutputSpec(sample=p, grammar=state))
                for k, (p, state) in enumerate(zip(params, states))]

    def decodes(rows, results):  # the next token of each row whose draw forced nothing
        return [DecodeRow(row.seq_id, result.token.token_id, len(row.token_ids), row.block_table, row.output,
                          sample_step=1) for row, result in zip(rows, results.rows) if not result.forced]

    torch_rows, host_rows = prefills(), prefills()
    want, got = torch_runner.run(torch_rows, ()), host.run(host_rows, ())
    _assert_same(want, got)
    assert [r.forced for r in got.rows] == [r.forced for r in want.rows]
    assert got.rows[3].forced  # a JSON object's first key follows its brace unsampled
    next_want, next_got = decodes(torch_rows, want), decodes(host_rows, got)
    assert len(next_got) >= 3
    _assert_same(torch_runner.run((), next_want), host.run((), next_got))


def test_a_resumable_step_parks_while_its_flag_is_up_and_ends_with_the_same_results(tmp_path):
    path = make_checkpoint(tmp_path / "qwen3", "qwen3", hidden_size=128, intermediate_size=256)
    torch_runner, host = _runners(path)
    vocab = host.model.config.vocab_size
    rows = [PrefillRow(i, _prompt(i, 40, vocab), 0, [], OutputSpec(sample=SamplingParams(temperature=0.0,
                                                                                           logprobs=2)))
            for i in range(3)]
    stop = StopFlag(check_every_macs=1)
    progress = host.start(rows, stop)
    stop.set()
    assert host.advance(progress, stop) is None
    stop.clear()
    _assert_same(torch_runner.run(rows, ()), host.advance(progress, stop))


def test_what_the_native_runner_does_not_take_is_left_to_the_torch_runner(tmp_path):
    classifier = make_checkpoint(tmp_path / "cls", "qwen3", head="ForSequenceClassification", num_labels=2)
    config = ModelConfig.from_dir(classifier)
    with pytest.raises(NotNative):
        NativeDecoder.load(checkpoint_files(classifier), config, "float32", 64, 1)
    plain = ModelConfig.from_dir(make_checkpoint(tmp_path / "plain", "qwen3"))
    with pytest.raises(NotNative):
        NativeDecoder.check(plain, stored_format("float16", "none", plain))
