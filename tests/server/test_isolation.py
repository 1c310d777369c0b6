"""One request whose row makes a forward step raise fails alone: its neighbours in the same
steps complete with the results they get alone, no KV block leaks, and /metrics counts it."""
from __future__ import annotations

import asyncio

import httpx

from prelude.contract.config import Config
from tests.engine.fakes import PoisonedExecutor
from tests.server.harness import ServerThread

PROMPTS = [f"Question {i}: is the sky blue?" for i in range(8)]


def _completion(prompt) -> dict:
    return {"prompt": prompt, "max_tokens": 4, "temperature": 0}


def _metric(text: str, name: str) -> float:
    line = next(ln for ln in text.splitlines() if ln.startswith(f"prelude:{name}{{"))
    return float(line.rsplit(" ", 1)[1])


def test_a_poisoned_row_fails_only_its_own_request(demo_model):
    with ServerThread(Config(model=str(demo_model), num_kv_blocks=256)) as srv:
        url = srv.base_url
        ids = [httpx.post(url + "/tokenize", json={"prompt": p}).json()["tokens"] for p in PROMPTS]
        poison = max(max(t) for t in ids) + 1  # a token no ordinary prompt holds
        alone = [httpx.post(url + "/v1/completions", json=_completion(p)).json()["choices"][0]["text"]
                 for p in PROMPTS]
        embed_alone = httpx.post(url + "/v1/embeddings", json={"input": PROMPTS}).json()["data"]
        hook = PoisonedExecutor(srv.engine.executors, poison)
        srv.on_loop(lambda: setattr(srv.engine, "executors", hook))

        async def storm():
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                good = [client.post("/v1/completions", json=_completion(p)) for p in PROMPTS]
                bad = [client.post("/v1/completions", json=_completion(ids[0] + [poison])) for _ in range(2)]
                bad.append(client.post("/v1/embeddings", json={"input": [ids[1] + [poison]]}))
                embed = client.post("/v1/embeddings", json={"input": PROMPTS})
                return await asyncio.gather(*good, embed, *bad)

        *good, embed, bad_a, bad_b, bad_embed = asyncio.run(storm())
        assert hook.raised > 0, "the poisoned rows never shared a step with the others"
        assert [r.json()["choices"][0]["text"] for r in good] == alone
        assert embed.status_code == 200
        for got, want in zip(embed.json()["data"], embed_alone):
            assert max(abs(a - b) for a, b in zip(got["embedding"], want["embedding"])) < 1e-5
        for bad in (bad_a, bad_b, bad_embed):
            assert bad.status_code == 500
            assert "injected fault" in bad.json()["error"]["message"]
        srv.wait_idle()
        metrics = httpx.get(url + "/metrics").text
        assert _metric(metrics, "failed_requests_total") == 3
        assert _metric(metrics, "failed_steps_total") >= 1
        # The engine goes on serving, the poisoned client included once it sends a clean prompt.
        again = httpx.post(url + "/v1/completions", json=_completion(PROMPTS[0]))
        assert again.status_code == 200 and again.json()["choices"][0]["text"] == alone[0]
