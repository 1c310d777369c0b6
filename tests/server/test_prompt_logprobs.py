"""vLLM's prompt_logprobs through the real `openai` client (extra_body) over loopback HTTP: refused
on a stream rather than dropped from it."""
from __future__ import annotations

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
