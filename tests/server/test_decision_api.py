"""Decision-style endpoints over real HTTP, each compared with transformers on the same weights:
embeddings, classify, reward, pooling, score (pairs and label tokens), rerank, prompt logprobs,
restricted one-token choices."""
from __future__ import annotations

import base64
import math
import struct

import httpx
import pytest
import torch

from prelude.contract.config import Config
from tests.checkpoints import load_reference, make_model_dir
from tests.server.harness import ServerThread

LABELS = {0: "negative", 1: "neutral", 2: "positive"}
TEXTS = ["great product, would buy again", "terrible support", "it arrived on a Tuesday"]

# Two requests for the same text may compute it on different kernels (the second finds its
# tokens in the prefix cache and computes fewer rows: bf16x3's tiles against its stream where the
# CPU has AMX, ~1e-6 apart), so their outputs are compared to this.
REPEAT_ABS = 1e-5


def _serve(path, **config) -> ServerThread:
    """A server for `path`, started by its `with` block."""
    return ServerThread(Config(model=str(path), block_size=4, num_kv_blocks=2048, **config))


@pytest.fixture(scope="module")
def lm(server):
    """The demo causal LM (package fixture) and its transformers twin."""
    return server, load_reference(server.served.path)


@pytest.fixture(scope="module")
def classifier(demo_model, tmp_path_factory):
    pad = 0  # <|endoftext|> in the demo tokenizer
    path = make_model_dir(tmp_path_factory.mktemp("cls"), "qwen3", demo_model, head="ForSequenceClassification",
                          num_labels=3, id2label=LABELS, label2id={v: k for k, v in LABELS.items()},
                          pad_token_id=pad)
    with _serve(path) as srv:
        yield srv, load_reference(path)


@pytest.fixture(scope="module")
def reward(demo_model, tmp_path_factory):
    path = make_model_dir(tmp_path_factory.mktemp("rm"), "llama", demo_model, head="ForSequenceClassification",
                          num_labels=1, id2label={0: "LABEL_0"}, label2id={"LABEL_0": 0})
    with _serve(path) as srv:
        yield srv, load_reference(path)


def post(srv, path, **body):
    return httpx.post(srv.base_url + path, json=body, timeout=120)


def ids_of(srv, text, special=True):
    return srv.served.tokenizer.encode(text, special)


def hidden_states(reference, ids):
    with torch.no_grad():
        return reference.model(torch.tensor([ids])).last_hidden_state[0]


def lm_logprobs(reference, ids):
    with torch.no_grad():
        return torch.log_softmax(reference(torch.tensor([ids])).logits[0].float(), dim=-1)


# -- embeddings ----------------------------------------------------------------------------------
def test_embeddings_match_last_token_hidden_state(lm, client):
    srv, reference = lm
    out = client.embeddings.create(model=srv.served.name, input=TEXTS)
    assert [d.index for d in out.data] == [0, 1, 2]
    for text, item in zip(TEXTS, out.data):
        expected = torch.nn.functional.normalize(hidden_states(reference, ids_of(srv, text))[-1], dim=-1)
        torch.testing.assert_close(torch.tensor(item.embedding), expected, atol=1e-4, rtol=1e-4)
    assert out.usage.prompt_tokens == sum(len(ids_of(srv, t)) for t in TEXTS)


def test_embeddings_token_ids_base64_and_dimensions(lm):
    srv, _ = lm
    ids = ids_of(srv, TEXTS[0])
    floats = post(srv, "/v1/embeddings", input=[ids]).json()["data"][0]["embedding"]
    packed = post(srv, "/v1/embeddings", input=ids, encoding_format="base64").json()["data"][0]["embedding"]
    decoded = struct.unpack(f"<{len(floats)}f", base64.b64decode(packed))
    assert decoded == pytest.approx(floats, abs=REPEAT_ABS)
    short = post(srv, "/v1/embeddings", input=TEXTS[0], dimensions=8).json()["data"][0]["embedding"]
    truncated = torch.nn.functional.normalize(torch.tensor(floats[:8]), dim=-1)
    assert short == pytest.approx(truncated.tolist(), abs=1e-5)
    assert math.isclose(sum(v * v for v in short), 1.0, rel_tol=1e-5)
    # base64 packs the very floats the float format lists (float32, as vLLM's tensors): with
    # "dimensions" the renormalized vector was float64 in JSON and float32 in base64.
    for body in ({"input": TEXTS[0], "dimensions": 8}, {"input": TEXTS[0], "dimensions": 8, "normalize": False}):
        listed = post(srv, "/v1/embeddings", **body).json()["data"][0]["embedding"]
        packed = post(srv, "/v1/embeddings", encoding_format="base64", **body).json()["data"][0]["embedding"]
        assert list(struct.unpack(f"<{len(listed)}f", base64.b64decode(packed))) == listed


