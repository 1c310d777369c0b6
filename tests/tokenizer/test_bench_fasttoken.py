"""pytest-benchmark guards for fasttoken's hot operations (the rows of `python -m bench.tokenizer`).

pyproject passes --benchmark-disable, so in CI each runs once as a plain test. To check for a
regression against the committed baseline (fails on a median more than 25% slower):

    pytest tests/tokenizer/test_bench_fasttoken.py --benchmark-enable \
        --benchmark-storage=file://bench/tokenizer/baseline --benchmark-compare=0001 \
        --benchmark-compare-fail=median:25%

bench/tokenizer/README.md says how to refresh the baseline.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from bench.tokenizer import textgen
from prelude.tokenizer.fast import FastTokenizer
from tests.data import tokenizer_file
from bench.tokenizer.equality import load_pair

NAMES = ["qwen3", "llama3", "gpt2"]


@pytest.fixture(scope="module", params=NAMES)
def tok(request: pytest.FixtureRequest) -> FastTokenizer:
    fast, _, _ = load_pair(tokenizer_file(request.param))
    return fast


@pytest.mark.parametrize("chars", [50, 500, 8000, 200_000])
def test_encode(benchmark, tok: FastTokenizer, chars: int) -> None:
    text = textgen.text(chars, seed=chars)
    ids = benchmark(tok.encode, text)
    assert tok.decode(ids) == text


@pytest.mark.parametrize("chars", [500, 8000])
def test_encode_paper_words(benchmark, tok: FastTokenizer, chars: int) -> None:
    """Real English vocabulary with a long tail: word-cache misses and the BPE behind them."""
    texts = textgen.paper_texts(64, chars, seed=chars)
    out = benchmark(lambda: [tok.encode(t) for t in texts])
    assert [tok.decode(ids) for ids in out] == texts


def test_decode(benchmark, tok: FastTokenizer) -> None:
    source = textgen.text(20_000, seed=99)
    ids = tok.encode(source, add_special_tokens=False)[:1245]
    text = benchmark(tok.decode, ids)
    assert len(text) > 1000 and source.startswith(text.rstrip("\ufffd"))


def test_stream_decode(benchmark, tok: FastTokenizer) -> None:
    ids = tok.encode(textgen.text(2_000, seed=3), add_special_tokens=False)

    def stream() -> str:
        seen: list[int] = []
        prefix = read = 0
        pieces = []
        for token_id in ids:
            seen.append(token_id)
            text, prefix, read = tok.decode_step(seen, prefix, read)
            pieces.append(text)
        return "".join(pieces)

    assert benchmark(stream) == tok.decode(ids)


@pytest.mark.parametrize("size", [64, 1024])
def test_batch_encode(benchmark, tok: FastTokenizer, size: int) -> None:
    texts = textgen.paper_texts(size, 500, seed=size)
    out = benchmark(tok.encode_batch, texts)
    assert out == [tok.encode(t) for t in texts]


def test_load_warm(benchmark, tok: FastTokenizer) -> None:
    """A load that finds its tables in the on-disk cache (the fixture's load wrote them)."""
    loaded = benchmark(FastTokenizer, tok.path)
    assert loaded._hit is not None
    assert loaded.encode("Hello world") == tok.encode("Hello world")


def test_concurrent_encode(benchmark, tok: FastTokenizer) -> None:
    work = [textgen.texts(16, 500, seed=1000 + t) for t in range(4)]
    expected = [[tok.encode(t) for t in texts] for texts in work]
    with ThreadPoolExecutor(4) as pool:
        result = benchmark(lambda: list(pool.map(lambda texts: [tok.encode(t) for t in texts], work)))
    assert result == expected
