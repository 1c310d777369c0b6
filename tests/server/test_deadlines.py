"""Deadlines over HTTP: X-Deadline-Ms is for the first token (or the OneShot result), and
--shed-late-requests answers only work that can still miss it."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx

from prelude.contract.config import Config
from tests.server.harness import ServerThread


def _stream(url: str, i: int) -> list[str]:
    body = {"prompt": f"story number {i}", "max_tokens": 150, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, headers={"X-Deadline-Ms": "300"},
                      timeout=60) as response:
        assert response.status_code == 200
        return [line for line in response.iter_lines() if line]


def test_a_stream_preempted_after_its_first_token_is_not_shed(demo_model):
    # Six streams of 150 tokens need more KV than 100 blocks of 4: the newest are preempted for
    # recompute well after their first token, and past the 300 ms deadline that token met.
    config = Config(model=str(demo_model), block_size=4, num_kv_blocks=100, max_model_len=512,
                    shed_late_requests=True)
    with ServerThread(config) as srv, ThreadPoolExecutor(6) as pool:
        streams = list(pool.map(lambda i: _stream(srv.base_url, i), range(6)))
        assert srv.engine.snapshot().scheduler.num_preemptions > 0
        srv.wait_idle()
    for lines in streams:
        events = [json.loads(line[len("data: "):]) for line in lines[:-1]]
        tokens = [e for e in events if "choices" in e]
        errors = [e["error"] for e in events if "error" in e]
        # Shedding is for work that has not given its first token yet: never after it.
        assert not (tokens and errors), f"shed after {len(tokens)} chunks: {errors}"
        assert lines[-1] == "data: [DONE]"
