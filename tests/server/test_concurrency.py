"""Many concurrent mixed requests over HTTP, and client disconnects freeing their blocks."""
from __future__ import annotations

import asyncio
import json
import random
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai


def test_200_mixed_concurrent_requests_complete_correctly(server, client):
    name = server.served.name
    prompts = [f"Request about topic {i % 7}: is the answer yes?" for i in range(20)]
    # Reference results, one request at a time (greedy is deterministic).
    expected, expected_chat = {}, {}
    for p in set(prompts):
        for n in (1, 6):
            answer = client.completions.create(model=name, prompt=p, max_tokens=n, temperature=0)
            expected[(p, n)] = answer.choices[0].text
            expected_chat[(p, n)] = client.chat.completions.create(
                model=name, max_tokens=n, temperature=0,
                messages=[{"role": "user", "content": p}]).choices[0].message.content
    rng = random.Random(3)
    jobs = [(rng.choice(prompts), rng.choice((1, 6)), rng.choice(("plain", "stream", "chat"))) for _ in range(200)]

    async def run_all():
        async with openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0,
                                      timeout=120) as aclient:
            async def one(prompt, n, mode):
                if mode == "plain":
                    out = await aclient.completions.create(model=name, prompt=prompt, max_tokens=n, temperature=0)
                    return out.choices[0].text
                if mode == "stream":
                    text = ""
                    async for chunk in await aclient.completions.create(model=name, prompt=prompt, max_tokens=n,
                                                                         temperature=0, stream=True):
                        text += chunk.choices[0].text
                    return text
                out = await aclient.chat.completions.create(model=name, max_tokens=n, temperature=0,
                                                            messages=[{"role": "user", "content": prompt}])
                return out.choices[0].message.content

            return await asyncio.gather(*(one(*job) for job in jobs))

    results = asyncio.run(run_all())
    for (prompt, n, mode), text in zip(jobs, results):
        assert isinstance(text, str)
        assert text == (expected_chat if mode == "chat" else expected)[(prompt, n)], (prompt, n, mode)
    server.wait_idle()


def _aborts(server) -> int:
    return server.on_loop(lambda: server.engine.stats.finished.get("abort", 0))


def _assert_one_more_abort(server, before: int, timeout: float = 10) -> None:
    """Waits (up to `timeout`) for the abort count to move past `before`; it must be before + 1."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _aborts(server) == before:
        time.sleep(0.02)
    assert _aborts(server) == before + 1


def test_client_disconnect_mid_stream_frees_blocks(server):
    def blocks_in_use() -> int:
        return server.on_loop(lambda: server.engine.scheduler.pool.num_used_blocks)

    before_aborts = _aborts(server)
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        with http.stream("POST", "/v1/completions", json={"prompt": "Keep talking", "max_tokens": 400,
                                                           "temperature": 0, "stream": True,
                                                           "ignore_eos": True}) as response:
            lines = response.iter_lines()
            for _ in range(6):
                next(lines)
            assert blocks_in_use() > 0
    # Connection closed without reading the rest: the request is aborted and its blocks freed.
    _assert_one_more_abort(server, before_aborts)
    server.wait_idle()


def test_client_disconnect_during_non_streaming_generation_aborts(server):
    """The client hangs up once its generation runs. (A client timeout of 0.3 s raced the
    generation: back-to-back decode steps finish 500 tokens of the demo model within it.)"""
    before = _aborts(server)
    body = json.dumps({"prompt": "Long answer", "max_tokens": 500, "temperature": 0, "ignore_eos": True}).encode()
    host, port = server.base_url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.monotonic() + 10
        while not server.on_loop(lambda: server.engine.scheduler.num_running) and time.monotonic() < deadline:
            time.sleep(0.001)
        assert server.on_loop(lambda: server.engine.scheduler.num_running), "the generation never ran"
    _assert_one_more_abort(server, before)
    server.wait_idle()


def test_long_stop_strings_do_not_slow_other_requests(server):
    """Stop strings are matched as the text arrives, at a cost per character: searching the
    whole text and testing its suffixes against every stop string for each token grew with
    both lengths, on the event loop, and one request carrying sixteen 3,500-character stop
    strings slowed every other request's decode steps over tenfold. Measured against the same
    stream without stop strings, so that sharing steps with a stream is not counted."""
    rng = random.Random(5)
    stops = ["".join(rng.choice("QXZJKV") for _ in range(3500)) for _ in range(16)]  # never generated whole
    tokenizer = server.served.tokenizer
    longest = max(range(3, tokenizer.vocab_size), key=lambda t: len(tokenizer.decode([t])))  # the text grows fast
    other = {"prompt": "Another user's request", "max_tokens": 60, "temperature": 0, "ignore_eos": True}

    def other_beside_a_stream(http: httpx.Client, stop: list[str]) -> float:
        body = {"prompt": "Keep talking", "max_tokens": 480, "ignore_eos": True, "stream": True, "stop": stop,
                "allowed_token_ids": [longest]}
        with http.stream("POST", "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            for _ in range(2 * 200):  # 200 tokens (an event and a blank line each)
                next(lines)
            times = []
            for _ in range(3):  # the least of three: a host's passing stall is not the stop strings'
                began = time.monotonic()
                assert http.post("/v1/completions", json=other).status_code == 200
                times.append(time.monotonic() - began)
            return min(times)

    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        plain = other_beside_a_stream(http, [])
        beside = other_beside_a_stream(http, stops)
    assert beside < 3 * plain + 0.1, (plain, beside)
    server.wait_idle()


# A template as slow per message as a real one is on thousands (Qwen3's: ~13 us a message).
SLOW_TEMPLATE = ("{% set ns = namespace(n=0) %}{% for message in messages %}"
                 "{% for i in range(4000) %}{% set ns.n = ns.n + i %}{% endfor %}"
                 "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
                 "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def test_a_long_chat_render_does_not_stall_other_streams(demo_model, tmp_path):
    """Rendering a long conversation ran on the event loop: every other stream (and /health)
    stopped for the whole render."""
    from prelude.contract.config import Config
    from tests.server.harness import ServerThread

    for item in demo_model.iterdir():
        (tmp_path / item.name).symlink_to(item)
    (tmp_path / "chat_template.jinja").write_text(SLOW_TEMPLATE)
    with ServerThread(Config(model=str(tmp_path), num_kv_blocks=512)) as srv:
        gaps: list[float] = []
        with httpx.Client(base_url=srv.base_url, timeout=60) as http:
            with http.stream("POST", "/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3000, "ignore_eos": True,
                    "stream": True}) as response:
                lines = response.iter_lines()
                for _ in range(5):
                    next(lines)
                long_chat = {"messages": [{"role": "user", "content": "x"}] * 120, "max_tokens": 1}
                pool = ThreadPoolExecutor(1)
                slow = pool.submit(httpx.post, srv.base_url + "/v1/chat/completions", json=long_chat, timeout=60)
                began = last = time.monotonic()
                for line in lines:
                    now = time.monotonic()
                    gaps.append(now - last)
                    last = now
                    if slow.done() or now - began > 20:
                        break
                assert slow.result(timeout=60).status_code == 200
                pool.shutdown()
        assert max(gaps) < 0.5, f"a stream stalled {max(gaps):.2f}s while another request's chat rendered"
        srv.wait_idle()
