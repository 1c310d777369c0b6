"""OpenAI's /v1/completions (with vLLM's extensions), whole or streamed."""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Sequence

from starlette.requests import Request as HTTPRequest
from starlette.responses import Response

from prelude.contract.batch import TokenLogprob
from prelude.engine.output import RequestOutput
from prelude.server import access_log
from prelude.server.access_log import AccessEntry
from prelude.server.errors import bad_request
from prelude.server.generation import GenerationAPI
from prelude.server.answers import json_response, new_id
from prelude.server.serving import MAX_ITEMS
from prelude.server.streaming import EventStream, merge, sse


class CompletionsAPI(GenerationAPI):
    async def completions(self, http: HTTPRequest) -> Response | EventStream:
        body = await self.body(http)
        self.require_lm_head("text generation")
        prompts = await self.inputs(body, "prompt", MAX_ITEMS)
        if body.has("suffix"):
            raise bad_request("'suffix' is not supported", "suffix")
        n = self.requested_n(body)
        # OpenAI's default of 16 when the field is absent; an explicit null asks for all the context
        # leaves, as vLLM reads it (the OpenAI SDK sends max_tokens=None as null).
        max_tokens = body.int("max_tokens", None if "max_tokens" in body.data else 16, lo=0)
        logprobs = body.int("logprobs", None, lo=0)
        echo = body.bool("echo")
        # What echo puts before each answer: the prompt as sent, as in vLLM (even when
        # truncate_prompt_tokens cut its tokens).
        echoed = self.sent_texts(body, "prompt", prompts) if echo else None
        as_ids = body.bool("return_tokens_as_token_ids")
        return_ids = body.bool("return_token_ids")  # vLLM's: prompt_token_ids and token_ids in each choice
        prompt_logprobs = self.requested_prompt_logprobs(body)
        # prompt_logprobs appears in the answer only when asked for; echo + logprobs computes
        # them too, for the echoed tokens' entries in `logprobs`.
        show_prompt_logprobs = prompt_logprobs is not None
        if echo and logprobs is not None and prompt_logprobs is None:
            prompt_logprobs = logprobs
        stream = body.bool("stream")
        include_usage, continuous_usage = self.stream_usage(body, stream)
        constraint = await self.answer_constraint(body)
        rid = new_id("cmpl", http)
        requests = self.fan_out(rid, prompts, n, body, max_tokens, logprobs, constraint,
                                prompt_logprobs=prompt_logprobs, **self.scheduling(http, body))
        created = int(time.time())
        if stream:
            streams = self.submit_all(requests)
            await self.first_outputs(http, requests, streams)
            return EventStream(self._stream_completion(rid, created, streams, prompts, n, echoed, logprobs, as_ids,
                                                       return_ids, include_usage, continuous_usage,
                                                       access_log.entry(http)),
                               on_close=lambda: self.abort_unfinished(streams))
        if n > 1 and prompt_logprobs is not None:
            # A prompt's logprobs are the same for each of its choices: the first computes them,
            # and the others stay free to reuse its cached prefix (prompt logprobs read every
            # position, so every choice computed the whole prompt again).
            requests = [r if k % n == 0 else replace(r, prompt_logprobs=None) for k, r in enumerate(requests)]
        outputs = await self.collect(http, requests, n)
        choices = [self._completion_choice(i, out, outputs[i - i % n].prompt_logprobs, prompts[i // n],
                                           None if echoed is None else echoed[i // n],
                                           logprobs, as_ids, show_prompt_logprobs, return_ids)
                   for i, out in enumerate(outputs)]
        return json_response({"id": rid, "object": "text_completion", "created": created,
                              "model": self.model_name, "choices": choices,
                              "usage": self.usage(outputs, [len(p) for p in prompts])})

    def _legacy_logprobs(self, entries: Sequence[TokenLogprob | None], top: int, first_token: int | None = None,
                         offset: int = 0, as_ids: bool = False) -> dict:
        """OpenAI's legacy logprobs object, with the `top` most likely tokens at each position (an
        echoed prompt's entries may carry more: its prompt_logprobs when those ask for more). A
        None entry is the echoed first prompt token, which has no logprob. `as_ids`: tokens named
        "token_id:<id>" (vLLM's return_tokens_as_token_ids; offsets then count those names, as
        vLLM's do)."""
        tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
        for entry in entries:
            token_id = first_token if entry is None else entry.token_id
            assert token_id is not None, "an echoed entry comes with the prompt's first token"
            text = self.logprob_token(token_id, as_ids)
            tokens.append(text)
            token_logprobs.append(None if entry is None else entry.logprob)
            top_logprobs.append(None if entry is None else self._top_with_own(entry, top, as_ids))
            offsets.append(offset)
            offset += len(text)
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
                "text_offset": offsets}

    def _top_with_own(self, entry: TokenLogprob, top: int, as_ids: bool) -> dict[str, float]:
        """An entry's top_logprobs with the token itself among them: OpenAI's legacy logprobs
        (and vLLM's) always carry the chosen token, so up to logprobs + 1 entries, and clients
        read top_logprobs[i][tokens[i]]."""
        best = entry.top[:top]
        named = {self.logprob_token(t, as_ids): lp for t, lp in best}
        if all(t != entry.token_id for t, _ in best):
            named[self.logprob_token(entry.token_id, as_ids)] = entry.logprob
        return named

    def _completion_choice(self, index: int, out: RequestOutput, prompt_logprobs: list[TokenLogprob] | None,
                           prompt: list[int], echoed: str | None, logprobs: int | None, as_ids: bool,
                           show_prompt_logprobs: bool, return_ids: bool) -> dict:
        """`echoed`: the prompt's text when echoing (its tokens then lead the logprobs), else None."""
        logprobs_field = None
        if logprobs is not None:
            entries: list = [None, *(prompt_logprobs or [])] if echoed is not None else []
            logprobs_field = self._legacy_logprobs(entries + list(out.logprobs or []), logprobs, prompt[0],
                                                   as_ids=as_ids)
        choice = {"index": index, "text": (echoed or "") + out.text, "logprobs": logprobs_field,
                  "finish_reason": out.finish_reason, "stop_reason": out.stop_reason}
        if show_prompt_logprobs and prompt_logprobs is not None:
            choice["prompt_logprobs"] = self.prompt_logprobs_field(prompt_logprobs)
        if return_ids:
            choice.update(prompt_token_ids=prompt, token_ids=out.token_ids)
        return choice

    def _stream_completion(self, rid, created, streams, prompts, n, echo_texts: list[str] | None, logprobs,
                           as_ids: bool, return_ids: bool, include_usage, continuous_usage: bool,
                           logged: AccessEntry | None):
        finals: dict[int, RequestOutput] = {}
        echoed: set[int] = set()
        started: set[int] = set()  # choices whose first chunk went out (with return_ids, the prompt's ids)
        offsets = [0] * len(streams)

        def chunk(choices, **extra):
            return sse({"id": rid, "object": "text_completion", "created": created, "model": self.model_name,
                        "choices": choices, **extra})

        async def chunks():
            async for index, out in merge(streams):
                text = out.text
                entries: list = list(out.logprobs or [])
                if echo_texts is not None and index not in echoed:  # the prompt and its logprobs, as whole
                    echoed.add(index)
                    text = echo_texts[index // n] + text
                    if logprobs is not None:
                        entries = [None, *(out.prompt_logprobs or []), *entries]
                logprobs_field = None
                if entries:  # offsets count token texts, as the whole answer's (not chunk texts)
                    logprobs_field = self._legacy_logprobs(entries, logprobs or 0, prompts[index // n][0],
                                                           offset=offsets[index], as_ids=as_ids)
                    offsets[index] = logprobs_field["text_offset"][-1] + len(logprobs_field["tokens"][-1])
                usage = self.chunk_usage(continuous_usage, len(prompts[index // n]), out.num_output_tokens)
                choice = {"index": index, "text": text, "logprobs": logprobs_field,
                          "finish_reason": out.finish_reason if out.finished else None,
                          "stop_reason": out.stop_reason if out.finished else None}
                if return_ids:  # vLLM's: the prompt's ids in a choice's first chunk, each chunk's new ids
                    if index not in started:
                        choice["prompt_token_ids"] = prompts[index // n]
                    choice["token_ids"] = out.token_ids
                started.add(index)
                yield chunk([choice], **usage)
                finals[index] = out  # the last so far: an aborted stream's log line counts its tokens

        usage_chunk = (lambda usage: chunk([], usage=usage)) if include_usage else None
        return self.framed(rid, chunks(), streams, finals, [len(p) for p in prompts], usage_chunk, logged, n)
