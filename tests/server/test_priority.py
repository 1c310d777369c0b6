"""The `priority` field over HTTP reaches the scheduler with each row of the request (lower runs
first, vLLM's semantics). What --scheduling-policy priority does with it (a KV shortage preempts
the least urgent running request, not the urgent one just admitted) is checked in simulated time
in tests/engine/test_engine.py."""
from __future__ import annotations

import httpx


def test_the_priority_field_reaches_every_row_of_the_request(server):
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
