"""The OpenAI-compatible endpoints through the real `openai` client over loopback HTTP."""
from __future__ import annotations

import httpx
import openai
import pytest

@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def test_health_and_models(server, client):
    assert httpx.get(server.base_url + "/health").status_code == 200
    models = client.models.list().data
    assert [m.id for m in models] == [server.served.name]
    # vLLM's fields: created when the model was loaded (it said 0, shown as 1970), and parent
    assert models[0].created > 1_700_000_000 and models[0].model_extra["parent"] is None
    assert client.models.retrieve(server.served.name) == models[0]
    with pytest.raises(openai.NotFoundError) as missing:  # OpenAI's error (it was the router's "Not Found")
        client.models.retrieve("another-model")
    assert missing.value.body["code"] == "model_not_found" and "another-model" in missing.value.body["message"]
    # An empty name is the served model, as vLLM reads it (clients that leave the field blank)
    answer = client.completions.create(model="", prompt="hi", max_tokens=1)
    assert answer.model == server.served.name
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="another-model", prompt="hi", max_tokens=1)


def test_several_served_names_are_each_a_model_clients_may_send(demo_model):
    """vLLM's --served-model-name takes several names: clients may send any, answers name the
    first. Prelude's took one, and a launch script passing aliases did not start."""
    from prelude.app.cli import parse_args
    from tests.server.harness import ServerThread

    config = parse_args(["--model", str(demo_model), "--served-model-name", "judge", "org/judge-v2"])
    assert (config.model_name, config.served_model_aliases) == ("judge", ("org/judge-v2",))
    with ServerThread(config) as srv, openai.OpenAI(base_url=srv.base_url + "/v1", api_key="-") as client:
        assert [m.id for m in client.models.list().data] == ["judge", "org/judge-v2"]
        assert client.models.retrieve("org/judge-v2").id == "org/judge-v2"
        out = client.completions.create(model="org/judge-v2", prompt="hi", max_tokens=2)
        assert out.model == "judge"


def test_a_model_path_given_with_a_trailing_slash_is_a_name_clients_may_send(demo_model):
    """vLLM names the model by --model as typed: a client sending "dir/" back got 404 here."""
    from prelude.app.cli import parse_args
    from tests.server.harness import ServerThread

    with ServerThread(parse_args(["--model", f"{demo_model}/"])) as srv:
        for name in (f"{demo_model}/", str(demo_model)):
            answer = httpx.post(srv.base_url + "/v1/completions", json={"model": name, "prompt": "hi", "max_tokens": 1})
            assert answer.status_code == 200, answer.text


def test_completion_greedy_is_deterministic_and_counts_usage(client, model):
    a = client.completions.create(model=model, prompt="The judge says", max_tokens=8, temperature=0)
    b = client.completions.create(model=model, prompt="The judge says", max_tokens=8, temperature=0)
    assert a.choices[0].text == b.choices[0].text and a.choices[0].text
    assert a.choices[0].finish_reason == "length"
    assert a.usage.completion_tokens == 8
    assert a.usage.total_tokens == a.usage.prompt_tokens + 8
    assert a.object == "text_completion"


def test_prompt_forms_string_list_and_token_ids(client, model, server):
    ids = server.served.tokenizer.encode("The judge says")
    by_text = client.completions.create(model=model, prompt="The judge says", max_tokens=4, temperature=0)
    by_ids = client.completions.create(model=model, prompt=ids, max_tokens=4, temperature=0)
    batch = client.completions.create(model=model, prompt=["The judge says", "Another prompt"],
                                      max_tokens=4, temperature=0)
    many_ids = client.completions.create(model=model, prompt=[ids, ids[:2]], max_tokens=4, temperature=0)
    assert by_text.choices[0].text == by_ids.choices[0].text == batch.choices[0].text
    assert [c.index for c in batch.choices] == [0, 1]
    assert many_ids.choices[0].text == by_text.choices[0].text and len(many_ids.choices) == 2


def test_seeded_sampling_reproducible_and_seed_dependent(client, model):
    kw = dict(model=model, prompt="Once", max_tokens=12, temperature=1.0, top_p=0.95)
    a = client.completions.create(seed=11, **kw).choices[0].text
    b = client.completions.create(seed=11, **kw).choices[0].text
    c = client.completions.create(seed=12, **kw).choices[0].text
    assert a == b
    assert a != c


