"""fasttoken is reentrant: many threads encoding and decoding at once get the single-thread results
(the tables are immutable and the word cache is per thread)."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from tests.data import tokenizer_file
from tests.tokenizer.texts import long_text
from bench.tokenizer.equality import corpus_for, load_pair, random_texts


def test_threads_agree_with_serial() -> None:
    path = tokenizer_file("qwen3")
    fast, _, _ = load_pair(path)
    texts = corpus_for(path) + random_texts(path, 200, seed=21) + [long_text(30_000, seed=s) for s in range(4)]
    expected = [fast.encode(t) for t in texts]
    decoded = [fast.decode(ids) for ids in expected]
    barrier = threading.Barrier(6)

    def worker(offset: int) -> bool:
        barrier.wait()
        order = texts[offset:] + texts[:offset]
        ok = True
        for _ in range(3):
            for i, text in enumerate(order):
                k = (i + offset) % len(texts)
                ok &= fast.encode(text) == expected[k]
                ok &= fast.decode(expected[k]) == decoded[k]
            ok &= fast.encode_batch(texts[:50]) == expected[:50]
        return ok

    with ThreadPoolExecutor(6) as pool:
        assert all(pool.map(worker, range(0, 60, 10)))
