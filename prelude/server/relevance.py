"""Pair scoring and reranking: /score, /v1/score (text pairs; label-token scoring is
DecisionAPI's), /rerank and /v1/rerank. How a pair is scored is ServedModel.pair_scoring's
choice: a cross-encoder's head, the cosine of two embeddings, or a yes/no judge prompt."""
from __future__ import annotations

import math
from typing import Any

from starlette.requests import Request as HTTPRequest
from starlette.responses import Response

from prelude.engine.request import Task
from prelude.server.answers import check_count, json_response, new_id, prompt_usage
from prelude.server.decision import DecisionAPI, activated
from prelude.server.errors import bad_request
from prelude.server.judge import RERANK_INSTRUCTION, JudgePrompt
from prelude.server.protocol import Body
from prelude.server.scores import pair_logit, pair_relevance, required
from prelude.server.serving import MAX_ITEMS


class RelevanceAPI(DecisionAPI):
    # -- /score, /v1/score ------------------------------------------------------------------
    async def score(self, http: HTTPRequest) -> Response:
        body = await self.body(http)
        rid = new_id("score", http)
        if body.has("label_token_ids"):
            return await self.label_token_scores(http, body, rid)
        queries, documents = self._pairs(body)
        relevance, prompts = await self._relevance_scores(http, rid, queries, documents, body, raw=not activated(body))
        data = [{"index": i, "object": "score", "score": s} for i, s in enumerate(relevance)]
        return json_response(self._envelope(rid, data, prompts))

    def _pairs(self, body: Body) -> tuple[list[str], list[str]]:
        """1-to-1, 1-to-N or N-to-N pairs of texts, under any of vLLM's field pairs: text_1/text_2,
        queries/documents (its current documented form, which answered 400 "'query' is
        required"), queries/items, data_1/data_2; or query/items|documents."""
        first_name = next((n for n in ("text_1", "queries", "data_1") if body.has(n)), "query")
        second_name = next((n for n in ("text_2", "documents", "items", "data_2") if body.has(n)), "documents")
        first, second = body.require(first_name), body.require(second_name)
        first = [first] if isinstance(first, str) else first
        second = [second] if isinstance(second, str) else second
        for name, values in ((first_name, first), (second_name, second)):
            if not isinstance(values, list) or not values or not all(isinstance(v, str) and v for v in values):
                raise bad_request(f"'{name}' must be a non-empty string or array of non-empty strings", name)
            check_count(name, len(values), MAX_ITEMS)
        if len(first) == 1:
            first = first * len(second)
        elif len(first) != len(second):
            raise bad_request(f"'{first_name}' has {len(first)} entries and '{second_name}' {len(second)}; "
                              "give one query, or as many as there are documents", second_name)
        return first, second

    async def _relevance_scores(self, http, rid: str, queries: list[str], documents: list[str],
                                body: Body, raw: bool = False, cut: tuple[int | None, str] | None = None
                                ) -> tuple[list[float], list[list[int]]]:
        """Each pair's relevance, as ServedModel.pair_scoring says, and the prompts it ran. `raw`
        (vLLM's use_activation false, TEI's raw_scores): a probability's logit instead (a cosine
        stays a cosine). `cut`: at most how many tokens a prompt takes, dropped from which side
        (TEI's truncate); by default vLLM's truncate_prompt_tokens and truncation_side (k tokens
        at most, -1 the context; none: an encoder's pair is cut at its context, a decoder's is a
        400)."""
        limit, side = cut if cut is not None else (self.truncation_limit(body), self.pooling_side(body))
        if self.served.pair_scoring == "embedding":
            return await self._embedding_similarities(http, rid, queries, documents, body, limit, side)
        if self.served.pair_scoring == "cross-encoder":  # the pair through the classification head
            prompts = await self.admission.encode_pairs(queries, documents, limit, side)
            scores = await self._classify_rows(http, rid, prompts, self.scheduling(http, body))
            return [pair_logit(s) if raw else pair_relevance(s) for s in scores], prompts
        self.require_lm_head("scoring")
        yes, no = self.tokenizer.token_to_id("yes"), self.tokenizer.token_to_id("no")
        if yes is None or no is None:
            raise bad_request("generative scoring needs single tokens 'yes' and 'no' in the vocabulary")
        judge = JudgePrompt(self.served.chat_template, body.str("instruction", RERANK_INSTRUCTION))
        texts = [judge.fill(q, d) for q, d in zip(queries, documents)]
        prompts = await self.admission.encode_many(texts, add_special_tokens=judge.add_special_tokens)
        if limit is not None:
            prompts = [ids if len(ids) <= limit else
                       await self._judged_within(judge, q, d, len(ids) - limit, limit, side)
                       for ids, q, d in zip(prompts, queries, documents)]
        scores = await self._label_scores(http, rid, prompts, (no, yes), True, self.scheduling(http, body),
                                          param="documents")
        if raw:
            return [math.log(max(s[1], 1e-300)) - math.log(max(s[0], 1e-300)) for s in scores], prompts
        return [s[1] for s in scores], prompts

    async def _judged_within(self, judge: JudgePrompt, query: str, document: str, over: int,
                             limit: int, side: str) -> list[int]:
        """A judge prompt `over` tokens past `limit`, its document cut from `side` until it fits
        (the prompt's frame and the query stay whole; a cut text may tokenize differently where
        it meets the frame, so it is measured again)."""
        words = await self.admission.encode(document, add_special_tokens=False)
        while True:
            keep = len(words) - over
            if keep <= 0:
                raise bad_request(f"the scoring prompt's frame and query alone take more than {limit} tokens "
                                  "(truncate_prompt_tokens)", "truncate_prompt_tokens")
            words = words[over:] if side == "left" else words[:keep]
            ids = await self.admission.encode(judge.fill(query, await self.admission.decode(words)),
                                              add_special_tokens=judge.add_special_tokens)
            if len(ids) <= limit:
                return ids
            over = len(ids) - limit

    async def _embedding_similarities(self, http, rid: str, queries: list[str], documents: list[str],
                                      body: Body, limit: int | None, side: str
                                      ) -> tuple[list[float], list[list[int]]]:
        """The cosine similarity of each pair's embeddings: each distinct text is embedded once
        (as /v1/embeddings would, normalized, cut to `limit` tokens from `side`), all
        of them in one admission."""
        texts = list(dict.fromkeys(queries + documents))
        prompts = await self.encode_items(texts, "documents", cut_texts=limit is None)
        if limit is not None:
            prompts = [self.truncate(ids, limit, side, text=True) for ids in prompts]
        rows = self._rows(rid, prompts, task=Task.EMBED, param="documents", pooling=self.served.pooling,
                          normalize=True, **self.scheduling(http, body))
        vectors = dict(zip(texts, (required(out.pooled) for out in await self.collect(http, rows))))
        # In [-1, 1]: unit vectors' float32 rounding put an identical pair at 1.0000000578.
        return [max(-1.0, min(1.0, sum(a * b for a, b in zip(vectors[q], vectors[d]))))
                for q, d in zip(queries, documents)], prompts

    # -- /rerank, /v1/rerank ----------------------------------------------------------------
    async def rerank(self, http: HTTPRequest) -> Response:
        return await self.rerank_documents(await self.body(http), http)

    async def rerank_documents(self, body: Body, http: HTTPRequest) -> Response:
        """Cohere / Jina shape: query + documents -> results sorted by relevance."""
        query = body.str("query")
        if not query:
            raise bad_request("'query' must be a non-empty string", "query")
        raw_documents = body.list("documents", nonempty=True)
        if raw_documents is None:
            raise bad_request("'documents' is required", "documents")
        documents = [d.get("text") if isinstance(d, dict) else d for d in raw_documents]
        texts = [d for d in documents if isinstance(d, str) and d]
        if len(texts) != len(documents):
            raise bad_request("'documents' must be non-empty strings or objects with a 'text'", "documents")
        check_count("documents", len(texts), MAX_ITEMS)
        top_n = requested_top_n(body, len(texts))
        return_documents = body.bool("return_documents", True)
        rid = new_id("rerank", http)
        relevance, prompts = await self._relevance_scores(http, rid, [query] * len(texts), texts, body,
                                                          raw=not activated(body))
        order = sorted(range(len(texts)), key=lambda i: -relevance[i])[:top_n]
        results = []
        for i in order:
            result: dict[str, Any] = {"index": i, "relevance_score": relevance[i]}
            if return_documents:
                result["document"] = {"text": texts[i]}
            results.append(result)
        return json_response({"id": rid, "model": self.model_name, "results": results,
                              "usage": prompt_usage(prompts)})


def requested_top_n(body: Body, count: int) -> int:
    """How many ranked results to return: top_n, where 0 (vLLM's default, which clients built on
    its schema send) or less means all of them, as in vLLM."""
    top_n = body.int("top_n", count)
    return top_n if top_n > 0 else count