def test_top_k_one_equals_greedy(client, model):
    greedy = client.completions.create(model=model, prompt="Once", max_tokens=6, temperature=0)
    top1 = client.completions.create(model=model, prompt="Once", max_tokens=6, temperature=0.9,
                                     extra_body={"top_k": 1})
    assert greedy.choices[0].text == top1.choices[0].text


def test_streaming_completion_concatenates_to_the_full_text(client, model):
    full = client.completions.create(model=model, prompt="Stream this", max_tokens=10, temperature=0)
    chunks = list(client.completions.create(model=model, prompt="Stream this", max_tokens=10,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_stream_usage_chunk_when_asked(client, model):
    chunks = list(client.completions.create(model=model, prompt="Usage", max_tokens=3, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens == 3 and chunks[-1].choices == []


def test_stop_string_cuts_text_and_reports_it(client, model):
    full = client.completions.create(model=model, prompt="The judge says", max_tokens=16, temperature=0)
    text = full.choices[0].text
    stop = text[3:6]
    cut = client.completions.create(model=model, prompt="The judge says", max_tokens=16, temperature=0, stop=[stop])
    assert cut.choices[0].text == text[:text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = list(client.completions.create(model=model, prompt="The judge says", max_tokens=16,
                                              temperature=0, stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == cut.choices[0].text


def test_logprobs_of_generated_tokens(client, model):
    out = client.completions.create(model=model, prompt="Once upon", max_tokens=3, temperature=0, logprobs=2)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == 3 and len(lp.token_logprobs) == 3
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert logprob <= 0 and len(top) == 2
        assert max(top.values()) == pytest.approx(logprob, abs=1e-5)  # greedy took the best
    assert "".join(lp.tokens) == out.choices[0].text


def test_legacy_top_logprobs_carry_the_chosen_token(client, model):
    """OpenAI's legacy logprobs (and vLLM's) always list the chosen token among top_logprobs,
    so up to logprobs + 1 entries: clients read top_logprobs[i][tokens[i]]. Sampled tokens are
    often not the most likely, and logprobs=0 asks for the chosen token's alone."""
    for logprobs in (0, 1):
        out = client.completions.create(model=model, prompt="Once upon", max_tokens=8, temperature=1.5,
                                        seed=3, logprobs=logprobs, echo=True)
        lp = out.choices[0].logprobs
        for token, logprob, top in zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:]):
            assert top[token] == pytest.approx(logprob) and logprobs <= len(top) <= logprobs + 1
        streamed = client.completions.create(model=model, prompt="Once upon", max_tokens=8, temperature=1.5,
                                             seed=3, logprobs=logprobs, stream=True)
        tops = [top for c in streamed if c.choices and c.choices[0].logprobs
                for top in c.choices[0].logprobs.top_logprobs]
        assert tops == lp.top_logprobs[-8:]


def test_n_choices(client, model):
    out = client.completions.create(model=model, prompt="Pick", max_tokens=4, n=3, temperature=1.0, seed=5)
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert len({c.text for c in out.choices}) > 1


def test_echo_returns_prompt_then_completion(client, model):
    out = client.completions.create(model=model, prompt="Echo me", max_tokens=2, temperature=0, echo=True)
    plain = client.completions.create(model=model, prompt="Echo me", max_tokens=2, temperature=0)
    assert out.choices[0].text.startswith("Echo me")
    assert out.choices[0].text == "Echo me" + plain.choices[0].text


def test_chat_completion_and_stream(client, model):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello?"}]
    full = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0)
    assert full.choices[0].message.role == "assistant"
    assert full.object == "chat.completion" and full.usage.completion_tokens == 8
    chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=8,
                                                 temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == full.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_uses_the_template(client, model, server):
    messages = [{"role": "user", "content": "Hi"}]
    out = client.chat.completions.create(model=model, messages=messages, max_tokens=1, temperature=0)
    rendered = server.served.chat_template.render(messages)
    assert out.usage.prompt_tokens == len(server.served.tokenizer.encode(rendered, add_special_tokens=False))
    parts = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        max_tokens=1, temperature=0)
    assert parts.usage.prompt_tokens == out.usage.prompt_tokens


def test_chat_logprobs(client, model):
    out = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}],
                                         max_tokens=2, temperature=0, logprobs=True, top_logprobs=3)
    content = out.choices[0].logprobs.content
    assert len(content) == 2 and all(len(c.top_logprobs) == 3 for c in content)


