"""--scheduling-policy priority over HTTP: when KV blocks run out, the least urgent running
request is preempted (vLLM's rule), not the urgent one just admitted beside it."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from prelude.contract.config import Config
from tests.server.harness import ServerThread


def _story(url: str, name: str, priority: int, max_tokens: int, done: list[str]) -> None:
    body = {"prompt": f"{name} story about a dragon", "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0, "stream": True, "priority": priority}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and '"error"' not in lines[-2]
    done.append(name)


def test_the_urgent_request_is_not_the_one_preempted(demo_model):
    # Three low-priority streams of 100 tokens and an urgent one admitted just after them
    # outgrow 60 blocks of 4. The urgent one was the newest running, so it was the one
    # preempted, and it waited for blocks until the others had finished: the most urgent
    # request finished last (3 runs of 3 without the change).
    config = Config(model=str(demo_model), block_size=4, num_kv_blocks=60, max_model_len=512,
                    scheduling_policy="priority")
    done: list[str] = []
    with ServerThread(config) as srv, ThreadPoolExecutor(4) as pool:
        low = [pool.submit(_story, srv.base_url, f"low{i}", 10, 100, done) for i in range(3)]
        deadline = time.monotonic() + 30
        while srv.on_loop(lambda: srv.engine.scheduler.num_running) < 3:
            assert time.monotonic() < deadline, "the low-priority streams never ran together"
            time.sleep(0.001)
        urgent = pool.submit(_story, srv.base_url, "urgent", -10, 100, done)
        for future in (*low, urgent):
            future.result(timeout=60)
        preemptions = srv.engine.snapshot().scheduler.num_preemptions
        srv.wait_idle()
    assert preemptions > 0, "the pool never ran out: nothing was tested"
    assert done[-1] != "urgent", done
