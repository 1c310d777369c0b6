"""The shapes other embedding and rerank servers' clients send, on the same OneShot paths:
TEI's /embed, /rerank (with `texts`) and /predict, and Cohere's v2 /v2/embed and /v2/rerank.
Each answers in its own server's response shape."""
from __future__ import annotations

import sys

from starlette.requests import Request as HTTPRequest
from starlette.responses import Response

from prelude.engine.request import Task
from prelude.server.relevance import RelevanceAPI, requested_top_n
from prelude.server.scores import label_probabilities, matryoshka, packed_float32, required
from prelude.server.errors import bad_request
from prelude.server.protocol import Body
from prelude.server.answers import check_count, json_response, new_id
from prelude.server.serving import MAX_ITEMS

COHERE_EMBEDDING_TYPES = ("float", "int8", "uint8", "binary", "ubinary", "base64")
COHERE_INPUT_TYPES = ("search_document", "search_query", "classification", "clustering", "image")
UNCUT = sys.maxsize  # a limit no input reaches: pairs tokenized whole, where one past the context is refused


def _texts(body: Body, name: str) -> list[str]:
    value = body.require(name)
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
        raise bad_request(f"'{name}' must be a non-empty string or array of non-empty strings", name)
    check_count(name, len(texts), MAX_ITEMS)
    return texts


def _packed_bits(vector: list[float], signed: bool) -> list[int]:
    """One bit per dimension (1 where positive), eight to a byte; Cohere's binary is the byte
    minus 128."""
    out = []
    for i in range(0, len(vector), 8):
        byte = sum(1 << (7 - j) for j, v in enumerate(vector[i:i + 8]) if v > 0)
        out.append(byte - 128 if signed else byte)
    return out


def _cohere_embedding(vector: list[float], kind: str) -> list | str:
    if kind == "float":
        return vector
    if kind == "int8":
        return [max(-128, min(127, round(v * 127))) for v in vector]
    if kind == "uint8":
        return [max(0, min(255, round((v + 1) * 127.5))) for v in vector]
    if kind in ("binary", "ubinary"):
        return _packed_bits(vector, signed=kind == "binary")
    return packed_float32(vector)


