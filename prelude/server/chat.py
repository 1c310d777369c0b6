"""OpenAI's /v1/chat/completions (with vLLM's extensions): the messages rendered with the
checkpoint's chat template, then generated from like a completion, whole or streamed."""
from __future__ import annotations

import time
from dataclasses import replace
from functools import partial
from typing import Any

from starlette.requests import Request as HTTPRequest
from starlette.responses import Response

from prelude.contract.batch import TokenLogprob
from prelude.engine.output import RequestOutput
from prelude.server import access_log
from prelude.server.access_log import AccessEntry
from prelude.server.chat_prompt import ChatPrompt
from prelude.server.errors import bad_request
from prelude.server.generation import GenerationAPI
from prelude.server.reasoning import REASONING_END, StreamedReasoning, opens_in_reasoning, split_reasoning
from prelude.server.scores import required
from prelude.server.answers import json_response, new_id
from prelude.server.streaming import EventStream, merge, sse
from prelude.server.tool_calls import ForcedTools, ToolCallDeltas, finish_reason, forced_tools, tool_calls


class ChatAPI(GenerationAPI):
    def __init__(self, engine, admission, served, max_request_bytes: int, default_deadline_ms: float | None = None):
        super().__init__(engine, admission, served, max_request_bytes, default_deadline_ms)
        self.chat_prompt = ChatPrompt(served.chat_template, admission)
        # A template that writes reasoning blocks (Qwen3's, DeepSeek-R1's): its end token, after
        # which a grammar applies (as vLLM's reasoning parsers have it).
        template = served.chat_template
        self.reasoning_end = self.tokenizer.token_to_id(REASONING_END) \
            if template is not None and REASONING_END in template.source else None

    async def chat(self, http: HTTPRequest) -> Response | EventStream:
        body = await self.body(http)
        self.require_lm_head("chat")
        forced = forced_tools(body)
        rendered = await self.chat_prompt.render(body)
        # The template already placed any BOS; encoding adds none unless asked (vLLM's default).
        ids = await self.admission.encode(rendered.text, add_special_tokens=body.bool("add_special_tokens", False))
        # vLLM's truncate_prompt_tokens keeps the rendered prompt's last k tokens, as for completions
        # (it was ignored here: a chat past the context was a 400 the client had asked to avoid).
        ids = self.truncate(ids, self.truncation_limit(body), "left")
        if not ids:
            raise bad_request("'messages' render to an empty prompt", "messages")
        n = self.requested_n(body)
        max_tokens = body.int("max_completion_tokens", None, lo=0)
        if max_tokens is None:
            max_tokens = body.int("max_tokens", None, lo=0)
        top_logprobs = body.int("top_logprobs", None, lo=0)
        if top_logprobs and not body.bool("logprobs"):  # silently dropped, as it was, it went unchecked
            raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        logprobs = (top_logprobs or 0) if body.bool("logprobs") else None
        as_ids = body.bool("return_tokens_as_token_ids")
        return_ids = body.bool("return_token_ids")  # vLLM's: prompt_token_ids beside choices, token_ids in each
        prompt_logprobs = self.requested_prompt_logprobs(body)
        echo = rendered.echo if body.bool("echo") else ""  # vLLM's: text only, no logprobs or usage
        stream = body.bool("stream")
        include_usage, continuous_usage = self.stream_usage(body, stream)
        thinks = self.reasoning_end is not None and opens_in_reasoning(rendered)
        constraint = await self.answer_constraint(body, self.reasoning_end if thinks else None,
                                                  forced.constraint if forced is not None else None)
        # A grammar that waits for the reasoning's end constrains only what follows it: the
        # reasoning goes apart, in reasoning_content (as vLLM's reasoning parsers put it), so
        # that the content is what the grammar made (it parses, as json_schema promises). The
        # split is found in the text, where a special `</think>` shows only if asked for.
        split = thinks and constraint.new_state is not None and (
            self.reasoning_end not in self.tokenizer.special_ids or not body.bool("skip_special_tokens", True))
        rid = new_id("chatcmpl", http)
        requests = self.fan_out(rid, [ids], n, body, max_tokens, logprobs, constraint, **self.scheduling(http, body))
        if prompt_logprobs is not None:
            # One prompt, one field in the answer: the first choice computes them, and the others
            # stay free to reuse the prompt's cached prefix (prompt logprobs read every position).
            requests[0] = replace(requests[0], prompt_logprobs=prompt_logprobs)
        created = int(time.time())
        if stream:
            streams = self.submit_all(requests)
            await self.first_outputs(http, requests, streams)
            return EventStream(self._stream_chat(rid, created, streams, ids, rendered.role, echo, as_ids, return_ids,
                                                 include_usage, continuous_usage, access_log.entry(http), split,
                                                 forced),
                               on_close=lambda: self.abort_unfinished(streams))
        outputs = await self.collect(http, requests, n)
        messages = [_message(rendered.role, echo, out.text, split, forced) for out in outputs]
        choices = [{"index": i, "message": message,
                    "logprobs": self._chat_logprobs(out.logprobs, as_ids) if logprobs is not None else None,
                    "finish_reason": out.finish_reason if forced is None else
                    finish_reason(forced, out.finish_reason, message["tool_calls"]),
                    "stop_reason": out.stop_reason,
                    **({"token_ids": out.token_ids} if return_ids else {})}
                   for i, (out, message) in enumerate(zip(outputs, messages))]
        answer = {"id": rid, "object": "chat.completion", "created": created, "model": self.model_name,
                  "choices": choices, "usage": self.usage(outputs, [len(ids)])}
        if prompt_logprobs is not None:  # vLLM's place: beside the choices, the rendered prompt's
            answer["prompt_logprobs"] = self.prompt_logprobs_field(required(outputs[0].prompt_logprobs))
        if return_ids:
            answer["prompt_token_ids"] = ids
        return json_response(answer)

    def _chat_logprobs(self, entries: list[TokenLogprob] | None, as_ids: bool) -> dict:
        def item(token_id: int, logprob: float) -> dict:
            text = self.logprob_token(token_id, as_ids)  # "token_id:<id>" with return_tokens_as_token_ids
            raw = list(text.encode("utf-8")) if as_ids else self.token_bytes(token_id)
            return {"token": text, "logprob": logprob, "bytes": raw}

        content = []
        for entry in entries or []:
            row = item(entry.token_id, entry.logprob)
            row["top_logprobs"] = [item(t, lp) for t, lp in entry.top]
            content.append(row)
        return {"content": content}

    def _stream_chat(self, rid, created, streams, prompt: list[int], role: str, echo: str, as_ids: bool,
                     return_ids: bool, include_usage, continuous_usage: bool, logged: AccessEntry | None,
                     split: bool, forced: ForcedTools | None):
        finals: dict[int, RequestOutput] = {}
        calls = ToolCallDeltas(forced) if forced is not None else None
        reasoning = [StreamedReasoning() for _ in streams] if split else None
        prompt_len = len(prompt)

        def chunk(choices, **extra):
            return sse({"id": rid, "object": "chat.completion.chunk", "created": created,
                        "model": self.model_name, "choices": choices, **extra})

        # continuous_usage_stats: every chunk carries its choice's usage so far (0 before any token).
        usage = partial(self.chunk_usage, continuous_usage, prompt_len)

        async def chunks():
            # return_token_ids: the prompt's ids come with the role chunk, as vLLM's first chunk has them.
            yield chunk([{"index": i, "delta": {"role": role, "content": ""}, "logprobs": None,
                          "finish_reason": None} for i in range(len(streams))], **usage(0),
                        **({"prompt_token_ids": prompt} if return_ids else {}))
            if echo:  # its own chunk before any generated text, as vLLM sends it
                yield chunk([{"index": i, "delta": {"content": echo}, "logprobs": None, "finish_reason": None}
                             for i in range(len(streams))], **usage(0))
            async for index, out in merge(streams):
                delta: dict[str, Any] = reasoning[index].delta(out.text, out.finished) if reasoning else \
                    ({"content": out.text} if out.text else {})
                reason = out.finish_reason if out.finished else None
                if calls is not None:  # the answer's text is the call's arguments (or the calls)
                    tool_delta = calls.delta(index, delta.pop("content", ""), out.finished)
                    if tool_delta is not None:
                        delta["tool_calls"] = tool_delta
                    reason = calls.finish_reason(reason, tool_delta) if reason is not None else None
                choice: dict[str, Any] = {"index": index, "delta": delta,
                          "logprobs": self._chat_logprobs(out.logprobs, as_ids) if out.logprobs else None,
                          "finish_reason": reason}
                if return_ids:
                    choice["token_ids"] = out.token_ids
                if out.finished:
                    choice["stop_reason"] = out.stop_reason
                finals[index] = out  # the last so far: an aborted stream's log line counts its tokens
                yield chunk([choice], **usage(out.num_output_tokens))

        usage_chunk = (lambda usage: chunk([], usage=usage)) if include_usage else None
        return self.framed(rid, chunks(), streams, finals, [prompt_len], usage_chunk, logged, len(streams))


def _message(role: str, echo: str, text: str, split: bool, forced: ForcedTools | None = None) -> dict:
    """A whole answer's message; with `split`, its reasoning in reasoning_content and only what
    follows the block's end in content (null while the block never ended), as vLLM's parsers.
    A forced tool call's answer is its tool_calls, with empty content (as vLLM's)."""
    if not split:
        message: dict[str, Any] = {"role": role, "content": echo + text}
    else:
        reasoning, content = split_reasoning(text)
        message = {"role": role, "content": echo + content if content is not None else echo or None,
                   "reasoning_content": reasoning}
    if forced is not None:
        message["tool_calls"] = tool_calls(forced, (message["content"] or "").removeprefix(echo))
        message["content"] = echo
    return message

