"""pytest-benchmark timings of the CPU paths every request crosses: normalization, a scheduling
step, streaming detokenization, prefix matching, block allocation, JSON encoding. CI runs them
once as plain tests (pyproject passes --benchmark-disable). As guards they are compared with the
committed baseline in tests/bench/baseline/ and fail when a median is 25% slower (README,
"Hot-path guards"). Each also asserts what it computed, so a broken path fails rather than
getting faster."""
from __future__ import annotations

import json
import random

import pytest

from prelude.cache.block_pool import BlockPool
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
