"""vLLM's generation fields, tested for their effect: penalties (against the same penalties
applied by hand to transformers' logits), min_tokens, include_stop_str_in_output."""
from __future__ import annotations

import json

import pytest
import torch

from tests.server import test_decision_api
from tests.server.test_decision_api import ids_of, post

lm = test_decision_api.lm  # the module-scoped fixture, found by pytest under this name


def greedy_with_penalties(reference, prompt: list[int], n: int, presence: float, frequency: float,
                          repetition: float) -> list[int]:
    """vLLM's semantics: repetition on prompt + generated tokens, presence / frequency on generated."""
    ids, out = list(prompt), []
    for _ in range(n):
        with torch.no_grad():
            logits = reference(torch.tensor([ids])).logits[0, -1].float()
        seen = torch.tensor(sorted(set(ids)))
        values = logits[seen]
        logits[seen] = torch.where(values > 0, values / repetition, values * repetition)
        if out:
            counts = torch.bincount(torch.tensor(out), minlength=logits.shape[0]).float()
            logits -= frequency * counts + presence * (counts > 0).float()
        token = int(logits.argmax())
        out.append(token)
        ids.append(token)
    return out


@pytest.mark.parametrize("presence,frequency,repetition", [(0.0, 0.0, 1.8), (1.5, 0.0, 1.0), (0.0, 1.2, 1.0),
                                                          (0.5, 0.5, 1.3)])
def test_penalties_match_a_hand_computed_greedy_decode(lm, presence, frequency, repetition):
    srv, reference = lm
    prompt = ids_of(srv, "the the the cache cache holds blocks blocks")
    body = dict(prompt=prompt, max_tokens=6, temperature=0, ignore_eos=True, presence_penalty=presence,
                frequency_penalty=frequency, repetition_penalty=repetition)
    out = post(srv, "/v1/completions", **body).json()["choices"][0]
    want = greedy_with_penalties(reference, prompt, 6, presence, frequency, repetition)
    plain = post(srv, "/v1/completions", prompt=prompt, max_tokens=6, temperature=0, ignore_eos=True).json()
    assert out["text"] == srv.served.tokenizer.decode(want)
    assert out["text"] != plain["choices"][0]["text"]  # the penalty changed the answer


def test_min_tokens_blocks_the_stop_token_until_reached(lm):
    srv, _ = lm
    prompt = ids_of(srv, "Short")
    first = post(srv, "/v1/completions", prompt=prompt, max_tokens=1, temperature=0).json()
    stop_id = srv.served.tokenizer.encode(first["choices"][0]["text"], False)[0]
    stopped = post(srv, "/v1/completions", prompt=prompt, max_tokens=8, temperature=0, stop_token_ids=[stop_id])
    assert stopped.json()["usage"]["completion_tokens"] == 1
    held = post(srv, "/v1/completions", prompt=prompt, max_tokens=8, temperature=0, stop_token_ids=[stop_id],
                min_tokens=5).json()
    assert held["usage"]["completion_tokens"] >= 5


@pytest.mark.parametrize("stream", [False, True])
def test_min_tokens_holds_back_stop_strings_too(lm, stream):
    """As in vLLM, a stop string ends the answer only in the text of a token past min_tokens (it
    may start earlier): a stop string in the first tokens' text ended the answer short of
    min_tokens."""
    srv, _ = lm
    prompt = ids_of(srv, "Judge: is this answer relevant?")
    full = post(srv, "/v1/completions", prompt=prompt, max_tokens=12, temperature=0, ignore_eos=True,
                logprobs=0).json()["choices"][0]
    tokens = full["logprobs"]["tokens"]
    stop, min_tokens = tokens[1][-2:], 4
    assert full["text"].startswith("".join(tokens[:min_tokens]))
    boundary = len("".join(tokens[:min_tokens]))
    ends = [end for end in range(boundary + 1, len(full["text"]) + 1) if full["text"][:end].endswith(stop)]
    want = full["text"][:ends[0] - len(stop)] if ends else full["text"]
    body = dict(prompt=prompt, max_tokens=12, temperature=0, ignore_eos=True, stop=[stop], min_tokens=min_tokens)
    early = post(srv, "/v1/completions", **{**body, "min_tokens": 0}).json()["choices"][0]
    assert len(early["text"]) < boundary  # without min_tokens the stop string cuts inside the first tokens
    if stream:
        response = post(srv, "/v1/completions", **body, stream=True)
        events = [json.loads(line[6:]) for line in response.text.splitlines()
                  if line.startswith("data: {")]
        assert "".join(e["choices"][0]["text"] for e in events) == want
    else:
        held = post(srv, "/v1/completions", **body).json()["choices"][0]
        assert held["text"] == want and held["finish_reason"] == ("stop" if ends else "length")


