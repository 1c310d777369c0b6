"""encode_batch builds its lists on the calling thread while the pool encodes (ft_batch.hpp): every
mix of texts gives what one-at-a-time encode and HF give, whichever thread encoded a block and
whenever it was converted."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from bench.tokenizer import textgen
from bench.tokenizer.equality import load_pair
from prelude.tokenizer.fast import FastTokenizer
from tests.data import tokenizer_file
from tests.tokenizer.texts import long_text

UNSURE = "\U0001F6DC"  # Unicode 15: its class depends on the version, so HF encodes the text


def _mixed() -> list[str]:
    """Above the parallel threshold: long and short texts, empty ones, every str kind, texts HF
    encodes, a text long enough for its own parallel split (inside the batch: pool busy)."""
    texts = textgen.paper_texts(600, 500, seed=41) + textgen.paper_texts(300, 40, seed=42)
    extras = ["", "a", " ", "caf\u00e9 \u4e2d\u6587 \U0001F600", "plain " + UNSURE + " words",
              UNSURE, long_text(70_000, seed=3), "x" * 5000, ""]
    for k, extra in enumerate(extras):
        texts.insert(k * 97, extra)
    return texts


@pytest.mark.parametrize("name", ["qwen3", "llama3"])
def test_mixed_batch(name: str) -> None:
    path = tokenizer_file(name)
    _, hf, _ = load_pair(path)
    fast = FastTokenizer(path)  # its own: the shared one's reference_encodes must stay 0
    texts = _mixed()
    for add in (True, False):
        before = fast.reference_encodes
        got = fast.encode_batch(texts, add)
        assert fast.reference_encodes - before == 2, "the two texts with an unsure code point go to HF"
        assert got == [fast.encode(t, add) for t in texts]
        assert got == hf.encode_batch(texts, add)
        assert all(type(ids) is list for ids in got)


@pytest.mark.parametrize("count, chars", [(3, 500), (31, 500), (40, 500), (2048, 500), (8, 8000)])
def test_sizes_around_the_threshold(count: int, chars: int) -> None:
    """Below 16 KiB (one thread), just above it (a block or two each), and many blocks."""
    fast, hf, _ = load_pair(tokenizer_file("qwen3"))
    texts = textgen.paper_texts(count, chars, seed=count)
    assert fast.encode_batch(texts) == [fast.encode(t) for t in texts] == hf.encode_batch(texts)


def test_lone_surrogate_in_a_large_batch() -> None:
    fast, _, _ = load_pair(tokenizer_file("qwen3"))
    texts = textgen.paper_texts(1024, 500, seed=43)
    texts[700] = texts[700][:100] + "\ud800" + texts[700][100:]
    with pytest.raises(UnicodeEncodeError):
        fast.encode_batch(texts)
    texts[700] = "fine"
    assert fast.encode_batch(texts) == [fast.encode(t) for t in texts]


def test_concurrent_large_batches() -> None:
    """Batches from several threads at once: one has the pool, the others encode alone."""
    fast, _, _ = load_pair(tokenizer_file("qwen3"))
    sets = [textgen.paper_texts(512, 500, seed=50 + k) for k in range(4)]
    expected = [[fast.encode(t) for t in s] for s in sets]
    barrier = threading.Barrier(4)

    def worker(k: int) -> bool:
        barrier.wait()
        return all(fast.encode_batch(sets[(k + r) % 4]) == expected[(k + r) % 4] for r in range(6))

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(worker, range(4)))
