"""Deadlines over HTTP: X-Deadline-Ms is for the first token (or the OneShot result), and
--shed-late-requests answers only work that can still miss it."""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

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


def _story(url: str, prompt: str, done: list[str], deadline_ms: float | None = None) -> None:
    body = {"prompt": prompt, "max_tokens": 100, "ignore_eos": True, "temperature": 0, "stream": True}
    if deadline_ms is not None:
        body["deadline_ms"] = deadline_ms
    with httpx.stream("POST", url + "/v1/completions", json=body, headers={"X-Request-Id": prompt.split()[0]},
                      timeout=60) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and '"error"' not in lines[-2]
    done.append(prompt.split()[0])


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_a_stream_preempted_after_its_first_token_does_not_wait_behind_later_work(demo_model, prefix_caching):
    # edf orders a waiting request by its deadline. A stream preempted for recompute after its
    # first token has met its deadline; ordered by it still (a generous 100,000 s), it went
    # behind every request without one that arrived before then, and stalled mid-answer.
    # 32 blocks of 4 hold one 108-token sequence, not two: `early` is preempted beside `first`,
    # and `later` arrives while it waits. Without prefix caching the pool never changes version,
    # so an ordering key made before the preemption would never be made again.
    config = Config(model=str(demo_model), block_size=4, num_kv_blocks=32, max_model_len=512,
                    scheduling_policy="edf", enable_prefix_caching=prefix_caching)
    done: list[str] = []
    with ServerThread(config) as srv, ThreadPoolExecutor(3) as pool:
        first = pool.submit(_story, srv.base_url, "first story about a dragon", done)
        while not srv.on_loop(lambda: srv.engine.scheduler.num_running):
            time.sleep(0.001)
        early = pool.submit(_story, srv.base_url, "early tale of a knight", done, 1e8)

        def early_preempted() -> bool:
            return any(w.request.request_id.startswith("cmpl-early") and w.num_output_tokens
                       for w in srv.engine.scheduler.waiting)

        deadline = time.monotonic() + 30
        while not srv.on_loop(early_preempted):
            assert time.monotonic() < deadline and not early.done(), "the second stream was never preempted"
            time.sleep(0.001)
        later = pool.submit(_story, srv.base_url, "later poem on the sea", done)
        for future in (first, early, later):
            future.result(timeout=60)
        srv.wait_idle()
    assert done.index("early") < done.index("later"), done


def test_a_stream_shed_before_its_first_token_answers_503(demo_model):
    # Shedding ends only work that has given no output, so a shed stream need not have sent its
    # 200: it answered 200 and then an error event, which the openai SDK and routers do not
    # retry, where a whole answer is a 503 they retry elsewhere.
    config = Config(model=str(demo_model), block_size=4, num_kv_blocks=100, max_model_len=512,
                    shed_late_requests=True)
    with ServerThread(config) as srv, httpx.Client(base_url=srv.base_url, timeout=30) as http:
        for path, body in (("/v1/completions", {"prompt": "hello there", "n": 2}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
            body = {**body, "max_tokens": 8, "stream": True}
            late = http.post(path, json=body, headers={"X-Deadline-Ms": "0.001"})
            assert late.status_code == 503 and late.json()["error"]["code"] == "deadline_exceeded", late.text
            met = http.post(path, json=body, headers={"X-Deadline-Ms": "20000"})
            assert met.status_code == 200 and met.text.endswith("data: [DONE]\n\n") and '"error"' not in met.text
        srv.wait_idle()