@pytest.mark.parametrize(("dtype", "endianness", "numpy_type", "abs_"),
                         [("float32", "big", ">f4", 0), ("float16", "native", "<f2", 1e-3),
                          ("float16", "big", ">f2", 1e-3), ("bfloat16", "little", "<u2", 1e-2)])
def test_base64_embeddings_take_vllms_embed_dtype_and_endianness(lm, dtype, endianness, numpy_type, abs_):
    """embed_dtype / endianness: a float16 client read the float32 bytes it got as twice as many
    wrong values."""
    import numpy as np

    srv, _ = lm
    listed = post(srv, "/v1/embeddings", input=TEXTS[0]).json()["data"][0]["embedding"]
    packed = post(srv, "/v1/embeddings", input=TEXTS[0], encoding_format="base64", embed_dtype=dtype,
                  endianness=endianness).json()["data"][0]["embedding"]
    values = np.frombuffer(base64.b64decode(packed), dtype=numpy_type)
    if dtype == "bfloat16":  # the top half of a float32
        values = (values.astype("<u4") << 16).view("<f4")
    assert values.tolist() == pytest.approx(listed, abs=abs_ or REPEAT_ABS)
    assert post(srv, "/v1/embeddings", input=TEXTS[0], encoding_format="base64", embed_dtype="int4").status_code == 400


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_embedding_pooling_modes(lm, pooling):
    demo, reference = lm  # the same demo weights: only the pooling differs
    with _serve(demo.served.path, pooling=pooling) as srv:
        ids = ids_of(srv, TEXTS[1])
        hidden = hidden_states(reference, ids)
        pooled = hidden.mean(0) if pooling == "mean" else hidden[0]
        got = post(srv, "/v1/embeddings", input=TEXTS[1]).json()["data"][0]["embedding"]
        torch.testing.assert_close(torch.tensor(got), torch.nn.functional.normalize(pooled, dim=-1),
                                   atol=1e-4, rtol=1e-4)


# -- classification, reward, pooling -------------------------------------------------------------
def test_classify_matches_sequence_classification_logits(classifier):
    srv, reference = classifier
    out = post(srv, "/classify", input=TEXTS).json()
    # vLLM's use_activation false (and its older name, activation): the logits themselves
    raw = post(srv, "/classify", input=TEXTS, use_activation=False).json()
    assert post(srv, "/classify", input=TEXTS, activation=False).json()["data"] == raw["data"]
    for text, item, raw_item in zip(TEXTS, out["data"], raw["data"]):
        with torch.no_grad():
            logits = reference(torch.tensor([ids_of(srv, text)])).logits[0]
        probs = torch.softmax(logits, dim=-1)
        assert item["probs"] == pytest.approx(probs.tolist(), abs=1e-5)
        assert item["label"] == LABELS[int(probs.argmax())] and item["num_classes"] == 3
        assert raw_item["probs"] == pytest.approx(logits.tolist(), abs=1e-5) and raw_item["label"] == item["label"]


def test_a_multi_label_classifier_scores_each_label_on_its_own(demo_model, tmp_path):
    """problem_type multi_label_classification: each label's sigmoid, as transformers' pipeline
    and vLLM give them (/classify and TEI's /predict); a softmax made the labels compete."""
    path = make_model_dir(tmp_path / "ml", "qwen3", demo_model, head="ForSequenceClassification", num_labels=3,
                          id2label=LABELS, label2id={v: k for k, v in LABELS.items()}, pad_token_id=0,
                          problem_type="multi_label_classification")
    reference = load_reference(path)
    with _serve(path) as srv:
        classified = post(srv, "/classify", input=TEXTS).json()["data"]
        predicted = post(srv, "/predict", inputs=TEXTS).json()
        for text, item, answer in zip(TEXTS, classified, predicted):
            with torch.no_grad():
                expected = torch.sigmoid(reference(torch.tensor([ids_of(srv, text)])).logits[0]).tolist()
            assert item["probs"] == pytest.approx(expected, abs=1e-5)
            assert item["label"] == LABELS[max(range(3), key=expected.__getitem__)]
            assert {LABELS[i]: p for i, p in enumerate(expected)} == \
                pytest.approx({a["label"]: a["score"] for a in answer}, abs=1e-5)


