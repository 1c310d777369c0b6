"""Two Prelude replicas behind the real sglang-router (cache_aware): the router discovers the
model through /model_info and /server_info, loads the tokenizer from the path they report, and
the endpoints it routes work through it, streaming included: completions, chat, embeddings,
classify, and its own /v1/tokenize from the tokenizer path Prelude reports. (sglang-router has no
/v1/score route, and its /v1/rerank rebuilds SGLang's worker response shape, not the vLLM/Cohere
one Prelude answers: score and rerank go to a replica directly.)"""
from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from bench.serving.core.server import ServerProcess, free_port, prelude_env

pytest.importorskip("sglang_router", reason="the sglang-router wheel is not installed (pip install sglang-router)")


ROUTER_ATTEMPTS = 3  # a port found free may be bound by another process before the router binds it


def _start_router(workers: list[str], log_path) -> tuple[subprocess.Popen, str]:
    """sglang-router on a port found free, started again on another when it exits because that
    port was taken meanwhile; the process and its URL once it routes."""
    for _ in range(ROUTER_ATTEMPTS):
        port = free_port()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *workers,
                                     "--policy", "cache_aware", "--host", "127.0.0.1", "--port", str(port)],
                                    stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while proc.poll() is None:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200 and \
                        httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    return proc, url
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                proc.terminate()
                proc.wait(10)
                raise AssertionError("the router did not come up")
            time.sleep(0.2)
        if "in use" not in log_path.read_text(errors="replace"):
            break
    raise AssertionError(f"the router exited: {log_path.read_text(errors='replace')[-2000:]}")


@pytest.fixture(scope="module")
def router(demo_model, tmp_path_factory):
    args = ["--model", str(demo_model), "--num-kv-blocks", "256"]
    with ServerProcess(args, env=prelude_env(), label="replica-a") as a, \
            ServerProcess(args, env=prelude_env(), label="replica-b") as b:
        proc, url = _start_router([a.base_url, b.base_url], tmp_path_factory.mktemp("router") / "router.log")
        try:
            yield url, a, b
        finally:
            proc.terminate()
            proc.wait(10)


def test_discovery_endpoints(router):
    _, a, _ = router
    for path in ("/model_info", "/get_model_info", "/server_info", "/get_server_info"):
        info = httpx.get(a.base_url + path).json()
        assert info["served_model_name"] and info["tokenizer_path"]


def test_every_endpoint_through_the_router(router, demo_model):
    url, _, _ = router
    name = str(demo_model).rstrip("/")  # the demo server's served model name is its --model
    with httpx.Client(base_url=url, timeout=60) as client:
        done = client.post("/v1/completions", json={"model": name, "prompt": "hello", "max_tokens": 3})
        assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 3
        with client.stream("POST", "/v1/chat/completions", json={
                "model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                "stream": True}) as stream:
            lines = [line for line in stream.iter_lines() if line]
        assert lines[-1] == "data: [DONE]" and len(lines) >= 3
        embedded = client.post("/v1/embeddings", json={"model": name, "input": ["a", "b"]}).json()
        assert len(embedded["data"]) == 2
        classified = client.post("/v1/classify", json={"model": name, "input": "hi"})
        assert classified.status_code == 400  # proxied: the demo model has no classifier head
        tokens = client.post("/v1/tokenize", json={"model": name, "prompt": "hello"})
        assert tokens.status_code == 200 and tokens.json()["count"] > 0  # the router's own, from our tokenizer



def test_the_router_reads_each_replicas_load(router, demo_model):
    """sglang-router's power_of_two compares the loads it polls from each worker's /get_load:
    a 404 there read as an unknown load on every replica, and the policy chose at random. The
    router's /flush_cache reaches each replica's prefix cache."""
    url, a, _ = router
    loads = httpx.get(url + "/get_loads", timeout=30).json()
    assert len(loads["workers"]) == 2 and all(entry["load"] >= 0 for entry in loads["workers"]), loads
    # A replica with a prompt's KV held answers the tokens it holds.
    with httpx.stream("POST", a.base_url + "/v1/completions", timeout=60, json={
            "model": str(demo_model).rstrip("/"), "prompt": "hello " * 40, "max_tokens": 3000, "ignore_eos": True,
            "stream": True}) as stream:
        lines = stream.iter_lines()
        first = next(lines)
        busy = httpx.get(a.base_url + "/get_load").json()
        assert first.startswith("data: {") and sum(1 for _ in lines) > 100  # it was running
    assert busy[0]["num_reqs"] == 1 and busy[0]["num_tokens"] >= 40, busy
    flushed = httpx.post(url + "/flush_cache", timeout=30).json()
    assert flushed["status"] == "success", flushed
