"""The CUDA executor (flashinfer attention, Triton kernels, CUDA graphs; bf16) against the CPU
reference executor (torch attention, fp32) on the same weights, step by step through every
batch kind: greedy tokens agree wherever the reference's top-2 margin exceeds bf16 noise, and
logprobs agree to bf16 tolerance. CUDA graphs must not change results: the graph executor is
also compared with an eager (--enforce-eager) one. Those tests need a GPU.

On CPU, the executor's own logic (staging, bucket padding, graph-mode planning) runs against
the flashinfer API stand-in, with graph replay replaced by an eager forward into the same
static buffers, and must reproduce the reference exactly (fp32)."""
from __future__ import annotations

import logging
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from prelude.contract.config import Config
from prelude.contract.batch import (
    DecodeBatch,
    DecodeRow,
    MixedBatch,
    OneShotBatch,
    OutputSpec,
    PrefillRow,
    decode_rows,
    prefill_rows,
)
from prelude.contract.sampling import SamplingParams
from prelude.executor.attention.torch_ref import TorchAttention
from prelude.executor.kv_cache import KVCache, KVCacheShape
from prelude.executor.executors import Executors
from prelude.executor.runner import ModelRunner
from prelude.model.config import ModelConfig
from prelude.model.loader import load_model
from tests.checkpoints import make_checkpoint
from tests.conftest import TRITON_ON_CPU
from tests.executor import fake_flashinfer

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

BS = 16
BLOCKS = 64
SPEC = OutputSpec(sample=SamplingParams(temperature=0.0, logprobs=4))
LABELS = OutputSpec(label_token_ids=(3, 7, 11))
LOGPROB_ATOL = 0.08  # bf16 weights and activations against an fp32 reference
MARGIN = 0.25  # top-2 gaps below this may flip under bf16 rounding


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    # head_dim 128 and 2 query heads per KV head, like Qwen3-0.6B: the same flashinfer JIT
    # modules as the benchmark servers, so a device call compiles them once.
    path = make_checkpoint(tmp_path_factory.mktemp("cuda") / "q3", "qwen3", head_dim=128)
    # Random weights give nearly flat next-token distributions (every logprob near -5.8 over
    # 512 tokens, no top-2 gap above 0.25), where bf16 noise reorders the top tokens and broken
    # attention would still agree in value. A 10x final norm spreads the logits: on CPU, 9 of
    # 19 sampled rows then have a clear winner and bf16 stays within 0.04 of fp32.
    weights = load_file(path / "model.safetensors")
    weights["model.norm.weight"] *= 10
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return path


def _reference(path):
    config = ModelConfig.from_dir(path)
    model = load_model(path, config, torch.float32, torch.device("cpu"), max_positions=512)
    cache = KVCache(KVCacheShape.for_model(config, BLOCKS, BS, torch.float32), torch.device("cpu"))
    return ModelRunner(model, TorchAttention(cache), torch.device("cpu"), BS)


def _cuda(path, enforce_eager: bool):
    from prelude.app.runner_setup import cuda_runner
    from prelude.model.ops import select_ops

    device = torch.device("cuda")
    config = ModelConfig.from_dir(path)
    model = load_model(path, config, torch.bfloat16, device, max_positions=512, ops=select_ops(device))
    per_block = KVCacheShape.bytes_per_block(config, BS, torch.bfloat16)
    cfg = Config(model=str(path), block_size=BS, num_kv_blocks=BLOCKS, max_num_seqs=8,
                 max_num_batched_tokens=512, enforce_eager=enforce_eager)
    runner, *_ = cuda_runner(cfg, model, device, torch.bfloat16, 512, 1024, per_block)
    runner.warmup()
    return runner


