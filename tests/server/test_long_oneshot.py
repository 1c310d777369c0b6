"""A OneShot request longer than the whole KV pool runs (it keeps no decode state): it computes
without storing the KV the pool cannot hold, and its result equals the same request on a server
whose pool holds all of it."""
from __future__ import annotations

import httpx
import pytest

from prelude.contract.config import Config
from tests.server.harness import ServerThread

TOKENS = 8192  # 8x the small pool below; the MLP runs it in chunks (hybrid prefilling)


def _ids(n: int) -> list[int]:
    return [(i * 7919) % 500 + 3 for i in range(n)]


def _embed_and_score(srv: ServerThread) -> tuple[list[float], list[float]]:
    embedding = httpx.post(srv.base_url + "/v1/embeddings", json={"input": [_ids(TOKENS)]}, timeout=300)
    assert embedding.status_code == 200, embedding.text
    score = httpx.post(srv.base_url + "/v1/score", json={"query": _ids(TOKENS - 8), "items": [_ids(8)],
                                                         "label_token_ids": [5, 9]}, timeout=300)
    assert score.status_code == 200, score.text
    return embedding.json()["data"][0]["embedding"], score.json()["scores"][0]


@pytest.mark.slow  # two servers computing 8K-token rows on the CPU
def test_oneshot_longer_than_the_kv_pool_equals_a_roomy_server(demo_model):
    common = dict(model=str(demo_model), block_size=16, max_model_len=TOKENS + 64,
                  allow_long_max_model_len=True)  # past the demo model's 4,096 positions
    with ServerThread(Config(num_kv_blocks=TOKENS // 16 // 8, **common)) as small:  # 1,024 tokens
        got = _embed_and_score(small)
        # Decode work still has to fit the pool; OneShot work does not.
        generate = httpx.post(small.base_url + "/v1/completions", json={"prompt": _ids(2000), "max_tokens": 4})
        assert generate.status_code == 400
        small.wait_idle()
    with ServerThread(Config(num_kv_blocks=2 * TOKENS // 16, **common)) as roomy:
        want = _embed_and_score(roomy)
    assert max(abs(a - b) for a, b in zip(got[0], want[0])) < 1e-4
    assert max(abs(a - b) for a, b in zip(got[1], want[1])) < 1e-4


def test_chat_without_max_tokens_gets_what_fits(demo_model):
    """max_model_len beyond the KV pool: an unbounded chat generates up to what the pool holds
    (it was a 400)."""
    with ServerThread(Config(model=str(demo_model), num_kv_blocks=16, block_size=16, max_model_len=4096)) as srv:
        response = httpx.post(srv.base_url + "/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "Tell me a long story"}], "ignore_eos": True})
        assert response.status_code == 200, response.text
        usage = response.json()["usage"]
        assert usage["prompt_tokens"] + usage["completion_tokens"] == 16 * 16
        srv.wait_idle()
