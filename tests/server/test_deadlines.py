"""Deadlines over HTTP: a request shed before its first token is a whole 503 answer. (What
X-Deadline-Ms means to the scheduler, for the first token or the OneShot result, and that a
stream preempted after its first token is never shed, is checked in simulated time in
tests/engine/test_engine.py.)"""
from __future__ import annotations


import httpx

from prelude.contract.config import Config
from tests.server.harness import ServerThread


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
        # Shedding is an abort by the system (vLLM's "abort"): as "error" it fired alerts on failures.
        metrics = http.get("/metrics").text
        assert 'finished_reason="error"} 0' in metrics and "prelude:late_requests_total" in metrics
        assert [line for line in metrics.splitlines() if 'vllm:request_success_total' in line
                and 'finished_reason="abort"' in line][0].endswith(" 3")
