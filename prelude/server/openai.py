"""OpenAI-compatible generation endpoints: /v1/completions and /v1/chat/completions."""
from __future__ import annotations

import time
from typing import Sequence
from dataclasses import replace

from starlette.requests import Request as HTTPRequest
from starlette.responses import Response

from prelude.contract.batch import TokenLogprob
from prelude.engine.output import EngineError, RequestOutput
from prelude.engine.request import Request
from prelude.server import access_log
from prelude.server.access_log import AccessEntry
from prelude.server.chat_prompt import ChatPrompt
from prelude.server.errors import APIError, bad_request
from prelude.server.protocol import Body
from prelude.server.serving import MAX_ITEMS, Serving, json_response, new_id
from prelude.server.streaming import SSE_DONE, EventStream, merge, sse, stream_error

class CompletionsAPI(Serving):
    def __init__(self, engine, admission, served, max_request_bytes: int, default_deadline_ms: float | None = None):
        super().__init__(engine, admission, served, max_request_bytes, default_deadline_ms)
        self.chat_prompt = ChatPrompt(served.chat_template, admission)

    def fan_out(self, rid: str, prompts: list[list[int]], n: int, body: Body, max_tokens: int | None,
                logprobs: int | None, choice_ids: tuple[int, ...] | None, **fields) -> list[Request]:
        """n choices per prompt, all validated before any is submitted. Sampling is read from the
        body once; each prompt gets its own output budget (it depends on the prompt's length), and
        seeded sampling gets seed + choice index so that choices differ."""
        # n multiplies the rows: 1,024 prompts with n=128 queued 131,072 rows at once, past the
        # queue's bound; scheduling them took 403 s and stalled other requests up to 8.5 s.
        if len(prompts) * n > MAX_ITEMS:
            raise bad_request(f"{len(prompts)} prompts with n={n} make {len(prompts) * n} choices; at most "
                              f"{MAX_ITEMS} are allowed per request", "n")
        if choice_ids is not None:
            max_tokens = 1  # a single-token choice is the whole answer
        prompt_param = "messages" if body.has("messages") else "prompt"
        # The error names the field the client sent: chat's max_completion_tokens wins over max_tokens.
        param = "max_completion_tokens" if body.has("max_completion_tokens") else "max_tokens"
        budgets = [self.admission.output_budget(len(ids), max_tokens, param, prompt_param) for ids in prompts]
        params = self.admission.sampling(body, budgets[0], logprobs)
        if choice_ids is not None:
            params = replace(params, allowed_token_ids=choice_ids)
        requests = []
        for p, (ids, budget) in enumerate(zip(prompts, budgets)):
            prompt_params = params if budget == params.max_tokens else replace(params, max_tokens=budget)
            for j in range(n):
                seeded = prompt_params
                if j and params.seed is not None:
                    seeded = replace(prompt_params, seed=params.seed + j)
                requests.append(Request(f"{rid}-{p * n + j}", ids, seeded, **fields))
        return requests

    async def _choice(self, body: Body) -> tuple[int, ...] | None:
        """Structured choice (`structured_outputs.choice`, or the older `guided_choice`): the
        answer is one of the given strings. Supported when each is a single token."""
        structured = body.object("structured_outputs")
        name = "structured_outputs.choice" if structured is not None else "guided_choice"
        choices = structured.list("choice") if structured is not None else body.list("guided_choice")
        if choices is None:
            return None
        if not choices or not all(isinstance(c, str) and c for c in choices):
            raise bad_request(f"'{name}' must be a non-empty array of non-empty strings", name)
        ids = []
        for choice, encoded in zip(choices, await self.admission.encode_many(choices, add_special_tokens=False)):
            if len(encoded) != 1:
                raise bad_request(f"'{name}' supports single-token choices only; {choice!r} is "
                                  f"{len(encoded)} tokens", name)
            ids.append(encoded[0])
        return tuple(ids)

    # -- /v1/completions --------------------------------------------------------------------
    async def completions(self, http: HTTPRequest) -> Response | EventStream:
        body = await self.body(http)
        self.require_lm_head("text generation")
        prompts = await self.inputs(body, "prompt", MAX_ITEMS)
        if body.has("suffix"):
            raise bad_request("'suffix' is not supported", "suffix")
        n = body.int("n", 1, lo=1, hi=128)
        if body.int("best_of", n, lo=1) != n:
            raise bad_request("'best_of' different from 'n' is not supported", "best_of")
        max_tokens = body.int("max_tokens", 16, lo=0)
        logprobs = body.int("logprobs", None, lo=0)
        echo = body.bool("echo")
        prompt_logprobs = body.int("prompt_logprobs", None, lo=0)
        if prompt_logprobs is not None and prompt_logprobs > self.admission.max_logprobs:
            raise bad_request(f"requested {prompt_logprobs} prompt logprobs; at most "
                              f"{self.admission.max_logprobs} are allowed", "prompt_logprobs")
        # prompt_logprobs appears in the answer only when asked for; echo + logprobs computes
        # them too, for the echoed tokens' entries in `logprobs`.
        show_prompt_logprobs = prompt_logprobs is not None
        if echo and logprobs is not None and prompt_logprobs is None:
            prompt_logprobs = logprobs
        stream = body.bool("stream")
        options = body.object("stream_options")
        include_usage = options is not None and options.bool("include_usage")
        choice = await self._choice(body)
        rid = new_id("cmpl", http)
        requests = self.fan_out(rid, prompts, n, body, max_tokens, logprobs, choice,
                                prompt_logprobs=prompt_logprobs, **self.scheduling(http, body))
        created = int(time.time())
        if stream:
            streams = self.submit_all(requests)
            return EventStream(self._stream_completion(rid, created, streams, prompts, n, echo, logprobs,
                                                       include_usage, access_log.entry(http)),
                               on_close=lambda: self.abort_unfinished(streams))
        outputs = await self.collect(http, requests)
        choices = [self._completion_choice(i, out, prompts[i // n], echo, logprobs, show_prompt_logprobs)
                   for i, out in enumerate(outputs)]
        return json_response({"id": rid, "object": "text_completion", "created": created,
                              "model": self.model_name, "choices": choices,
                              "usage": self.usage(outputs, [len(p) for p in prompts])})

    def _legacy_logprobs(self, entries: Sequence[TokenLogprob | None], first_token: int | None = None,
                         offset: int = 0) -> dict:
        """OpenAI's legacy logprobs object. A None entry is the echoed first prompt token, which
        has no logprob."""
        tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
        for entry in entries:
            token_id = first_token if entry is None else entry.token_id
            assert token_id is not None, "an echoed entry comes with the prompt's first token"
            text = self.token_text(token_id)
            tokens.append(text)
            token_logprobs.append(None if entry is None else entry.logprob)
            top_logprobs.append(None if entry is None else {self.token_text(t): lp for t, lp in entry.top})
            offsets.append(offset)
            offset += len(text)
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
                "text_offset": offsets}

    def _prompt_logprobs_field(self, entries: list[TokenLogprob]) -> list:
        """vLLM's prompt_logprobs shape: None for the first token, then {id: {logprob, rank, decoded_token}}."""
        out: list = [None]
        for entry in entries:
            item = {str(t): {"logprob": lp, "rank": r + 1, "decoded_token": self.token_text(t)}
                    for r, (t, lp) in enumerate(entry.top)}
            item[str(entry.token_id)] = {"logprob": entry.logprob, "rank": entry.rank,
                                         "decoded_token": self.token_text(entry.token_id)}
            out.append(item)
        return out

    def _completion_choice(self, index: int, out: RequestOutput, prompt: list[int], echo: bool,
                           logprobs: int | None, show_prompt_logprobs: bool) -> dict:
        prompt_text = self.tokenizer.decode(prompt) if echo else ""
        logprobs_field = None
        if logprobs is not None:
            entries: list = [None, *(out.prompt_logprobs or [])] if echo else []
            logprobs_field = self._legacy_logprobs(entries + list(out.logprobs or []), prompt[0])
        choice = {"index": index, "text": prompt_text + out.text, "logprobs": logprobs_field,
                  "finish_reason": out.finish_reason, "stop_reason": out.stop_reason}
        if show_prompt_logprobs and out.prompt_logprobs is not None:
            choice["prompt_logprobs"] = self._prompt_logprobs_field(out.prompt_logprobs)
        return choice

    async def _stream_completion(self, rid, created, streams, prompts, n, echo, logprobs, include_usage,
                                 logged: AccessEntry | None):
        finals: dict[int, RequestOutput] = {}
        echoed: set[int] = set()
        offsets = [0] * len(streams)
        try:
            async for index, out in merge(streams):
                text = out.text
                entries: list = list(out.logprobs or [])
                if echo and index not in echoed:  # the prompt and its logprobs, as in the whole answer
                    echoed.add(index)
                    text = self.tokenizer.decode(prompts[index // n]) + text
                    if logprobs is not None:
                        entries = [None, *(out.prompt_logprobs or []), *entries]
                logprobs_field = None
                if entries:  # offsets count token texts, as the whole answer's (not chunk texts)
                    logprobs_field = self._legacy_logprobs(entries, prompts[index // n][0], offset=offsets[index])
                    offsets[index] = logprobs_field["text_offset"][-1] + len(logprobs_field["tokens"][-1])
                choice = {"index": index, "text": text, "logprobs": logprobs_field,
                          "finish_reason": out.finish_reason if out.finished else None,
                          "stop_reason": out.stop_reason if out.finished else None}
                yield sse({"id": rid, "object": "text_completion", "created": created,
                           "model": self.model_name, "choices": [choice]})
                if out.finished:
                    finals[index] = out
            if logged is not None:
                logged.record(rid, finals.values())
            if include_usage:
                usage = self.usage([finals[i] for i in sorted(finals)], [len(p) for p in prompts])
                yield sse({"id": rid, "object": "text_completion", "created": created,
                           "model": self.model_name, "choices": [], "usage": usage})
            yield SSE_DONE
        except EngineError as exc:
            if logged is not None:
                logged.request_id, logged.error = rid, str(exc)
            yield sse(stream_error(exc))
            yield SSE_DONE

    # -- /v1/chat/completions ---------------------------------------------------------------
    async def chat(self, http: HTTPRequest) -> Response | EventStream:
        body = await self.body(http)
        self.require_lm_head("chat")
        text = await self.chat_prompt.render(body)
        # The template already placed any BOS; encoding must not add another.
        ids = await self.admission.encode(text, add_special_tokens=False)
        if not ids:
            raise bad_request("'messages' render to an empty prompt", "messages")
        n = body.int("n", 1, lo=1, hi=128)
        max_tokens = body.int("max_completion_tokens", None, lo=0)
        if max_tokens is None:
            max_tokens = body.int("max_tokens", None, lo=0)
        top_logprobs = body.int("top_logprobs", None, lo=0)
        if top_logprobs and not body.bool("logprobs"):  # silently dropped, as it was, it went unchecked
            raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        logprobs = (top_logprobs or 0) if body.bool("logprobs") else None
        stream = body.bool("stream")
        options = body.object("stream_options")
        include_usage = options is not None and options.bool("include_usage")
        choice = await self._choice(body)
        rid = new_id("chatcmpl", http)
        requests = self.fan_out(rid, [ids], n, body, max_tokens, logprobs, choice, **self.scheduling(http, body))
        created = int(time.time())
        if stream:
            streams = self.submit_all(requests)
            return EventStream(self._stream_chat(rid, created, streams, len(ids), include_usage,
                                                 access_log.entry(http)),
                               on_close=lambda: self.abort_unfinished(streams))
        outputs = await self.collect(http, requests)
        choices = [{"index": i, "message": {"role": "assistant", "content": out.text},
                    "logprobs": self._chat_logprobs(out.logprobs) if logprobs is not None else None,
                    "finish_reason": out.finish_reason, "stop_reason": out.stop_reason}
                   for i, out in enumerate(outputs)]
        return json_response({"id": rid, "object": "chat.completion", "created": created,
                              "model": self.model_name, "choices": choices,
                              "usage": self.usage(outputs, [len(ids)])})

    def _chat_logprobs(self, entries: list[TokenLogprob] | None) -> dict:
        def item(token_id: int, logprob: float) -> dict:
            text = self.token_text(token_id)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

        content = []
        for entry in entries or []:
            row = item(entry.token_id, entry.logprob)
            row["top_logprobs"] = [item(t, lp) for t, lp in entry.top]
            content.append(row)
        return {"content": content}

    async def _stream_chat(self, rid, created, streams, prompt_len, include_usage, logged: AccessEntry | None):
        finals: dict[int, RequestOutput] = {}

        def chunk(choices, **extra):
            return sse({"id": rid, "object": "chat.completion.chunk", "created": created,
                        "model": self.model_name, "choices": choices, **extra})

        try:
            yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                          "finish_reason": None} for i in range(len(streams))])
            async for index, out in merge(streams):
                delta = {"content": out.text} if out.text else {}
                choice = {"index": index, "delta": delta,
                          "logprobs": self._chat_logprobs(out.logprobs) if out.logprobs else None,
                          "finish_reason": out.finish_reason if out.finished else None}
                if out.finished:
                    choice["stop_reason"] = out.stop_reason
                    finals[index] = out
                yield chunk([choice])
            if logged is not None:
                logged.record(rid, finals.values())
            if include_usage:
                yield chunk([], usage=self.usage([finals[i] for i in sorted(finals)], [prompt_len]))
            yield SSE_DONE
        except EngineError as exc:
            if logged is not None:
                logged.request_id, logged.error = rid, str(exc)
            yield sse(stream_error(exc))
            yield SSE_DONE

