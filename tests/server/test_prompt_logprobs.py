"""vLLM's prompt_logprobs through the real `openai` client (extra_body) over loopback HTTP: refused
on a stream rather than dropped from it."""
from __future__ import annotations

import httpx
import openai
import pytest

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Is the sky green?"}]


@pytest.fixture(scope="module")
def model(server):
    return server.served.name


@pytest.mark.parametrize("prompt_logprobs", [0, 2])
def test_a_streamed_completion_refuses_prompt_logprobs(client, model, prompt_logprobs):
    """vLLM answers 400 (its stream chunks have no place for them); this stream dropped them and
    answered 200 as if it had them. 0 asks for the prompt tokens' own logprobs: refused too."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=model, prompt="The judge says", max_tokens=2, stream=True,
                                  extra_body={"prompt_logprobs": prompt_logprobs})
    error = refused.value.body
    assert error["param"] == "prompt_logprobs" and "stream" in error["message"], error
    # echo + logprobs computes prompt logprobs too, for the echoed tokens: a stream still gives those.
    chunks = list(client.completions.create(model=model, prompt="The judge says", max_tokens=2, stream=True,
                                            echo=True, logprobs=1))
    assert chunks[0].choices[0].logprobs.token_logprobs[0] is None  # the echoed first prompt token


def _by_id(entries: list) -> list:
    """prompt_logprobs entries as {token id: logprob}, for comparing two answers."""
    return [None if e is None else {t: v["logprob"] for t, v in e.items()} for e in entries]


@pytest.mark.parametrize("max_tokens,n", [(1, 1), (4, 2)])
def test_chat_prompt_logprobs_are_the_rendered_prompts(client, model, server, max_tokens, n):
    """Chat returns prompt_logprobs beside its choices (vLLM's ChatCompletionResponse field), one
    entry per token of the chat-templated prompt: the same as /v1/completions gives for those
    token ids. Chat ignored the field before."""
    chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=max_tokens, n=n,
                                          temperature=0, extra_body={"prompt_logprobs": 2})
    ids = httpx.post(server.base_url + "/tokenize", json={"messages": MESSAGES}).json()["tokens"]
    same = client.completions.create(model=model, prompt=ids, max_tokens=0, extra_body={"prompt_logprobs": 2})
    entries = chat.model_extra["prompt_logprobs"]
    assert len(entries) == len(ids) == chat.usage.prompt_tokens and len(chat.choices) == n
    expected = same.choices[0].model_extra["prompt_logprobs"]
    assert [None if e is None else set(e) for e in entries] == [None if e is None else set(e) for e in expected]
    for mine, theirs in zip(_by_id(entries[1:]), _by_id(expected[1:])):
        assert mine == pytest.approx(theirs, abs=1e-5)
    # Each real prompt token is there under its id, with its rank, and 2 alternatives besides.
    for token, entry in zip(ids[1:], entries[1:]):
        assert str(token) in entry and entry[str(token)]["rank"] >= 1 and len(entry) in (2, 3)
    assert "prompt_logprobs" not in client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=1).model_extra  # only when asked, as in completions


def test_chat_prompt_logprobs_are_checked_like_completions(client, model):
    for bad in (-1, 99):  # --max-logprobs is 20
        for create, kw in ((client.chat.completions.create, {"messages": MESSAGES}),
                           (client.completions.create, {"prompt": "Is the sky green?"})):
            with pytest.raises(openai.BadRequestError) as refused:
                create(model=model, max_tokens=1, extra_body={"prompt_logprobs": bad}, **kw)
            assert refused.value.body["param"] == "prompt_logprobs"
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=2, stream=True,
                                       extra_body={"prompt_logprobs": 1})
    assert refused.value.body["param"] == "prompt_logprobs" and "stream" in refused.value.body["message"]


def test_choices_share_their_prompts_logprobs(server, client, model):
    """With n > 1 every choice computed the whole prompt again for the same prompt_logprobs
    (they read every position, so no choice could reuse the cached prefix); now the first
    computes them and every choice carries them."""
    prompt = "A long enough judge prompt to span several blocks of the cache: is the answer relevant here?"
    alone = client.completions.create(model=model, prompt=prompt, max_tokens=1, temperature=0,
                                      extra_body={"prompt_logprobs": 1}).choices[0].model_extra["prompt_logprobs"]
    before = server.on_loop(lambda: server.engine.scheduler.stats.prefill_tokens)
    answer = client.completions.create(model=model, prompt=prompt, max_tokens=1, temperature=0, n=3,
                                       extra_body={"prompt_logprobs": 1})
    computed = server.on_loop(lambda: server.engine.scheduler.stats.prefill_tokens) - before
    shared = [c.model_extra["prompt_logprobs"] for c in answer.choices]
    assert shared[1] == shared[2] == shared[0] and len(shared[0]) == len(alone)
    for got, want in zip(shared[0][1:], alone[1:]):
        assert got.keys() == want.keys()
        assert all(abs(got[t]["logprob"] - want[t]["logprob"]) < 1e-4 for t in got)
    assert computed < 2 * answer.usage.prompt_tokens, computed


def test_echoed_prompt_tokens_carry_the_logprobs_asked_for(client, model):
    """With echo, `logprobs` (OpenAI's: the k most likely tokens at each position) sets the echoed
    prompt's entries too, as in vLLM, whatever prompt_logprobs asks for its own field: they
    carried prompt_logprobs' k (a client asking for 2 got 4)."""
    out = client.completions.create(model=model, prompt="The judge says yes", max_tokens=1, temperature=0,
                                    echo=True, logprobs=2, extra_body={"prompt_logprobs": 4})
    choice = out.model_dump()["choices"][0]
    tops = choice["logprobs"]["top_logprobs"]
    assert tops[0] is None and len(tops) == len(choice["prompt_logprobs"]) + 1  # the prompt's tokens, then one more
    for top, full, token in zip(tops[1:], choice["prompt_logprobs"][1:], choice["logprobs"]["tokens"][1:]):
        best = sorted(full.values(), key=lambda e: e["rank"])[:2]
        assert set(top.values()) == {e["logprob"] for e in best} | {top[token]}, (top, full)
        assert len(full) >= 4  # the prompt_logprobs field keeps its own 4 (and the token's own)