def test_classify_reads_the_last_non_pad_token(classifier):
    srv, reference = classifier
    ids = ids_of(srv, TEXTS[0])
    padded = ids + [0, 0]  # trailing pad tokens, as a padded batch would have
    with torch.no_grad():
        expected = torch.softmax(reference(torch.tensor([padded])).logits[0], dim=-1)
    got = post(srv, "/classify", input=[padded]).json()["data"][0]["probs"]
    assert got == pytest.approx(expected.tolist(), abs=1e-5)


def test_pooling_returns_raw_classifier_logits(classifier):
    srv, reference = classifier
    got = post(srv, "/pooling", input=TEXTS[2]).json()["data"][0]
    with torch.no_grad():
        expected = reference(torch.tensor([ids_of(srv, TEXTS[2])])).logits[0]
    assert got["object"] == "pooling" and got["data"] == pytest.approx(expected.tolist(), abs=1e-4)


def test_pooling_honours_encoding_format(lm):
    """vLLM's /pooling answers encoding_format "base64" with packed float32, as /v1/embeddings
    does: the field was ignored, and a base64 client got a list it could not decode."""
    srv, _ = lm
    floats = post(srv, "/pooling", input=TEXTS[:2]).json()["data"]
    packed = post(srv, "/pooling", input=TEXTS[:2], encoding_format="base64").json()["data"]
    for plain, item in zip(floats, packed):
        raw = base64.b64decode(item["data"])
        vector = struct.unpack(f"<{len(raw) // 4}f", raw)
        assert list(vector) == pytest.approx(plain["data"], rel=1e-5, abs=REPEAT_ABS)
    bad = post(srv, "/pooling", input="x", encoding_format="hex")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "encoding_format"
    # vLLM's `dimensions` on /pooling (ignored: the whole vector came back)
    for normalize in (False, True):
        cut = post(srv, "/pooling", input=TEXTS[0], dimensions=8, normalize=normalize).json()["data"][0]["data"]
        whole = torch.tensor(post(srv, "/pooling", input=TEXTS[0]).json()["data"][0]["data"][:8])
        want = torch.nn.functional.normalize(whole, dim=-1) if normalize else whole
        assert cut == pytest.approx(want.tolist(), abs=1e-5)


def test_reward_model_returns_the_scalar(reward):
    srv, reference = reward
    out = post(srv, "/classify", input=TEXTS).json()["data"]
    raw = post(srv, "/pooling", input=TEXTS).json()["data"]
    for text, item, pooled in zip(TEXTS, out, raw):
        with torch.no_grad():
            score = float(reference(torch.tensor([ids_of(srv, text)])).logits[0, 0])
        assert item["num_classes"] == 1 and item["score"] == pytest.approx(score, abs=1e-4)
        assert item["probs"] == pytest.approx([1 / (1 + math.exp(-score))], abs=1e-5)
        assert pooled["data"] == pytest.approx([score], abs=1e-4)


def test_cross_encoder_score_and_rerank(classifier):
    srv, reference = classifier
    query, docs = "which is positive?", TEXTS

    def expected(doc):
        ids = ids_of(srv, query) + ids_of(srv, doc, special=False)
        with torch.no_grad():
            return float(torch.softmax(reference(torch.tensor([ids])).logits[0], dim=-1)[1])

    scores = post(srv, "/v1/score", text_1=query, text_2=docs).json()["data"]
    assert [s["score"] for s in scores] == pytest.approx([expected(d) for d in docs], abs=1e-5)
    # use_activation false: the log-odds the probability came from (it was ignored)
    for path, body, key in (("/v1/score", {"text_1": query, "text_2": docs}, "data"),
                            ("/v1/rerank", {"query": query, "documents": docs}, "results")):
        answers = [post(srv, path, **body, **extra).json()[key] for extra in ({}, {"use_activation": False})]
        probability, logits = ({r["index"]: r.get("score", r.get("relevance_score")) for r in a} for a in answers)
        assert {i: 1 / (1 + math.exp(-x)) for i, x in logits.items()} == pytest.approx(probability, abs=1e-6)
    ranked = post(srv, "/v1/rerank", query=query, documents=docs, top_n=2).json()["results"]
    order = sorted(range(3), key=lambda i: -expected(docs[i]))[:2]
    assert [r["index"] for r in ranked] == order
    assert ranked[0]["document"]["text"] == docs[order[0]]



