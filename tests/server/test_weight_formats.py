"""A user's `--quantization int8` and `--dtype bfloat16` on the CPU, over HTTP on the demo model:
the server says what it stores, answers generation and embeddings, and its
embeddings stay within the stated cosine of the fp32 server's (tests/model/test_weight_formats.py
states the tolerances)."""
from __future__ import annotations

import httpx
import pytest
import torch

from bench.serving.core.server import ServerProcess, prelude_env

TEXTS = ["the cat sat on the mat", "a quiet river runs to the sea"]


def _answers(demo_model, *flags: str) -> tuple[str, list[list[float]], dict]:
    with ServerProcess(["--model", str(demo_model), "--num-kv-blocks", "64", *flags], env=prelude_env()) as server:
        completion = httpx.post(server.base_url + "/v1/completions", timeout=60,
                                json={"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0})
        assert completion.status_code == 200, completion.text
        embeddings = httpx.post(server.base_url + "/v1/embeddings", json={"input": TEXTS}, timeout=60)
        assert embeddings.status_code == 200, embeddings.text
        log = server.log_path.read_text()
    return log, [item["embedding"] for item in embeddings.json()["data"]], completion.json()


@pytest.mark.parametrize("flags, stored, cosine", [(("--quantization", "int8"), "int8", 0.998),
                                                   (("--dtype", "bfloat16"), "bfloat16", 0.9999)])
def test_narrow_weights_serve_every_endpoint_close_to_fp32(demo_model, flags, stored, cosine):
    _, reference, _ = _answers(demo_model)
    log, embeddings, completion = _answers(demo_model, *flags)
    assert f"weights stored {stored}" in log
    assert completion["usage"]["completion_tokens"] == 6
    similarity = torch.nn.functional.cosine_similarity(torch.tensor(embeddings), torch.tensor(reference), dim=-1)
    assert similarity.min() >= cosine