def test_one_token_generation_runs_oneshot(client, model, server):
    before = server.on_loop(lambda: server.engine.scheduler.stats.num_oneshot_rows)
    out = client.completions.create(model=model, prompt="Classify: yes or no?", max_tokens=1, temperature=0)
    assert out.choices[0].finish_reason in ("length", "stop")
    assert server.on_loop(lambda: server.engine.scheduler.stats.num_oneshot_rows) == before + 1


def test_metrics_exposes_vllm_names(server, client, model):
    client.completions.create(model=model, prompt="metrics", max_tokens=2, temperature=0)
    text = httpx.get(server.base_url + "/metrics").text
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                 "prefix_cache_queries_total", "prefix_cache_hits_total", "time_to_first_token_seconds_bucket",
                 "e2e_request_latency_seconds_count", "request_queue_time_seconds_sum"):
        assert f"prelude:{name}" in text


def test_tokenize_and_detokenize(server):
    ids = httpx.post(server.base_url + "/tokenize", json={"prompt": "Hello world"}).json()["tokens"]
    assert ids == server.served.tokenizer.encode("Hello world")
    text = httpx.post(server.base_url + "/detokenize", json={"tokens": ids}).json()["prompt"]
    assert text == "Hello world"
    # Long lists are checked and decoded in the tokenizer pool: the same answer.
    many = ids * 2500
    assert httpx.post(server.base_url + "/detokenize", json={"tokens": many}).json()["prompt"] == "Hello world" * 2500
    bad = httpx.post(server.base_url + "/detokenize", json={"tokens": many + [-1]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    # vLLM's answers: no tokens decode to "" (it was a 400), and return_token_strs names each id
    assert httpx.post(server.base_url + "/detokenize", json={"tokens": []}).json() == {"prompt": ""}
    named = httpx.post(server.base_url + "/tokenize", json={"prompt": "Hello world", "return_token_strs": True})
    assert named.json()["token_strs"] == [server.served.tokenizer.id_to_token(i) for i in ids]
    assert all(isinstance(s, str) for s in named.json()["token_strs"])


def test_x_request_id_is_echoed_and_names_the_response(server):
    import httpx

    headers = {"X-Request-Id": "trace-42"}
    body = {"prompt": "hi", "max_tokens": 2}
    response = httpx.post(server.base_url + "/v1/completions", json=body, headers=headers)
    assert response.headers["x-request-id"] == "trace-42" and response.json()["id"] == "cmpl-trace-42"
    embedded = httpx.post(server.base_url + "/v1/score", headers=headers,
                          json={"query": "q", "items": ["a"], "label_token_ids": [5]})
    assert embedded.status_code == 200 and embedded.headers["x-request-id"] == "trace-42"
    unnamed = httpx.post(server.base_url + "/v1/completions", json=body)
    assert "x-request-id" not in unnamed.headers and unnamed.json()["id"].startswith("cmpl-")


def test_a_reused_x_request_id_in_flight_serves_both_requests(server):
    """A retry sent while the first attempt still runs reuses its X-Request-Id (client-side
    timeouts, proxies): it was a 400. Both are served under the caller's id, and the first one's
    disconnect ends only the first (the engine keys requests by its own id, as vLLM does)."""
    import asyncio
    import json

    headers = {"X-Request-Id": "retry-7"}
    body = {"prompt": "Once upon a time", "max_tokens": 300, "ignore_eos": True, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}

    async def events(response: httpx.Response) -> list[dict]:
        return [json.loads(line[6:]) async for line in response.aiter_lines()
                if line.startswith("data: {")]

    async def go() -> tuple[list[dict], httpx.Response]:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
            async with client.stream("POST", "/v1/completions", json=body, headers=headers) as first:
                assert first.status_code == 200 and first.headers["x-request-id"] == "retry-7"
                await first.aiter_lines().__anext__()  # under way
                async with client.stream("POST", "/v1/completions", json=body, headers=headers) as retry:
                    assert retry.status_code == 200 and retry.headers["x-request-id"] == "retry-7"
                    await first.aclose()  # the first attempt's client goes away mid-stream
                    retried = await events(retry)
            plain = await client.post("/v1/completions", headers=headers,
                                      json={"prompt": "hi", "max_tokens": 2})
            return retried, plain

    aborted = server.engine.stats.finished.get("abort", 0)
    retried, plain = asyncio.run(go())
    assert {e["id"] for e in retried} == {"cmpl-retry-7"}
    assert retried[-2]["choices"][0]["finish_reason"] == "length"
    assert retried[-1]["usage"]["completion_tokens"] == 300  # the retry ran to its end
    assert plain.status_code == 200 and plain.json()["id"] == "cmpl-retry-7"
    assert server.engine.stats.finished.get("abort", 0) == aborted + 1  # the first attempt, alone
    server.wait_idle()


def test_one_token_answer_obeys_stop_strings(client, model):
    """A one-token completion (the OneShot path) ends at a stop string inside its token exactly as
    the same token does in a longer completion: text cut before it, finish_reason "stop"."""
    kw = dict(model=model, prompt="Once upon a time", temperature=0)
    token = client.completions.create(max_tokens=1, **kw).choices[0].text
    assert len(token) >= 2
    stop = token[1:]
    one = client.completions.create(max_tokens=1, stop=[stop], **kw).choices[0]
    two = client.completions.create(max_tokens=2, stop=[stop], **kw).choices[0]
    assert (one.text, one.finish_reason, one.stop_reason) == (token[:1], "stop", stop)
    assert (two.text, two.finish_reason) == (one.text, one.finish_reason)
    kept = client.completions.create(max_tokens=1, stop=[stop], extra_body={"include_stop_str_in_output": True},
                                     **kw).choices[0]
    assert (kept.text, kept.finish_reason) == (token, "stop")


def test_the_earliest_stop_string_ends_the_text(client, model):
    """Two stop strings in one token: the text ends before the one that comes first in it, not
    the one listed first (cut at that one, the text would still hold the other)."""
    kw = dict(model=model, prompt="Once upon a time", temperature=0)
    token = client.completions.create(max_tokens=1, **kw).choices[0].text
    assert len(token) >= 2
    for max_tokens in (1, 4):
        cut = client.completions.create(max_tokens=max_tokens, stop=[token[1:], token[:1]], **kw).choices[0]
        assert (cut.text, cut.finish_reason, cut.stop_reason) == ("", "stop", token[:1])


def test_streamed_echo_with_logprobs_adds_up_to_the_whole_answer(client, model):
    """Streamed, echo + logprobs give what the whole answer gives: the prompt's tokens (their
    logprobs) in the first chunk, and every token's text_offset into the echoed text."""
    kw = dict(model=model, prompt=["Echo me", "And me too"], temperature=0, echo=True, logprobs=1, n=2)
    for max_tokens in (0, 1, 4):
        whole = client.completions.create(max_tokens=max_tokens, **kw)
        chunks = list(client.completions.create(max_tokens=max_tokens, stream=True, **kw))
        for choice in whole.choices:
            mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == choice.index]
            assert "".join(c.text for c in mine) == choice.text
            streamed = [c.logprobs for c in mine if c.logprobs is not None]
            assert sum((lp.tokens for lp in streamed), []) == choice.logprobs.tokens
            assert sum((lp.text_offset for lp in streamed), []) == choice.logprobs.text_offset
            assert sum((lp.token_logprobs for lp in streamed), []) == pytest.approx(choice.logprobs.token_logprobs)


def test_chat_template_kwargs_override_the_request_fields_as_in_vllm(server):
    """vLLM clients turn the generation prompt off inside chat_template_kwargs; that was a 400
    naming a Python signature ("got multiple values for keyword argument")."""
    messages = [{"role": "user", "content": "hi"}]
    plain = httpx.post(server.base_url + "/tokenize", json={"messages": messages, "add_generation_prompt": False})
    inside = httpx.post(server.base_url + "/tokenize", json={
        "messages": messages, "chat_template_kwargs": {"add_generation_prompt": False}})
    assert inside.status_code == 200, inside.text
    assert inside.json()["tokens"] == plain.json()["tokens"]
    chat = httpx.post(server.base_url + "/v1/chat/completions", json={
        "messages": messages, "max_tokens": 1, "chat_template_kwargs": {"add_generation_prompt": False}})
    assert chat.status_code == 200 and chat.json()["usage"]["prompt_tokens"] == plain.json()["count"]