def test_score_takes_each_of_vllms_field_pairs(classifier):
    """vLLM's /score reads text_1/text_2, queries/documents (its documented form), queries/items
    and data_1/data_2 alike; queries/documents answered 400 "'query' is required"."""
    srv, _ = classifier
    query, docs = "which is positive?", TEXTS
    expected = [s["score"] for s in post(srv, "/score", text_1=query, text_2=docs).json()["data"]]
    for first, second in (("queries", "documents"), ("queries", "items"), ("data_1", "data_2")):
        for path in ("/score", "/v1/score"):
            response = post(srv, path, **{first: query, second: docs})
            assert response.status_code == 200, (first, second, response.text)
            assert [s["score"] for s in response.json()["data"]] == pytest.approx(expected, abs=REPEAT_ABS)
    pairs = post(srv, "/v1/score", queries=[query] * 3, documents=docs).json()["data"]  # N:N
    assert [s["score"] for s in pairs] == pytest.approx(expected, abs=REPEAT_ABS)
    uneven = post(srv, "/v1/score", queries=[query] * 2, documents=docs)
    assert uneven.status_code == 400 and uneven.json()["error"]["param"] == "documents"


# -- label-token scoring ---------------------------------------------------------------------
def test_label_token_scoring_matches_lm_logprobs_and_shares_the_query(lm):
    srv, reference = lm
    query = "Judge the answer. " * 6
    items = [" yes it is", " no", " maybe later", " certainly", " never again"]
    labels = [ids_of(srv, " yes", False)[0], ids_of(srv, " no", False)[0]]
    stats = srv.engine.scheduler.stats
    before = srv.on_loop(lambda: (stats.prefill_tokens, stats.num_deferrals))
    srv.on_loop(srv.engine.scheduler.pool.reset_prefix_cache)
    out = post(srv, "/v1/score", query=query, items=items, label_token_ids=labels, apply_softmax=False,
               multi_item=False).json()
    after = srv.on_loop(lambda: (stats.prefill_tokens, stats.num_deferrals))
    prompts = [ids_of(srv, query + item) for item in items]
    for prompt, scores in zip(prompts, out["scores"]):
        expected = lm_logprobs(reference, prompt)[-1, labels].exp()
        assert scores == pytest.approx(expected.tolist(), abs=1e-5)
    # One forward computes the shared query; the other rows compute only what follows its
    # last full shared block.
    bs = srv.config.block_size

    def shared_blocks(a, b):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return min(n, len(b) - 1) // bs

    expected_computed = len(prompts[0]) + sum(len(p) - shared_blocks(prompts[0], p) * bs for p in prompts[1:])
    assert after[0] - before[0] == expected_computed
    assert expected_computed < sum(map(len, prompts)) * 0.6
    assert after[1] - before[1] == len(items) - 1
    softmaxed = post(srv, "/v1/score", query=query, items=items, label_token_ids=labels,
                     apply_softmax=True).json()["scores"]
    for probs in softmaxed:
        assert sum(probs) == pytest.approx(1.0, abs=1e-6)


def test_label_scoring_with_token_ids_and_item_first(lm):
    srv, reference = lm
    query, item = ids_of(srv, "query text", False), ids_of(srv, "item", False)
    out = post(srv, "/score", query=query, items=[item], label_token_ids=[5, 6], item_first=True).json()
    expected = lm_logprobs(reference, item + query)[-1, [5, 6]].exp()
    assert out["scores"][0] == pytest.approx(expected.tolist(), abs=1e-5)


