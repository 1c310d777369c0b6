"""Decision-style endpoints, all on the OneShot path: embeddings, classification, raw pooling
and label-token scoring (pair scoring and reranking build on them in server/relevance.py). A
list input is one admission of many rows."""
from __future__ import annotations

import math
import time
from typing import Callable

from starlette.requests import Request as HTTPRequest
from starlette.responses import Response

from prelude.engine.request import Request, Task
from prelude.contract.sampling import SamplingParams
from prelude.server.errors import bad_request
from prelude.server.protocol import Body
from prelude.server.scores import EMBED_DTYPES, ENDIANNESS, label_probabilities, matryoshka, packed, required
from prelude.server.answers import check_count, json_response, new_id, prompt_usage
from prelude.server.serving import MAX_ITEMS, Serving

NO_GENERATION = SamplingParams(max_tokens=0, temperature=0.0)


class DecisionAPI(Serving):
    # -- helpers ----------------------------------------------------------------------------
    def _rows(self, rid: str, prompts: list[list[int]], task: Task, param: str = "input", **fields) -> list[Request]:
        """`param`: the request field a too-long prompt is blamed on."""
        for ids in prompts:
            self.check_length(ids, param, task)
        return [Request(f"{rid}-{i}", ids, NO_GENERATION, task=task, **fields) for i, ids in enumerate(prompts)]

    def _require_classifier(self) -> None:
        if not self.served.has_classifier:
            raise bad_request(f"model {self.model_name!r} ({self.served.config.architecture}) has no "
                              "classification head; this endpoint needs a *ForSequenceClassification checkpoint")

    def _trim_padding(self, ids: list[int]) -> list[int]:
        """Sequence classification reads the last non-pad token (as HF does); causal attention
        makes that the same as dropping trailing pads and reading the last token."""
        pad = self.served.config.pad_token_id
        end = len(ids)
        while pad is not None and end > 1 and ids[end - 1] == pad:
            end -= 1
        return ids[:end]

    def _envelope(self, rid: str, data: list, prompts: list[list[int]]) -> dict:
        return {"id": rid, "object": "list", "created": int(time.time()), "model": self.model_name,
                "data": data, "usage": prompt_usage(prompts)}

    async def _classify_rows(self, http, rid: str, prompts: list[list[int]], sched: dict) -> list[list[float]]:
        self._require_classifier()
        rows = self._rows(rid, [self._trim_padding(p) for p in prompts], task=Task.CLASSIFY, **sched)
        return [required(out.scores) for out in await self.collect(http, rows)]

    # -- /v1/embeddings ---------------------------------------------------------------------
    async def embeddings(self, http: HTTPRequest) -> Response:
        body = await self.body(http)
        prompts = await self.inputs(body, "input", MAX_ITEMS, self.pooling_side(body))
        encode = _vector_encoding(body)
        rid = new_id("embd", http)
        vectors = await self._pooled(http, rid, prompts, body, normalize=True)
        data = [{"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(vectors)]
        response = self._envelope(rid, data, prompts)
        del response["created"], response["id"]
        return json_response(response)

    async def _pooled(self, http, rid: str, prompts: list[list[int]], body: Body, normalize: bool) -> list[list[float]]:
        """The prompts' pooled vectors, as /v1/embeddings and /pooling give them: L2-normalized
        when the request's `normalize` (default `normalize`) says so, and cut to vLLM's
        `dimensions` (Matryoshka: the leading ones, renormalized when normalized)."""
        dimensions = body.int("dimensions", None, lo=1, hi=self.served.config.hidden_size)
        normalize = body.bool("normalize", normalize)
        rows = self._rows(rid, prompts, task=Task.EMBED, pooling=self.served.pooling,
                          normalize=normalize and dimensions is None, **self.scheduling(http, body))
        return [matryoshka(required(out.pooled), dimensions, normalize and dimensions is not None)
                for out in await self.collect(http, rows)]

    # -- /classify --------------------------------------------------------------------------
    async def classify(self, http: HTTPRequest) -> Response:
        body = await self.body(http)
        self._require_classifier()
        prompts = await self.inputs(body, "input", MAX_ITEMS, self.pooling_side(body))
        rid = new_id("classify", http)
        labels = self.served.config.id2label
        data = []
        activate = activated(body)
        for i, logits in enumerate(await self._classify_rows(http, rid, prompts, self.scheduling(http, body))):
            probs = label_probabilities(logits, self.served.config.multi_label) if activate else logits
            best = max(range(len(probs)), key=probs.__getitem__)
            item = {"index": i, "label": labels.get(best, f"LABEL_{best}"), "probs": probs, "num_classes": len(probs)}
            if len(logits) == 1:  # a reward / regression head: its raw scalar too
                item["score"] = logits[0]
            data.append(item)
        return json_response(self._envelope(rid, data, prompts))

    # -- /pooling ---------------------------------------------------------------------------
    async def pooling(self, http: HTTPRequest) -> Response:
        """Raw head outputs: classification/reward logits for classifier checkpoints, otherwise
        the pooled final hidden state (not normalized unless asked)."""
        body = await self.body(http)
        prompts = await self.inputs(body, "input", MAX_ITEMS, self.pooling_side(body))
        encode = _vector_encoding(body)
        rid = new_id("pool", http)
        if self.served.has_classifier:
            outputs = await self._classify_rows(http, rid, prompts, self.scheduling(http, body))
        else:
            outputs = await self._pooled(http, rid, prompts, body, normalize=False)
        data = [{"index": i, "object": "pooling", "data": encode(out)} for i, out in enumerate(outputs)]
        return json_response(self._envelope(rid, data, prompts))

    # -- label-token scoring ----------------------------------------------------------------
    def _label_ids(self, body: Body) -> tuple[int, ...]:
        ids = body.int_list("label_token_ids", lo=0, hi=self.admission.vocab_size - 1)
        if not ids:
            raise bad_request("'label_token_ids' must be a non-empty array of token ids", "label_token_ids")
        return ids

    async def _label_scores(self, http, rid: str, prompts: list[list[int]], label_ids: tuple[int, ...],
                            apply_softmax: bool, sched: dict, param: str = "items") -> list[list[float]]:
        """For each prompt, the probability of each label token at the next position: normalized
        over the label tokens alone (apply_softmax: the compact head computes just their rows of
        the LM head) or over the whole vocabulary."""
        rows = self._rows(rid, prompts, task=Task.SCORE, param=param, label_token_ids=label_ids,
                          label_vocab_normalized=not apply_softmax, **sched)
        outputs = await self.collect(http, rows)
        return [[math.exp(lp) for lp in required(out.label_logprobs)] for out in outputs]

    async def _multi_item_scores(self, http, rid: str, query: list[int], items: list[list[int]],
                                 label_ids: tuple[int, ...], apply_softmax: bool, sched: dict) -> list[list[float]]:
        """All items in one row behind the shared query: one forward, each item masked to see
        the query and itself only, read at its own last token."""
        prompt = query + [t for item in items for t in item]
        rows = self._rows(rid, [prompt], task=Task.SCORE, param="items", label_token_ids=label_ids,
                          label_vocab_normalized=not apply_softmax, item_lengths=tuple(map(len, items)), **sched)
        (out,) = await self.collect(http, rows)
        return [[math.exp(lp) for lp in item] for item in required(out.item_label_logprobs)]

    def _use_multi_item(self, body: Body) -> bool:
        """Multi-item mode: on by default when there are several items and each is no longer than
        the query (characters for text, tokens for ids: the query dominates, so sharing one
        forward pays); `multi_item` in the request forces it on or off."""
        query, items = body.require("query"), body.list("items") or []
        short = bool(items) and all(isinstance(i, (str, list)) and len(i) <= len(query) for i in items)
        return body.bool("multi_item", len(items) > 1 and short) and not body.bool("item_first")

    async def _label_inputs(self, body: Body) -> tuple[tuple[list[int], list[list[int]]] | None,
                                                      list[list[int]] | None]:
        """(multi-item inputs, the per-item prompts when finding them out made those). The inputs:
        the query's ids (with special tokens, for text) and each item's (without), SGLang's shape,
        each item tokenized on its own. None, where multi-item mode was chosen by default (not
        asked for) and the per-item rows would score other tokens: a text whose boundary
        tokenizes otherwise joined (": " then "a" apart, ": " and " a" joined) gave another
        probability, so adding a long item to a request changed the others' scores."""
        query, items = body.require("query"), body.require("items")
        if isinstance(query, str):
            (query_ids,) = await self.encode_items([query], "query")
            item_ids = await self.admission.encode_many(items, add_special_tokens=False)
            if not body.has("multi_item"):
                prompts = await self._label_prompts(body)
                if prompts != [query_ids + ids for ids in item_ids]:
                    return None, prompts
        else:
            query_ids = self.admission.check_ids(query, "query")
            item_ids = [self.admission.check_ids(item, "items") for item in items]
        return (query_ids, item_ids), None

    def _packs(self, query: list[int], items: list[list[int]]) -> bool:
        """Whether multi-item inputs run as one forward: where the server masks items from each
        other (--multi-item-scoring, the OneShot path, an attention backend that does) and they
        fit the context together. Else each runs as its own row, query + item tokenized apart,
        which scores the same: a forced multi_item on a server that could not pack scored the
        joined text instead, and one too long to pack was a 400 about a prompt never sent."""
        return self.served.multi_item_scoring and len(query) + sum(map(len, items)) <= self.served.max_model_len

    def _check_label_shape(self, body: Body) -> None:
        query, items = body.require("query"), body.list("items", nonempty=True)
        if items is None:
            raise bad_request("'items' is required", "items")
        check_count("items", len(items), MAX_ITEMS)
        if not (isinstance(query, str) and all(isinstance(i, str) for i in items)) and \
                not (isinstance(query, list) and all(isinstance(i, list) for i in items)):
            raise bad_request("'query' and 'items' must both be text or both be token ids", "items")
        # As their token-id forms are (admission.check_ids): an empty item packed behind the query
        # was read at the token before it, the previous item's last, and got that item's score.
        if not query:
            raise bad_request("'query' must not be empty", "query")
        if not all(items):
            raise bad_request("'items' must not contain empty items", "items")

    async def _label_prompts(self, body: Body) -> list[list[int]]:
        """Per-item prompts: query + item (item + query with item_first). Text pairs are
        tokenized as one string each, so the boundary tokenizes as in the joined text."""
        query, items = body.require("query"), body.require("items")
        item_first = body.bool("item_first")
        if isinstance(query, str):
            texts = [item + query if item_first else query + item for item in items]
            return await self.encode_items(texts, "items")
        query_ids = self.admission.check_ids(query, "query")
        item_ids = [self.admission.check_ids(item, "items") for item in items]
        return [i + query_ids if item_first else query_ids + i for i in item_ids]

    async def label_token_scores(self, http: HTTPRequest, body: Body, rid: str) -> Response:
        """/v1/score with label_token_ids (SGLang's): each item's label tokens' probabilities."""
        self.require_lm_head("label-token scoring")
        label_ids = self._label_ids(body)
        self._check_label_shape(body)
        apply_softmax, sched = body.bool("apply_softmax"), self.scheduling(http, body)
        apart, prompts = await self._label_inputs(body) if self._use_multi_item(body) else (None, None)
        if apart is not None and self._packs(*apart):
            query, items = apart
            scores = await self._multi_item_scores(http, rid, query, items, label_ids, apply_softmax, sched)
            usage = prompt_usage([query + [t for item in items for t in item]])
        else:
            if apart is not None:
                prompts = [apart[0] + item for item in apart[1]]
            prompts = prompts or await self._label_prompts(body)
            scores = await self._label_scores(http, rid, prompts, label_ids, apply_softmax, sched)
            usage = prompt_usage(prompts)
        return json_response({"scores": scores, "model": self.model_name, "object": "scoring", "usage": usage})

def activated(body: Body) -> bool:
    """vLLM's use_activation (and its deprecated names activation and softmax): false asks a
    classifier or cross-encoder for its raw logits, where a probability is the default."""
    for name in ("use_activation", "activation", "softmax"):
        if body.has(name):
            return body.bool(name)
    return True


def _vector_encoding(body: Body) -> Callable[[list[float]], list[float] | str]:
    """How a vector is written: OpenAI's encoding_format, which vLLM honours on /v1/embeddings
    and /pooling alike (a base64 client decodes whatever comes back, so a list where it asked
    for base64 breaks it), and vLLM's embed_dtype and endianness for base64 (a float16 client
    read float32 bytes as twice as many wrong values)."""
    encoding = body.str("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise bad_request("'encoding_format' must be 'float' or 'base64'", "encoding_format")
    dtype = body.str("embed_dtype", "float32")
    if dtype not in EMBED_DTYPES:
        raise body.invalid("embed_dtype", f"must be one of {', '.join(EMBED_DTYPES)}")
    endianness = body.str("endianness", "native")
    if endianness not in ENDIANNESS:
        raise body.invalid("endianness", f"must be one of {', '.join(ENDIANNESS)}")
    if encoding == "float":
        return lambda vector: vector
    return lambda vector: packed(vector, dtype, endianness)

