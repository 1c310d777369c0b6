"""/metrics also speaks vLLM's names and label: llm-d's endpoint picker, vllm-router and Grafana
dashboards read them unchanged; Prelude's own names stay."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx

from prelude.contract.config import Config
from tests.server.harness import ServerThread


def _count(text: str, name: str) -> float:
    return float(next(line for line in text.splitlines() if line.startswith(name + "{")).split()[-1])


def test_metrics_speak_vllms_names(server):
    before = httpx.get(server.base_url + "/metrics").text
    httpx.post(server.base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "ignore_eos": True})
    text = httpx.get(server.base_url + "/metrics").text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:e2e_request_latency_seconds_count",
                 # vLLM's Grafana dashboard's queue-time, prefill-time and preemption panels
                 "vllm:request_queue_time_seconds_bucket", "vllm:request_prefill_time_seconds_sum",
                 "vllm:num_preemptions_total",
                 # its decode-time and time-per-output-token panels
                 "vllm:request_decode_time_seconds_bucket", "vllm:request_time_per_output_token_seconds_sum",
                 # the running-phase time KServe's dashboard reads
                 "vllm:request_inference_time_seconds_bucket"):
        assert any(line.startswith(name + '{model_name="') for line in text.splitlines()), name
    assert "prelude:num_requests_running" in text
    # a two-token answer is one observation of each (a request of one token has no TPOT)
    for name in ("vllm:request_decode_time_seconds_count", "vllm:request_time_per_output_token_seconds_count",
                 "vllm:request_inference_time_seconds_count"):
        assert _count(text, name) == _count(before, name) + 1, name


def test_inter_token_latency_counts_each_gap(server):
    """vLLM's dashboard plots inter-token latency from vllm:inter_token_latency_seconds, one
    observation per gap between two tokens of a request: a 5-token answer adds four."""
    before = httpx.get(server.base_url + "/metrics").text
    r = httpx.post(server.base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 5, "ignore_eos": True})
    assert r.json()["usage"]["completion_tokens"] == 5
    text = httpx.get(server.base_url + "/metrics").text
    for prefix in ("vllm", "prelude"):
        name = f"{prefix}:inter_token_latency_seconds_count"
        assert _count(text, name) == _count(before, name) + 4, name


def test_token_counters_move_as_tokens_are_made_and_keep_an_aborted_streams(server):
    """vLLM's token counters grow each step: they grew only when a request finished, and never
    for one the client left, so throughput panels were spiky and missed aborted work."""
    url = server.base_url
    before = httpx.get(url + "/metrics").text
    body = {"prompt": "hi", "max_tokens": 500, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        events = response.iter_lines()
        streamed = sum(1 for _, line in zip(range(40), events) if line.startswith("data: "))
        during = httpx.get(url + "/metrics").text
        for name in ("vllm:generation_tokens_total", "prelude:generation_tokens_total"):
            assert _count(during, name) >= _count(before, name) + streamed - 1, name
        assert _count(during, "vllm:prompt_tokens_total") > _count(before, "vllm:prompt_tokens_total")
    server.wait_idle()
    after = httpx.get(url + "/metrics").text
    assert _count(after, "vllm:generation_tokens_total") >= _count(during, "vllm:generation_tokens_total")


def _running(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return float(next(line for line in text.splitlines() if line.startswith("vllm:num_requests_running{")).split()[-1])


def test_requests_running_counts_oneshot_rows_in_flight(demo_model):
    """A replica computing long embeddings is busy: vllm:num_requests_running counts their rows
    while their step runs (it counted Decode sequences only, so a router read the replica as
    idle, 0 running and 0 waiting, for the seconds the step took)."""
    config = Config(model=str(demo_model), block_size=4, num_kv_blocks=256, max_model_len=4096)
    long_ids = [(7 * i) % 1500 + 10 for i in range(3000)]
    with ServerThread(config) as srv, ThreadPoolExecutor(1) as pool:
        pending = pool.submit(httpx.post, srv.base_url + "/v1/embeddings",
                              json={"input": [long_ids, long_ids[1:]]}, timeout=120)
        seen = 0.0
        while not pending.done():
            seen = max(seen, _running(srv.base_url))
        assert pending.result().status_code == 200
        assert seen >= 1
        srv.wait_idle()
        assert _running(srv.base_url) == 0


def test_metrics_text_is_valid_exposition(server):
    """Each family is declared once (HELP, TYPE), each sample belongs to a declared family,
    counters end in _total, histograms carry _bucket up to le="+Inf", _sum and _count."""
    httpx.post(server.base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    text = httpx.get(server.base_url + "/metrics").text
    types: dict[str, str] = {}
    samples: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name not in types, f"{name} declared twice"
            types[name] = kind
        elif line and not line.startswith("#"):
            name = line.split("{")[0]
            family = next(f for f in (name, name.rsplit("_", 1)[0]) if f in types)
            samples.setdefault(family, set()).add(name[len(family):] + ('+Inf' if 'le="+Inf"' in line else ""))
            float(line.rsplit(" ", 1)[1])
    for name, kind in types.items():
        if kind == "counter":
            assert name.endswith("_total"), name
        if kind == "histogram":
            assert {"_bucket+Inf", "_sum", "_count"} <= samples[name], name


def _reason_count(text: str, reason: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total{") and f'finished_reason="{reason}"' in line)


def test_pooling_and_scoring_requests_finish_stopped(server):
    """vLLM's pooling requests finish "stop"; every embedding, classification and score row here
    was counted as "length", the reason a dashboard reads as cut-off generations."""
    url = server.base_url
    before = httpx.get(url + "/metrics").text
    httpx.post(url + "/v1/embeddings", json={"input": ["a b", "c d"]}).raise_for_status()
    httpx.post(url + "/v1/score", json={"query": "q", "items": ["a", "b"], "label_token_ids": [5, 6]}) \
        .raise_for_status()
    after = httpx.get(url + "/metrics").text
    # two embeddings, and the items' rows (packed into one where their tokens allow)
    assert _reason_count(after, "stop") >= _reason_count(before, "stop") + 3
    assert _reason_count(after, "length") == _reason_count(before, "length")
    # prompt logprobs with no token generated reached their length, as in vLLM
    httpx.post(url + "/v1/completions", json={"prompt": "a b", "max_tokens": 0, "echo": True}).raise_for_status()
    assert _reason_count(httpx.get(url + "/metrics").text, "length") == _reason_count(after, "length") + 1


def test_the_dashboards_length_panels_and_every_finish_reason(demo_model):
    """vLLM's Grafana dashboard plots prompt and generation lengths per request and tokens per
    step, and an alert on increase(request_success_total{finished_reason="abort"}) needs the
    series before the first abort: these were missing, so panels stayed empty."""
    with ServerThread(Config(model=str(demo_model), block_size=4, num_kv_blocks=256, max_model_len=256)) as srv:
        fresh = httpx.get(srv.base_url + "/metrics").text
        for reason in ("stop", "length", "abort", "error"):
            assert _reason_count(fresh, reason) == 0 and f'finished_reason="{reason}"' in fresh, reason
        usage = httpx.post(srv.base_url + "/v1/completions", json={
            "prompt": "hi there", "max_tokens": 3, "ignore_eos": True}).json()["usage"]
        text = httpx.get(srv.base_url + "/metrics").text
    assert _count(text, "vllm:request_prompt_tokens_count") == 1
    assert _count(text, "vllm:request_prompt_tokens_sum") == usage["prompt_tokens"]
    assert _count(text, "vllm:request_generation_tokens_sum") == 3
    # the prompt's step and two decode steps
    assert _count(text, "vllm:iteration_tokens_total_sum") >= usage["prompt_tokens"] + 2
    assert _count(text, "vllm:time_per_output_token_seconds_count") == 2