def test_generative_rerank_uses_yes_no_probability(lm):
    srv, reference = lm
    tok = srv.served.tokenizer
    yes, no = tok.token_to_id("yes"), tok.token_to_id("no")
    if yes is None or no is None:
        pytest.skip("demo vocabulary lacks single-token yes/no")
    from prelude.server.judge import JUDGE_SYSTEM, RERANK_INSTRUCTION

    docs = ["blocks and caches", "a recipe for soup"]
    out = post(srv, "/rerank", query="what is a KV cache?", documents=docs, return_documents=False).json()
    for result in out["results"]:
        # Through the model's own chat template (the demo's is plain ChatML without thinking).
        user = f"<Instruct>: {RERANK_INSTRUCTION}\n<Query>: what is a KV cache?\n<Document>: {docs[result['index']]}"
        text = (f"<|im_start|>system\n{JUDGE_SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
                "<|im_start|>assistant\n")
        lp = lm_logprobs(reference, tok.encode(text, False))[-1, [no, yes]]
        assert result["relevance_score"] == pytest.approx(float(torch.softmax(lp, 0)[1]), abs=1e-5)
        assert "document" not in result


def test_generative_rerank_cuts_a_long_document_to_truncate_prompt_tokens(lm):
    """vLLM's truncate_prompt_tokens: a judge prompt past it keeps its frame and query and cuts
    its document's end; the field was ignored, and a document past the context failed the whole
    rerank with a 400 the client had asked to avoid."""
    srv, _ = lm
    long_document = "blocks of cached keys and values " * 400
    body = {"query": "what is a KV cache?", "documents": [long_document, "a recipe for soup"]}
    assert post(srv, "/v1/rerank", **body).status_code == 400
    whole = post(srv, "/v1/rerank", query=body["query"], documents=body["documents"][1:]).json()
    short = whole["usage"]["prompt_tokens"]  # the soup's prompt, which fits either limit
    for limit in (-1, short + 50):
        answer = post(srv, "/v1/rerank", **body, truncate_prompt_tokens=limit)
        assert answer.status_code == 200, answer.text
        kept = srv.served.max_model_len if limit == -1 else limit
        assert kept - 4 <= answer.json()["usage"]["prompt_tokens"] - short <= kept
        soup = next(r for r in answer.json()["results"] if r["index"] == 1)
        assert soup["relevance_score"] == pytest.approx(whole["results"][0]["relevance_score"], abs=1e-6)
    too_short = post(srv, "/v1/rerank", **body, truncate_prompt_tokens=10)
    assert too_short.status_code == 400 and too_short.json()["error"]["param"] == "truncate_prompt_tokens"


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_rerank_top_n_zero_means_all(lm, path):
    """vLLM's rerank schema defaults top_n to 0, meaning every document, and clients built on it
    send that 0: it was a 400 ('top_n' must be >= 1)."""
    srv, _ = lm
    docs = ["blocks and caches", "a recipe for soup", "paged attention"]
    every = post(srv, path, query="what is a KV cache?", documents=docs).json()["results"]
    zero = post(srv, path, query="what is a KV cache?", documents=docs, top_n=0)
    assert zero.status_code == 200, zero.text
    assert [r["index"] for r in zero.json()["results"]] == [r["index"] for r in every] and len(every) == 3
    one = post(srv, path, query="what is a KV cache?", documents=docs, top_n=1).json()["results"]
    assert [r["index"] for r in one] == [every[0]["index"]]


# -- one forward, prompt logprobs and restricted choices ---------------------------------------------
def test_prompt_logprobs_match_log_softmax(lm):
    srv, reference = lm
    text = "The judge reads the whole prompt"
    ids = ids_of(srv, text)
    out = post(srv, "/v1/completions", prompt=text, max_tokens=0, prompt_logprobs=3).json()
    entries = out["choices"][0]["prompt_logprobs"]
    expected = lm_logprobs(reference, ids)
    assert entries[0] is None and len(entries) == len(ids)
    for pos, entry in enumerate(entries[1:]):
        token = ids[pos + 1]
        assert entry[str(token)]["logprob"] == pytest.approx(float(expected[pos, token]), abs=1e-4)
        assert entry[str(token)]["rank"] == int((expected[pos] > expected[pos, token]).sum()) + 1
        best = expected[pos].topk(3)
        for tid, lp in zip(best.indices.tolist(), best.values.tolist()):
            assert entry[str(tid)]["logprob"] == pytest.approx(lp, abs=1e-4)
    assert out["choices"][0]["text"] == "" and out["usage"]["completion_tokens"] == 0


