"""/metrics also speaks vLLM's names and label: llm-d's endpoint picker, vllm-router and Grafana
dashboards read them unchanged; Prelude's own names stay."""
from __future__ import annotations

import httpx


def test_metrics_speak_vllms_names(server):
    httpx.post(server.base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    text = httpx.get(server.base_url + "/metrics").text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:e2e_request_latency_seconds_count"):
        assert any(line.startswith(name + '{model_name="') for line in text.splitlines()), name
    assert "prelude:num_requests_running" in text
