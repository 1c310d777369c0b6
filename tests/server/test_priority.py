"""The `priority` field over HTTP reaches the scheduler with each row of the request (lower runs
first, vLLM's semantics) under --scheduling-policy priority, and is refused under any other
policy, as vLLM refuses it. What the priority policy does with it (a KV shortage preempts the
least urgent running request, not the urgent one just admitted) is checked in simulated time in
tests/engine/test_engine.py."""
from __future__ import annotations

import httpx

from prelude.contract.config import Config
from tests.server.harness import ServerThread


def test_the_priority_field_reaches_every_row_of_the_request(demo_model):
    with ServerThread(Config(model=str(demo_model), scheduling_policy="priority", max_model_len=256)) as server:
        seen: list[int] = []
        engine = server.engine
        submit_all = engine.submit_all

        def spy(requests):
            seen.extend(r.priority for r in requests)
            return submit_all(requests)

        server.on_loop(lambda: setattr(engine, "submit_all", spy))
        try:
            with httpx.Client(base_url=server.base_url, timeout=30) as http:
                for body in ({"priority": -10, "n": 2}, {"priority": 3}, {}):
                    response = http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2, **body})
                    assert response.status_code == 200, response.text
        finally:
            server.on_loop(lambda: delattr(engine, "submit_all"))
        assert seen == [-10, -10, 3, 0]
        server.wait_idle()


def test_priority_under_another_policy_is_refused(server):
    """Under the default policy (edf) a priority changed nothing, without a word: requests ran
    in their own order whatever it said. vLLM refuses it unless priority scheduling is on."""
    refused = httpx.post(server.base_url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 1, "priority": 5})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "priority"
    assert "--scheduling-policy priority" in refused.json()["error"]["message"]
    zero = httpx.post(server.base_url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 1, "priority": 0})
    assert zero.status_code == 200