def test_prompt_logprobs_survive_a_preemption(demo_model):
    """Sequences preempted by recompute (eight choices that outgrow a 256-token pool) keep the
    prompt logprobs they had: one entry per prompt token, as without preemption, and the same
    for echo + logprobs."""
    with ServerThread(Config(model=str(demo_model), block_size=16, num_kv_blocks=16)) as srv:
        body = dict(prompt="Once upon a time there was", max_tokens=100, ignore_eos=True, temperature=0,
                    prompt_logprobs=1)
        alone = post(srv, "/v1/completions", **body).json()["choices"][0]
        crowded = post(srv, "/v1/completions", n=8, **body).json()["choices"]
        echoed = post(srv, "/v1/completions", n=8, echo=True, logprobs=0,
                      **{k: v for k, v in body.items() if k != "prompt_logprobs"}).json()["choices"]
        assert srv.on_loop(lambda: srv.engine.scheduler.stats.num_preemptions) > 0
        srv.wait_idle()
    def entries(choice):  # {token id: logprob} at each prompt position
        return [None if e is None else {t: v["logprob"] for t, v in e.items()} for e in choice["prompt_logprobs"]]

    expected = [e if e is None else pytest.approx(e, abs=1e-4) for e in entries(alone)]  # batched rows round apart
    for choice in crowded:
        assert entries(choice) == expected
        assert choice["text"] == alone["text"]
    prompt_len = len(alone["prompt_logprobs"])
    for choice in echoed:
        assert len(choice["logprobs"]["tokens"]) == prompt_len + 100


def test_echo_with_logprobs_covers_prompt_and_generated_token(lm):
    srv, reference = lm
    text = "Echo these tokens"
    ids = ids_of(srv, text)
    out = post(srv, "/v1/completions", prompt=text, max_tokens=1, echo=True, logprobs=1, temperature=0).json()
    lp = out["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(ids) + 1 and lp["token_logprobs"][0] is None
    expected = lm_logprobs(reference, ids)
    for pos in range(1, len(ids)):
        assert lp["token_logprobs"][pos] == pytest.approx(float(expected[pos - 1, ids[pos]]), abs=1e-4)
    assert lp["token_logprobs"][-1] == pytest.approx(float(expected[-1].max()), abs=1e-4)


def test_allowed_tokens_logit_bias_and_choice_restrict_the_token(lm):
    srv, reference = lm
    text = "Answer with one word:"
    logprobs = lm_logprobs(reference, ids_of(srv, text))[-1]
    worst = logprobs.topk(5, largest=False).indices.tolist()
    allowed = post(srv, "/v1/completions", prompt=text, max_tokens=1, temperature=0,
                   allowed_token_ids=worst[:2]).json()
    best_allowed = max(worst[:2], key=lambda t: float(logprobs[t]))
    assert allowed["choices"][0]["text"] == srv.served.tokenizer.decode([best_allowed])
    biased = post(srv, "/v1/completions", prompt=text, max_tokens=1, temperature=0,
                  logit_bias={str(worst[0]): 100}).json()
    assert biased["choices"][0]["text"] == srv.served.tokenizer.decode([worst[0]])
    tok = srv.served.tokenizer
    round_trips = [t for t in logprobs.argsort().tolist() if tok.encode(tok.decode([t]), False) == [t]]
    choices = [tok.decode([t]) for t in round_trips[:3]]
    for body in ({"guided_choice": choices}, {"structured_outputs": {"choice": choices}}):
        out = post(srv, "/v1/completions", prompt=text, max_tokens=5, temperature=0, **body).json()
        assert out["choices"][0]["text"] in choices and out["usage"]["completion_tokens"] == 1
    chat = post(srv, "/v1/chat/completions", messages=[{"role": "user", "content": text}], temperature=0,
                guided_choice=choices).json()
    assert chat["choices"][0]["message"]["content"] in choices


def test_a_repeated_allowed_token_is_listed_once(lm):
    """An id sent twice in allowed_token_ids (or a choice's token twice) stood twice in
    top_logprobs, in place of another label: a judge reading P(yes) lost it."""
    srv, _ = lm
    text = "Answer with one word:"
    tok = srv.served.tokenizer
    yes, no = [t for t in range(300, 400) if tok.encode(tok.decode([t]), False) == [t]][:2]
    chat = {"messages": [{"role": "user", "content": text}], "max_tokens": 1, "temperature": 0, "logprobs": True,
            "top_logprobs": 2}
    twice = [tok.decode([t]) for t in (yes, no, no, yes)]
    for restriction in ({"allowed_token_ids": [yes, no, no, yes]}, {"guided_choice": twice}):
        top = post(srv, "/v1/chat/completions", **chat, **restriction).json()["choices"][0]["logprobs"]
        listed = [entry["token"] for entry in top["content"][0]["top_logprobs"]]
        assert sorted(listed) == sorted([tok.decode([yes]), tok.decode([no])]), listed
    listed = post(srv, "/v1/completions", prompt=text, max_tokens=1, temperature=0, logprobs=2,
                  allowed_token_ids=[yes, no, no, yes]).json()["choices"][0]["logprobs"]["top_logprobs"][0]
    assert len(listed) == 2, listed


# -- bad input ---------------------------------------------------------------------------------
BAD = [
    ("/v1/embeddings", {"input": []}, "input"),
    ("/v1/embeddings", {"input": [""]}, "input"),
    ("/v1/embeddings", {"input": "x", "encoding_format": "hex"}, "encoding_format"),
    ("/v1/embeddings", {"input": "x", "dimensions": 100000}, "dimensions"),
    ("/v1/embeddings", {"input": ["x"] * 2000}, "input"),
    ("/v1/score", {"query": "q", "items": ["a"], "label_token_ids": [10 ** 7]}, "label_token_ids"),
    ("/v1/score", {"query": "q", "items": [], "label_token_ids": [1]}, "items"),
    ("/v1/score", {"query": "q", "items": ["a"] * 2000, "label_token_ids": [1]}, "items"),
    ("/v1/score", {"query": "q", "items": [[1, 2]], "label_token_ids": [1]}, "items"),
    ("/v1/score", {"text_1": ["a", "b"], "text_2": ["x", "y", "z"]}, "text_2"),
    ("/v1/rerank", {"query": "", "documents": ["a"]}, "query"),
    ("/v1/rerank", {"query": "q", "documents": []}, "documents"),
    ("/v1/completions", {"prompt": "x", "guided_choice": ["a fairly long multi token choice", ""]}, "guided_choice"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0, "prompt_logprobs": 99}, "prompt_logprobs"),
]


