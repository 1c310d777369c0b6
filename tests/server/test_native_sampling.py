"""A CPU server of a model whose generation_config.json asks for sampling cuts and a penalty
(Qwen2.5's: temperature 0.7, top_p 0.8, top_k 20, repetition_penalty 1.05), which every request
that leaves them out gets, answers without torch: requests with cuts, min-p, seeds, penalties, a
logit bias, allowed ids (logprobs reported or not), a JSON schema or a choice, prompt logprobs or
/v1/score's labels never load it (the process never maps libtorch), and a seeded request gives
the same text twice."""
from __future__ import annotations

import json
import signal
import subprocess
import sys

import httpx
import pytest

from bench.serving.core.server import prelude_env
from kernels.cpu import ops as cpu_ops
from tests.checkpoints import edited_copy
from tests.server.test_sidecar import wait_ready

pytestmark = pytest.mark.skipif(not cpu_ops.built, reason="kernels.cpu is not built")

QWEN25_SAMPLING = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}
SCHEMA = {"type": "object", "properties": {"verdict": {"enum": ["yes", "no"]}}, "required": ["verdict"],
          "additionalProperties": False}


def _maps_torch(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as maps:
        return "libtorch" in maps.read()


def test_sampling_and_decision_heads_run_without_torch(demo_model, tmp_path):
    model = edited_copy(demo_model, tmp_path, "generation_config.json", lambda c: c.update(QWEN25_SAMPLING))
    path = str(tmp_path / "prelude.sock")
    proc = subprocess.Popen([sys.executable, "-m", "prelude", "--model", str(model), "--uds", path],
                            env=prelude_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=path), base_url="http://prelude", timeout=60) as http:
            wait_ready(http, path, proc)

            def texts(request_id: str = "cut", **fields) -> list[str]:
                response = http.post("/v1/completions", headers={"X-Request-Id": request_id},
                                     json={"prompt": "Once upon a time", "max_tokens": 6, "ignore_eos": True, **fields})
                assert response.status_code == 200, response.text
                return [choice["text"] for choice in response.json()["choices"]]

            texts(n=4)  # the model's defaults
            texts(temperature=1.2, min_p=0.05, top_k=50, logprobs=2)
            seeded = {"temperature": 1.0, "top_p": 0.9, "seed": 1234, "frequency_penalty": 0.5}
            assert texts(**seeded) == texts(**seeded)
            texts(logit_bias={"5": 2.0}, presence_penalty=0.3, allowed_token_ids=[5, 6, 7, 8])
            texts(prompt_logprobs=2, max_tokens=1)
            for softmax in (True, False):  # labels over themselves, then over the vocabulary
                response = http.post("/v1/score", headers={"X-Request-Id": "cut"},
                                     json={"query": "Is it good?", "items": ["yes it is", "no"],
                                           "label_token_ids": [5, 6], "apply_softmax": softmax})
                assert response.status_code == 200, response.text
            texts(allowed_token_ids=[5, 6], logprobs=1)
            answers = texts(structured_outputs={"json": SCHEMA}, max_tokens=12, ignore_eos=False, n=2)
            assert all(json.loads(a)["verdict"] in ("yes", "no") for a in answers)
            assert texts(structured_outputs={"choice": ["alpha", "beta"]}, ignore_eos=False)[0] in ("alpha", "beta")
            assert not _maps_torch(proc.pid)
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert sum("cut POST /v1/" in line and " 200 " in line for line in err.splitlines()) == 11, err