def _script(vocab: int, short: bool = False):
    """Batches of a short serving session; decode inputs are fixed in advance (teacher forcing)
    so every executor sees identical inputs whatever it samples.

    `short`: the same batches, rows and row situations (partly stored prompts, a one-block
    chunk and its continuation, a prefix hit with an unstored tail, padded decode buckets) with
    fewer tokens, for the Triton interpreter, whose time grows with a step's tokens. Its
    single-row OneShot (20 tokens) lands in the 32-token prefill graph bucket, the long one's
    (100 tokens) in the 128-token bucket."""
    gen = torch.Generator().manual_seed(7)

    def tok(n: int) -> list[int]:
        return torch.randint(0, vocab, (n,), generator=gen).tolist()

    # a, b, c: served prompts; c's first 16 tokens (one block) are a chunk of their own.
    # first, second: OneShot rows, second partly stored (full blocks only); hit: new tokens after
    # a prefix hit on a's first block; single: the single-row OneShot.
    la, lb, lc, first, second, hit, single = (17, 5, 20, 6, 19, 4, 20) if short else (40, 17, 30, 23, 35, 20, 100)
    a, b, c = tok(la), tok(lb), tok(lc)
    ta, tb, tc = [1, 2, 3, 4], [5, 6], [7, 8]
    steps = [
        OneShotBatch([PrefillRow(100, tok(first), 0, [], SPEC),
                      PrefillRow(101, tok(second), 0, [9, 10][: second // BS], SPEC),
                      PrefillRow(102, tok(5), 0, [], LABELS)]),
        MixedBatch([PrefillRow(1, a, 0, ta, SPEC), PrefillRow(2, b, 0, tb, SPEC),
                    PrefillRow(3, c[:16], 0, tc, None)], []),
    ]
    for i in range(3):
        steps.append(DecodeBatch([DecodeRow(1, tok(1)[0], la + i, ta, SPEC),
                                  DecodeRow(2, tok(1)[0], lb + i, tb, SPEC)]))
    steps += [
        # Chunk continuation, a prefix hit on a's first block with an unstored tail, decodes.
        MixedBatch([PrefillRow(3, c[16:], 16, tc, SPEC), PrefillRow(103, tok(hit), 16, ta[:1], SPEC)],
                   [DecodeRow(1, tok(1)[0], la + 3, ta, SPEC), DecodeRow(2, tok(1)[0], lb + 3, tb, SPEC)]),
        OneShotBatch([PrefillRow(104, tok(single), 0, [], SPEC)]),  # a single-row prefill graph
        DecodeBatch([DecodeRow(1, tok(1)[0], la + 4, ta, SPEC), DecodeRow(2, tok(1)[0], lb + 4, tb, SPEC),
                     DecodeRow(3, tok(1)[0], lc, tc, SPEC)]),  # 3 rows padded to a bucket of 4
        # A new sequence's whole prompt beside decodes: its prefill graph, then the decode graph.
        MixedBatch([PrefillRow(4, tok(single), 0, list(range(20, 20 + -(-single // BS))), SPEC)],
                   [DecodeRow(1, tok(1)[0], la + 5, ta, SPEC), DecodeRow(2, tok(1)[0], lb + 5, tb, SPEC)]),
        # Two new prompts arriving together beside decodes: one prefill graph for both, then the
        # decode graph.
        MixedBatch([PrefillRow(5, tok(first), 0, list(range(40, 40 + -(-first // BS))), SPEC),
                    PrefillRow(6, tok(lb), 0, list(range(50, 50 + -(-lb // BS))), SPEC)],
                   [DecodeRow(1, tok(1)[0], la + 6, ta, SPEC), DecodeRow(2, tok(1)[0], lb + 6, tb, SPEC)]),
    ]
    # Multi-item scoring rows (a shared part, then items that see it and themselves only): alone,
    # where a causal prefill graph must not take it, and beside an ordinary row.
    items = (3, 2, 4) if short else (10, 6, 12, 8)
    shared = 6 if short else 40

    def multi(seq: int) -> PrefillRow:
        return PrefillRow(seq, tok(shared + sum(items)), 0, [], LABELS, item_lengths=items)

    steps += [OneShotBatch([multi(105)]), OneShotBatch([PrefillRow(106, tok(first), 0, [], SPEC), multi(107)])]
    return steps


def _sampled_rows(steps) -> int:
    """Rows that sample a token (those _compare can check token by token)."""
    return sum(r.output is not None and r.output.sample is not None
               for batch in steps for r in [*prefill_rows(batch), *decode_rows(batch)])


def _run(runner, steps):
    """Each step through the executor of its batch kind, all over one runner."""
    executors = Executors.over(runner)
    return [executors.execute(batch).rows for batch in steps]


def _compare(got_steps, want_steps, atol: float, margin: float):
    checked = 0
    for got_rows, want_rows in zip(got_steps, want_steps):
        assert [r.seq_id for r in got_rows] == [r.seq_id for r in want_rows]
        for got, want in zip(got_rows, want_rows):
            if want.label_logprobs is not None:
                torch.testing.assert_close(got.label_logprobs, want.label_logprobs, atol=atol, rtol=0)
            if want.item_label_logprobs is not None:
                torch.testing.assert_close(got.item_label_logprobs, want.item_label_logprobs, atol=atol, rtol=0)
            if want.token is None:
                continue
            top = want.token.top
            if top[0][1] - top[1][1] > margin:
                assert got.token.token_id == want.token.token_id, (got.seq_id, got.token, want.token)
                checked += 1
            # Every token both rank among their top logprobs has the same logprob.
            want_logprob = dict(top)
            for token_id, logprob in got.token.top:
                if token_id in want_logprob:
                    assert abs(logprob - want_logprob[token_id]) <= atol, (got.seq_id, got.token, want.token)
    return checked


@needs_cuda
def test_cuda_executor_matches_cpu_reference(checkpoint):
    steps = _script(ModelConfig.from_dir(checkpoint).vocab_size)
    want = _run(_reference(checkpoint), steps)
    got = _run(_cuda(checkpoint, enforce_eager=False), steps)
    assert _compare(got, want, LOGPROB_ATOL, MARGIN) >= 6  # 9 of the first 19 rows have a clear winner in fp32


@needs_cuda
def test_cuda_graphs_do_not_change_results(checkpoint):
    steps = _script(ModelConfig.from_dir(checkpoint).vocab_size)
    graphs = _cuda(checkpoint, enforce_eager=False)
    eager = _cuda(checkpoint, enforce_eager=True)
    got, want = _run(graphs, steps), _run(eager, steps)
    assert graphs.graphs is not None and eager.graphs is None
    if type(graphs.attention).__name__ == "FlashInferAttention":
        assert {kind for kind, _ in graphs.graphs.graphs} >= {"decode"}
    # Padded graph buckets may take other GEMM algorithms: bf16 rounding, not a changed result.
    assert _compare(got, want, atol=0.04, margin=0.1) >= 6


@needs_cuda
def test_cuda_backend_choice_is_logged_and_usable(checkpoint, caplog):
    import importlib.util

    expected = "FlashInferAttention" if importlib.util.find_spec("flashinfer") else "TorchAttention"
    with caplog.at_level(logging.INFO, logger="prelude"):
        runner = _cuda(checkpoint, enforce_eager=False)
    assert type(runner.attention).__name__ == expected
    # Logged: the factory's KV-cache line and the warmup line both name the backend.
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("KV cache:") and f"attention {expected}" in m for m in messages), messages
    assert any(m.startswith("CUDA warmup") and f"attention {expected}" in m for m in messages), messages
    # Usable: one step (a OneShot of three rows, one label-only) through it gives the
    # reference's results.
    step = _script(ModelConfig.from_dir(checkpoint).vocab_size)[:1]
    got, want = _run(runner, step), _run(_reference(checkpoint), step)
    assert [r.token is None for r in got[0]] == [r.token is None for r in want[0]] == [False, False, True]
    _compare(got, want, LOGPROB_ATOL, MARGIN)


class _EagerGraph:
    """Stands in for a captured graph on CPU: replay runs the forward on the static inputs."""

    def __init__(self, runner, bucket: int, hidden: torch.Tensor):
        self.runner, self.bucket, self.hidden = runner, bucket, hidden

    def replay(self) -> None:
        ids, positions = self.runner.static[0, : self.bucket], self.runner.static[1, : self.bucket]
        self.hidden.copy_(self.runner.model(ids, positions, self.runner.attention))


class _EagerPieces:
    """Stands in for a bucket's captured pieces on CPU: replay runs the forward on the static
    inputs, the real attention on the step's first n tokens (as between replayed pieces)."""

    def __init__(self, graphs, bucket: int):
        self.graphs, self.bucket = graphs, bucket

    def replay(self, attention, buffers, n, on_launch=None):
        from prelude.executor.piecewise_graphs import SlicedAttention

        ids, positions = self.graphs.static[0, : self.bucket], self.graphs.static[1, : self.bucket]
        slots = self.graphs.static[2, : self.bucket]
        return self.graphs.model(ids, positions, SlicedAttention(attention, n, slots))


def _flashinfer_stand_in_with_eager_graphs(monkeypatch) -> None:
    """flashinfer's API stand-in, and CUDA graphs that "capture" as _EagerGraph and pieces that
    "capture" as _EagerPieces."""
    from prelude.executor import cuda_graphs, piecewise_graphs

    fake_flashinfer.install(monkeypatch)

    def capture(runner, kind, bucket):
        captured = cuda_graphs._Captured(None, torch.empty(bucket, runner.model.config.hidden_size))
        captured.graph = _EagerGraph(runner, bucket, captured.hidden)
        return captured

    monkeypatch.setattr(cuda_graphs.GraphRunner, "_capture", capture)
    monkeypatch.setattr(piecewise_graphs.PiecewiseGraphs, "_capture",
                        lambda graphs, bucket, n: _EagerPieces(graphs, bucket))


def _runner_on_api_stand_in(path, fuse_rope: bool | None = None):
    """The CUDA model runner over the CPU reference's fp32 weights and flashinfer's API
    stand-in (installed by _flashinfer_stand_in_with_eager_graphs), not yet warmed up."""
    from prelude.executor.attention.flashinfer_backend import FlashInferAttention
    from prelude.executor.cuda_runner import CudaModelRunner

    config = ModelConfig.from_dir(path)
    model = load_model(path, config, torch.float32, torch.device("cpu"), max_positions=512)
    cache = KVCache(KVCacheShape.for_model(config, BLOCKS + 1, BS, torch.float32), torch.device("cpu"))
    attention = FlashInferAttention(cache, config.num_heads, max_pages_per_row=32, dummy_page=BLOCKS,
                                    fuse_rope=fuse_rope, workspace_bytes=16)
    return CudaModelRunner(model, attention, torch.device("cpu"), BS, max_num_seqs=8, max_num_batched_tokens=512,
                           pad_slot=BLOCKS * BS)


@pytest.mark.parametrize("fuse_rope", [False, pytest.param(True, marks=pytest.mark.skipif(
    not TRITON_ON_CPU, reason="the fused RoPE kernel on CPU tensors needs triton's interpreter "
    "(no triton here, or a GPU machine, where the CUDA tests cover it)"))])
def test_executor_logic_on_cpu_with_api_stand_in(monkeypatch, tmp_path, fuse_rope):
    from prelude.executor import cuda_graphs, piecewise_graphs

    _flashinfer_stand_in_with_eager_graphs(monkeypatch)
    replayed: list[str] = []
    run_graph, run_pieces = cuda_graphs.GraphRunner.run, piecewise_graphs.PiecewiseGraphs.run
    monkeypatch.setattr(cuda_graphs.GraphRunner, "run",
                        lambda self, kind, *args: replayed.append(kind) or run_graph(self, kind, *args))
    monkeypatch.setattr(piecewise_graphs.PiecewiseGraphs, "run",
                        lambda self, *args: replayed.append("pieces") or run_pieces(self, *args))
    path = make_checkpoint(tmp_path / "q3", "qwen3")
    # The fused RoPE kernel runs in Triton's interpreter here: the short script keeps it quick.
    steps = _script(ModelConfig.from_dir(path).vocab_size, short=fuse_rope)
    want = _run(_reference(path), steps)

    runner = _runner_on_api_stand_in(path, fuse_rope)
    runner.warmup()
    got = _run(runner, steps)
    # fp32 on both sides: every sampled row is checked (no exact top-2 ties in this model).
    assert _compare(got, want, atol=1e-4, margin=0.0) == _sampled_rows(steps) == 26
    expected_graphs = {("decode", 2), ("decode", 4)} | ({("prefill", 32), ("prefill", 64)} if fuse_rope else set())
    assert set(runner.graphs.graphs) == expected_graphs
    # With prefill graphs, each step of fresh rows replays one, padded by its tokens: the first
    # OneShot step (3 rows, 30 tokens: 32, its padding a row of 2), the served prompts (3 rows,
    # 38 tokens: 64), the single row, the new prompts beside decodes (1 row, then 2). Rows over a
    # cached prefix and multi-item rows run eagerly.
    assert replayed.count("prefill") == (5 if fuse_rope else 0)
    # With the fused KV write, the other steps replay pieces around their attention (the
    # warmup ran eagerly): the chunk continuation beside a prefix hit and the two multi-item
    # steps. Without it they run eagerly.
    assert replayed.count("pieces") == (3 if fuse_rope else 0)


def test_constrained_rows_on_cpu_with_api_stand_in(monkeypatch, tmp_path, demo_model):
    """Rows under a grammar beside free rows, through the CUDA runner (decode graphs replayed
    on the API stand-in) and the CPU reference, each feeding its sampled tokens back: the same
    tokens, and every constrained one allowed by the grammar."""
    from prelude.structured.compiler import Constraint, GrammarCompiler
    from prelude.tokenizer import load
    from tests.checkpoints import make_model_dir

    _flashinfer_stand_in_with_eager_graphs(monkeypatch)
    path = make_model_dir(tmp_path / "q3", "qwen3", demo_model)
    config = ModelConfig.from_dir(path)
    grammar = GrammarCompiler(path / "tokenizer.json", config.vocab_size, (2,)).compile(
        Constraint("regex", "[0-9]{2,12}", param="p"))
    cuda = _runner_on_api_stand_in(path)
    cuda.warmup()
    tokenizer = load(path)
    answers = []
    for runner in (_reference(path), cuda):
        executors = Executors.over(runner)
        specs = [OutputSpec(sample=SamplingParams(temperature=0.0), grammar=grammar.new_state()),
                 OutputSpec(sample=SamplingParams(temperature=0.0)),
                 OutputSpec(sample=SamplingParams(temperature=1.0, seed=5), grammar=grammar.new_state())]
        tables = [[0, 1], [2, 3], [4, 5]]
        prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13]]
        rows = executors.execute(MixedBatch([PrefillRow(i, p, 0, t, s) for i, (p, t, s) in
                                             enumerate(zip(prompts, tables, specs))], [])).rows
        tokens = [[r.token.token_id] for r in rows]
        for step in range(1, 6):
            batch = DecodeBatch([DecodeRow(i, tokens[i][-1], len(prompts[i]) + step - 1, tables[i], specs[i], step)
                                 for i in range(3)])
            for i, row in enumerate(executors.execute(batch).rows):
                tokens[i].append(row.token.token_id)
        answers.append(tokens)
    assert answers[0] == answers[1]
    for i in (0, 2):  # digits, then EOS (the rows run on past it here)
        text = tokenizer.decode(answers[0][i], skip_special_tokens=True)
        assert re.fullmatch("[0-9]{2,12}", text), answers[0][i]
    assert cuda.graphs is not None and ("decode", 4) in cuda.graphs.graphs