@pytest.mark.parametrize("path,body,param", BAD, ids=[str(i) for i in range(len(BAD))])
def test_decision_bad_input_is_400(lm, path, body, param):
    srv, _ = lm
    response = post(srv, path, **body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_classify_without_a_head_is_400(lm):
    srv, _ = lm
    response = post(srv, "/classify", input="hello")
    assert response.status_code == 400 and "classification head" in response.json()["error"]["message"]
    srv.wait_idle()


def test_label_scoring_on_a_classifier_is_400(classifier):
    srv, _ = classifier
    response = post(srv, "/v1/score", query="q", items=["a"], label_token_ids=[1])
    assert response.status_code == 400 and "language-model head" in response.json()["error"]["message"]
    srv.wait_idle()


def test_binary_classifier_saved_with_transformers_defaults_loads_and_matches(demo_model, tmp_path):
    """transformers' default num_labels=2 leaves id2label out of config.json: read it as 2."""
    import json

    path = make_model_dir(tmp_path / "binary", "qwen3", demo_model, head="ForSequenceClassification", pad_token_id=0)
    assert "id2label" not in json.loads((path / "config.json").read_text())
    reference = load_reference(path)
    with _serve(path) as srv:
        ids = ids_of(srv, "is this spam?")
        out = post(srv, "/classify", input=[ids]).json()["data"][0]
        with torch.no_grad():
            expected = reference(torch.tensor([ids])).logits[0].softmax(-1)
        assert out["num_classes"] == 2 and out["probs"] == pytest.approx(expected.tolist(), abs=1e-5)


def test_a_classifier_has_no_text_generation_and_models_lists_capabilities(classifier, lm):
    srv, _ = classifier
    for path, body in (("/v1/completions", {"prompt": "hi"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
        response = post(srv, path, **body)
        assert response.status_code == 400 and "language-model head" in response.json()["error"]["message"]
    assert httpx.get(srv.base_url + "/v1/models").json()["data"][0]["capabilities"] == ["classify", "score", "embed"]
    assert httpx.get(lm[0].base_url + "/v1/models").json()["data"][0]["capabilities"] == ["generate", "score", "embed"]
