"""Other servers' client shapes over real HTTP: Cohere v2 through the real `cohere` SDK's
ClientV2, TEI's /embed, /rerank (with `texts`) and /predict, and vLLM's truncate_prompt_tokens
(with its pooling `truncation_side`). Each gives the same numbers as the server's own endpoints."""
from __future__ import annotations

import base64
import struct

import httpx
import pytest

from prelude.contract.config import Config
from tests.server import test_decision_api
from tests.server.harness import ServerThread
from tests.server.test_decision_api import LABELS, post

# test_decision_api's module-scoped fixtures, found by pytest under these names.
lm, classifier, reward = test_decision_api.lm, test_decision_api.classifier, test_decision_api.reward

TEXTS = ["a paged KV cache", "the weather is nice today", "blocks of sixteen tokens"]

# Two requests for the same text may compute it on different kernels (the second finds its
# tokens in the prefix cache and computes fewer rows: bf16x3's tiles against its stream where the
# CPU has AMX, ~1e-6 apart), so their outputs are compared to this.
REPEAT_ABS = 1e-5


def test_cohere_v2_client_embeds_and_reranks(lm):
    cohere = pytest.importorskip("cohere")
    srv, _ = lm
    with cohere.ClientV2(api_key="unused", base_url=srv.base_url) as client:
        out = client.embed(model=srv.served.name, texts=TEXTS, input_type="search_document",
                           embedding_types=["float", "int8", "ubinary"])
        ranked = client.rerank(model=srv.served.name, query="what is a KV cache?", documents=TEXTS, top_n=2)
    ours = post(srv, "/v1/embeddings", input=TEXTS).json()["data"]
    for got, want in zip(out.embeddings.float_, ours):
        assert got == pytest.approx(want["embedding"], abs=REPEAT_ABS)
    assert len(out.embeddings.int8[0]) == len(ours[0]["embedding"])
    assert len(out.embeddings.ubinary[0]) == -(-len(ours[0]["embedding"]) // 8)
    assert out.meta.billed_units.input_tokens > 0
    reference = post(srv, "/v1/rerank", query="what is a KV cache?", documents=TEXTS, top_n=2).json()["results"]
    assert [r.index for r in ranked.results] == [r["index"] for r in reference]
    assert ranked.results[0].relevance_score == pytest.approx(reference[0]["relevance_score"], abs=REPEAT_ABS)


def test_cohere_v2_truncation_and_dimensions(lm):
    srv, _ = lm
    long_text = "word " * 600
    cut = post(srv, "/v2/embed", texts=[long_text], input_type="search_query", max_tokens=16, truncate="END")
    assert cut.status_code == 200 and cut.json()["meta"]["billed_units"]["input_tokens"] == 16
    small = post(srv, "/v2/embed", texts=["hi"], input_type="search_query", output_dimension=8).json()
    vector = small["embeddings"]["float"][0]
    assert len(vector) == 8 and sum(v * v for v in vector) == pytest.approx(1.0, abs=1e-5)
    both = post(srv, "/v2/embed", texts=["hi"], input_type="search_query", output_dimension=8,
                embedding_types=["float", "base64"]).json()["embeddings"]
    assert list(struct.unpack("<8f", base64.b64decode(both["base64"][0]))) == both["float"][0] == vector
    assert post(srv, "/v2/rerank", query="q", documents=["a " * 100], max_tokens_per_doc=4).status_code == 200
    # truncate NONE cuts nothing, max_tokens included: an input past it is a 400 (it was cut
    # to max_tokens, as END does).
    refused = post(srv, "/v2/embed", texts=[long_text], input_type="search_query", max_tokens=16, truncate="NONE")
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_tokens"
    within = post(srv, "/v2/embed", texts=["hi"], input_type="search_query", max_tokens=16, truncate="NONE")
    assert within.status_code == 200


def test_cohere_v2_images_and_mixed_inputs_are_refused_not_dropped(lm):
    """Cohere v2 also embeds images and mixed `inputs`; this server embeds text alone, so those
    are a 400 naming the field (they were dropped: texts and images got only the texts' vectors)."""
    srv, _ = lm
    image = "data:image/png;base64,iVBORw0KGgo="
    inputs = [{"content": [{"type": "text", "text": "hi"}]}]
    for field, value in (("images", [image]), ("inputs", inputs)):
        refused = post(srv, "/v2/embed", texts=["hi"], input_type="image", embedding_types=["float"], **{field: value})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == field
    assert post(srv, "/v2/embed", texts=["hi"], input_type="search_query").status_code == 200
    # an input_type Cohere does not know is a 400, as Cohere answers it (a typo was accepted)
    typo = post(srv, "/v2/embed", texts=["hi"], input_type="search_querry")
    assert typo.status_code == 400 and typo.json()["error"]["param"] == "input_type"


def test_tei_embed_rerank_and_truncate(lm):
    srv, _ = lm
    vectors = httpx.post(srv.base_url + "/embed", json={"inputs": TEXTS}).json()
    ours = post(srv, "/v1/embeddings", input=TEXTS).json()["data"]
    assert [v == pytest.approx(o["embedding"], abs=REPEAT_ABS) for v, o in zip(vectors, ours)] == [True] * 3
    too_long = {"inputs": "word " * 5000}
    assert httpx.post(srv.base_url + "/embed", json=too_long).status_code == 400
    assert httpx.post(srv.base_url + "/embed", json={**too_long, "truncate": True}).status_code == 200
    ranked = httpx.post(srv.base_url + "/rerank", json={"query": "KV cache?", "texts": TEXTS,
                                                        "return_text": True}).json()
    assert [r["text"] for r in ranked] == [TEXTS[r["index"]] for r in ranked]
    assert ranked == sorted(ranked, key=lambda r: -r["score"])


def test_tei_inference_route_and_info_follow_the_model_type(lm, classifier, reward):
    """TEI's POST / (where huggingface_hub's InferenceClient posts) and SageMaker's /invocations
    answer as /embed, /predict or /rerank by the model, as TEI routes them; they were 404s."""
    for route in ("/", "/invocations"):
        srv, _ = lm
        vectors = httpx.post(srv.base_url + route, json={"inputs": TEXTS}).json()
        embedded = httpx.post(srv.base_url + "/embed", json={"inputs": TEXTS}).json()
        assert [v == pytest.approx(e, abs=REPEAT_ABS) for v, e in zip(vectors, embedded)] == [True] * 3
        srv, _ = classifier
        assert httpx.post(srv.base_url + route, json={"inputs": "great movie"}).json()[0]["label"] in LABELS.values()
        srv, _ = reward  # one label: a reranker
        ranked = httpx.post(srv.base_url + route, json={"query": "KV cache?", "texts": TEXTS}).json()
        assert sorted(r["index"] for r in ranked) == [0, 1, 2]
    kinds = []
    for srv, _ in (lm, classifier, reward):
        info = httpx.get(srv.base_url + "/info").json()
        assert info["model_id"] == srv.served.name and info["max_input_length"] == srv.served.max_model_len
        kinds.append(next(iter(info["model_type"])))
    assert kinds == ["embedding", "classifier", "reranker"]
    assert httpx.get(classifier[0].base_url + "/info").json()["model_type"]["classifier"]["id2label"] == \
        {str(i): label for i, label in LABELS.items()}


def test_tei_rerank_raw_scores_are_the_logits_behind_the_scores(lm, reward):
    """raw_scores: the logit each probability came from (the reward head's own logit, the judge
    prompt's log-odds of yes), computed from the logits: the probability's log-odds, rounded to
    1.0 for a confident pair, read +103.6 whatever the logit."""
    import math

    for srv, _ in (lm, reward):
        body = {"query": "KV cache?", "texts": TEXTS}
        scores = {r["index"]: r["score"] for r in httpx.post(srv.base_url + "/rerank", json=body).json()}
        raw = {r["index"]: r["score"] for r in httpx.post(srv.base_url + "/rerank",
                                                          json={**body, "raw_scores": True}).json()}
        assert {i: 1 / (1 + math.exp(-x)) for i, x in raw.items()} == pytest.approx(scores, abs=REPEAT_ABS)


def test_tei_predict_single_pair_and_batch(classifier):
    srv, _ = classifier
    single = httpx.post(srv.base_url + "/predict", json={"inputs": "great movie"}).json()
    assert {a["label"] for a in single} == set(LABELS.values()) and sum(a["score"] for a in single) == pytest.approx(1)
    ours = post(srv, "/classify", input=["great movie"]).json()["data"][0]
    assert max(a["score"] for a in single) == pytest.approx(max(ours["probs"]), abs=REPEAT_ABS)
    batch = httpx.post(srv.base_url + "/predict", json={"inputs": [["q", "doc"], "text"]}).json()
    assert len(batch) == 2 and all(len(answer) == len(LABELS) for answer in batch)
    # TEI's README batches one-text arrays: [["I like you."], ["I hate pineapples"]] (it was a 400)
    listed = httpx.post(srv.base_url + "/predict", json={"inputs": [["great movie"], ["q", "doc"]]}).json()
    for got, want in ((listed[0], single), (listed[1], batch[0])):
        assert {a["label"]: a["score"] for a in got} == \
            pytest.approx({a["label"]: a["score"] for a in want}, abs=REPEAT_ABS)


@pytest.mark.parametrize(("side", "kept"),
                         [(None, slice(None, 8)), ("right", slice(None, 8)), ("left", slice(-8, None))])
def test_vllm_truncate_prompt_tokens_keeps_the_first_tokens_of_a_pooling_input(lm, side, kept):
    # vLLM 0.32's pooling runner keeps the first k tokens unless `truncation_side` says "left"
    # (a generation prompt keeps its last k); keeping the last k, an embedding of a long
    # document was of its end, unlike vLLM's and every embedding server's.
    srv, _ = lm
    ids = list(range(10, 60))
    cut = post(srv, "/v1/embeddings", input=[ids], truncate_prompt_tokens=8,
               **({} if side is None else {"truncation_side": side})).json()
    whole = post(srv, "/v1/embeddings", input=[ids[kept]]).json()
    assert cut["data"][0]["embedding"] == pytest.approx(whole["data"][0]["embedding"], abs=REPEAT_ABS)
    assert cut["usage"]["prompt_tokens"] == 8


def test_tei_info_names_the_dtype_served(lm, demo_model):
    """TEI's model_dtype is what the weights are served in: it said the checkpoint's (bfloat16
    under --quantization int8, float32 for an fp32 encoder served in float16)."""
    assert httpx.get(lm[0].base_url + "/info").json()["model_dtype"] == "bfloat16"  # the demo's weights
    assert httpx.get(lm[0].base_url + "/server_info").json()["quantization"] is None
    with ServerThread(Config(model=str(demo_model), quantization="int8", num_kv_blocks=64)) as srv:
        assert httpx.get(srv.base_url + "/info").json()["model_dtype"] == "int8"
        server_info = httpx.get(srv.base_url + "/server_info").json()  # SGLang's, which names the mode too
        assert (server_info["dtype"], server_info["quantization"]) == ("int8", "int8")