class CompatAPI(RelevanceAPI):
    async def _embed_texts(self, http: HTTPRequest, rid: str, body: Body, texts: list[str], limit: int | None,
                           side: str | None, normalize: bool, refuse_over: int | None = None
                           ) -> tuple[list[list[float]], list[list[int]]]:
        """Embeddings of the texts, cut to `limit` tokens from `side`; a text longer than
        `refuse_over` tokens is a 400 naming max_tokens."""
        encoded = await self.encode_items(texts, "texts", cut_texts=False)
        prompts = [self.truncate(ids, limit, side, text=True) for ids in encoded]
        longest = max(map(len, prompts))
        if refuse_over is not None and longest > refuse_over:
            raise bad_request(f"an input has {longest} tokens, more than max_tokens ({refuse_over}); "
                              "truncate START or END cuts it instead", "max_tokens")
        rows = self._rows(rid, prompts, task=Task.EMBED, pooling=self.served.pooling,
                          normalize=normalize, **self.scheduling(http, body))
        return [required(out.pooled) for out in await self.collect(http, rows)], prompts

    async def rerank(self, http: HTTPRequest) -> Response:
        """/rerank and /v1/rerank: Cohere / Jina's `documents`, or TEI's `texts`."""
        body = await self.body(http)
        if body.has("texts") and not body.has("documents"):
            return await self.tei_rerank(body, http)
        return await self.rerank_documents(body, http)

    # -- TEI --------------------------------------------------------------------------------
    async def tei_embed(self, http: HTTPRequest) -> Response:
        """TEI /embed: `inputs` (string or strings), `normalize`, `truncate` (from
        `truncation_direction`'s end, Right by default), `dimensions`, `prompt_name`; answers a
        bare array of embeddings. Without `truncate`, an over-long input is a 400."""
        body = await self.body(http)
        texts = _texts(body, "inputs")
        limit, direction = self._tei_cut(body)
        dimensions = body.int("dimensions", None, lo=1, hi=self.served.config.hidden_size)
        normalize = body.bool("normalize", True)
        prompt_name = body.str("prompt_name")
        if prompt_name is not None:  # a named prompt of the sentence-transformers export, put before each text
            prompts = self.served.prompts
            if prompt_name not in prompts:
                raise bad_request(f"'prompt_name' {prompt_name!r} is not one of the model's prompts "
                                  f"({', '.join(map(repr, prompts)) or 'it has none'})", "prompt_name")
            texts = [prompts[prompt_name] + text for text in texts]
        vectors, _ = await self._embed_texts(http, new_id("embd", http), body, texts, limit, direction,
                                             normalize and dimensions is None)
        return json_response([matryoshka(v, dimensions, normalize and dimensions is not None) for v in vectors])

    def _tei_cut(self, body: Body) -> tuple[int, str]:
        """TEI's `truncate` and `truncation_direction` (Right by default): with truncate, an
        input is cut to the model's context from that side; without, one past it is a 400 (as
        TEI refuses it), never cut."""
        direction = (body.str("truncation_direction", "right") or "right").lower()
        if direction not in ("left", "right"):
            raise bad_request("'truncation_direction' must be Left or Right", "truncation_direction")
        return (self.served.max_model_len if body.bool("truncate") else UNCUT), direction

    async def tei_rerank(self, body: Body, http: HTTPRequest) -> Response:
        """TEI /rerank: `query`, `texts`, `raw_scores`, `return_text`, `truncate`,
        `truncation_direction`; a bare array sorted by score."""
        query = body.str("query")
        if not query:
            raise bad_request("'query' must be a non-empty string", "query")
        texts = _texts(body, "texts")
        limit, direction = self._tei_cut(body)
        relevance, _ = await self._relevance_scores(http, new_id("rerank", http), [query] * len(texts), texts, body,
                                                    raw=body.bool("raw_scores"), cut=(limit, direction))
        return_text = body.bool("return_text")
        results = []
        for i in sorted(range(len(texts)), key=lambda i: -relevance[i]):
            item: dict = {"index": i, "score": relevance[i]}
            if return_text:
                item["text"] = texts[i]
            results.append(item)
        return json_response(results)

    async def tei_predict(self, http: HTTPRequest) -> Response:
        """TEI /predict: `inputs` as a string, a [text, text_pair], or a batch of texts, [text]s and
        [text, text_pair]s; each answer is every label with its score, best first (`raw_scores`:
        logits; probabilities as /classify gives them). `truncate`, `truncation_direction` as
        /rerank's."""
        body = await self.body(http)
        self._require_classifier()
        limit, direction = self._tei_cut(body)
        value = body.require("inputs")
        single = isinstance(value, str) or (isinstance(value, list) and len(value) == 2
                                            and all(isinstance(v, str) for v in value)
                                            and not body.bool("batch"))
        batch = [value] if single else value
        if not isinstance(batch, list) or not batch:
            raise bad_request("'inputs' must be a text, a [text, pair], or an array of those", "inputs")
        check_count("inputs", len(batch), MAX_ITEMS)
        prompts = []
        for entry in batch:
            if isinstance(entry, list) and len(entry) == 1:  # TEI's batch of one-text arrays
                entry = entry[0]
            if isinstance(entry, str) and entry:
                (ids,) = await self.encode_items([entry], "inputs", cut_texts=False)
                ids = self.truncate(ids, limit, direction, text=True)
            elif isinstance(entry, list) and len(entry) == 2 and all(isinstance(t, str) and t for t in entry):
                (ids,) = await self.admission.encode_pairs([entry[0]], [entry[1]], limit, direction)
            else:
                raise bad_request("'inputs' must be a text, a [text, pair], or an array of those", "inputs")
            prompts.append(ids)
        logits = await self._classify_rows(http, new_id("predict", http), prompts, self.scheduling(http, body))
        labels = self.served.config.id2label
        raw = body.bool("raw_scores")
        answers = []
        for row in logits:
            scores = row if raw else label_probabilities(row, self.served.config.multi_label)
            ranked = sorted(range(len(scores)), key=lambda i: -scores[i])
            answers.append([{"label": labels.get(i, f"LABEL_{i}"), "score": scores[i]} for i in ranked])
        return json_response(answers[0] if single else answers)

    @property
    def tei_model_type(self) -> str:
        """What TEI serves this model as: a classifier of one label is a reranker."""
        if self.served.has_classifier:
            return "reranker" if self.served.config.num_labels == 1 else "classifier"
        return "embedding"

    async def tei_inference(self, http: HTTPRequest) -> Response:
        """TEI's POST / (and SageMaker's /invocations), where huggingface_hub's InferenceClient
        posts: /rerank on a reranker, /predict on another classifier, /embed on any other model."""
        kind = self.tei_model_type
        if kind == "reranker":
            return await self.rerank(http)
        if kind == "classifier":
            return await self.tei_predict(http)
        return await self.tei_embed(http)

    def tei_info(self, version: str, max_batch_tokens: int, tokenization_workers: int) -> dict:
        """TEI's GET /info: the model and the server's limits, in its field names."""
        kind = self.tei_model_type
        labels = {str(i): label for i, label in self.served.config.id2label.items()}
        about = {"pooling": self.served.pooling} if kind == "embedding" else \
            {"id2label": labels, "label2id": {label: int(i) for i, label in labels.items()}}
        return {"model_id": self.served.name, "model_sha": None,
                "model_dtype": self.served.dtype, "model_type": {kind: about},
                "max_concurrent_requests": None, "max_input_length": self.served.max_model_len,
                "max_batch_tokens": max_batch_tokens, "max_batch_requests": None,
                "max_client_batch_size": MAX_ITEMS, "auto_truncate": False,
                "tokenization_workers": tokenization_workers, "version": version, "sha": None, "docker_label": None}

    # -- Cohere v2 --------------------------------------------------------------------------
    async def cohere_embed(self, http: HTTPRequest) -> Response:
        """Cohere v2 /v2/embed: `texts`, `input_type` (accepted; this server embeds every type
        the same way), `embedding_types`, `output_dimension`, `max_tokens`, `truncate`
        (NONE: over-long input is a 400; START / END: drop tokens from that end)."""
        body = await self.body(http)
        for field in ("images", "inputs"):  # embedded as texts alone, they would answer other vectors
            if body.list(field):
                raise bad_request(f"'{field}' is not supported: this server embeds 'texts' only", field)
        texts = _texts(body, "texts")
        input_type = body.str("input_type")
        if input_type is not None and input_type not in COHERE_INPUT_TYPES:  # a typo Cohere would refuse
            raise bad_request(f"'input_type' must be one of {', '.join(COHERE_INPUT_TYPES)}", "input_type")
        kinds = body.list("embedding_types") or ["float"]
        if not all(k in COHERE_EMBEDDING_TYPES for k in kinds):
            raise bad_request(f"'embedding_types' must be among {', '.join(COHERE_EMBEDDING_TYPES)}", "embedding_types")
        dimensions = body.int("output_dimension", None, lo=1, hi=self.served.config.hidden_size)
        truncate = (body.str("truncate", "END") or "END").upper()
        if truncate not in ("NONE", "START", "END"):
            raise bad_request("'truncate' must be NONE, START or END", "truncate")
        max_tokens = body.int("max_tokens", None, lo=1)
        # NONE truncates nothing: an input past max_tokens is a 400, as past the context.
        limit = None if truncate == "NONE" else min(max_tokens or self.served.max_model_len,
                                                    self.served.max_model_len)
        # One id names the rows (the access log) and the response: they were two.
        rid = new_id("embed", http)
        vectors, prompts = await self._embed_texts(http, rid, body, texts, limit,
                                                   "left" if truncate == "START" else "right", dimensions is None,
                                                   max_tokens if truncate == "NONE" else None)
        vectors = [matryoshka(v, dimensions, dimensions is not None) for v in vectors]
        embeddings = {kind: [_cohere_embedding(v, kind) for v in vectors] for kind in kinds}
        return json_response({
            "id": rid, "embeddings": embeddings, "texts": texts, "response_type": "embeddings_by_type",
            "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": sum(map(len, prompts))}}})

    async def cohere_rerank(self, http: HTTPRequest) -> Response:
        """Cohere v2 /v2/rerank: `query`, `documents` (strings), `top_n`, `max_tokens_per_doc`."""
        body = await self.body(http)
        query = body.str("query")
        if not query:
            raise bad_request("'query' must be a non-empty string", "query")
        documents = _texts(body, "documents")
        per_doc = body.int("max_tokens_per_doc", None, lo=1)
        if per_doc is not None:  # the documents' own tokens, cut at the tokenizer's truncation side
            encoded = await self.admission.encode_many(documents, add_special_tokens=False)
            documents = [self.tokenizer.decode(self.truncate(ids, per_doc)) for ids in encoded]
        top_n = requested_top_n(body, len(documents))
        rid = new_id("rerank", http)
        relevance, prompts = await self._relevance_scores(http, rid, [query] * len(documents), documents, body)
        order = sorted(range(len(documents)), key=lambda i: -relevance[i])[:top_n]
        return json_response({
            "id": rid, "results": [{"index": i, "relevance_score": relevance[i]} for i in order],
            "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}}})