def test_include_stop_str_in_output(lm):
    srv, _ = lm
    prompt = ids_of(srv, "Judge: is this answer relevant?")
    text = post(srv, "/v1/completions", prompt=prompt, max_tokens=12, temperature=0, ignore_eos=True).json()
    full = text["choices"][0]["text"]
    stop = full[3:5]
    cut = post(srv, "/v1/completions", prompt=prompt, max_tokens=12, temperature=0, ignore_eos=True,
               stop=[stop]).json()["choices"][0]
    kept = post(srv, "/v1/completions", prompt=prompt, max_tokens=12, temperature=0, ignore_eos=True,
                stop=[stop], include_stop_str_in_output=True).json()["choices"][0]
    assert kept["text"] == cut["text"] + stop and kept["finish_reason"] == "stop"


@pytest.mark.parametrize("max_tokens", [1, 8])  # the OneShot path and the decode path
def test_include_stop_str_in_output_keeps_a_stop_token(lm, max_tokens):
    """As in vLLM, a token of stop_token_ids that ends the answer is in its text only with
    include_stop_str_in_output (it was dropped either way), the stream's text included."""
    srv, _ = lm
    prompt = ids_of(srv, "Judge: is this answer relevant?")
    full = post(srv, "/v1/completions", prompt=prompt, max_tokens=3, temperature=0, ignore_eos=True).json()
    ids = srv.served.tokenizer.encode(full["choices"][0]["text"], False)
    stop_id = ids[0] if max_tokens == 1 else ids[1]
    body = dict(prompt=prompt, max_tokens=max_tokens, temperature=0, ignore_eos=True, stop_token_ids=[stop_id])
    cut = post(srv, "/v1/completions", **body).json()["choices"][0]
    kept = post(srv, "/v1/completions", include_stop_str_in_output=True, **body).json()["choices"][0]
    assert cut["stop_reason"] == kept["stop_reason"] == stop_id and kept["finish_reason"] == "stop"
    assert kept["text"] == cut["text"] + srv.served.tokenizer.decode([stop_id]) != cut["text"]
    streamed = post(srv, "/v1/completions", include_stop_str_in_output=True, stream=True, **body).text
    chunks = [json.loads(line[6:]) for line in streamed.splitlines() if line.startswith("data: {")]
    assert "".join(c["choices"][0]["text"] for c in chunks) == kept["text"]


def test_min_p_one_keeps_only_the_most_likely_token(lm):
    """min_p (vLLM's) was ignored as an unknown field: sampling at temperature 1 drew tokens it
    cuts. At 1.0 it keeps only the best token, so any seed samples the greedy answer."""
    srv, _ = lm
    prompt = ids_of(srv, "Judge: is this answer relevant?")
    greedy = post(srv, "/v1/completions", prompt=prompt, max_tokens=6, temperature=0).json()["choices"][0]["text"]
    for seed in range(4):
        sampled = post(srv, "/v1/completions", prompt=prompt, max_tokens=6, temperature=1.0, min_p=1.0,
                       seed=seed).json()
        assert sampled["choices"][0]["text"] == greedy, seed
    error = post(srv, "/v1/completions", prompt=prompt, max_tokens=1, min_p=1.5).json()["error"]
    assert error["param"] == "min_p"
