"""What every endpoint shares: body reading with the model check, prompt/input parsing and
tokenization, one admission of many rows, and collecting results with cancellation."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, TypeVar

from starlette.requests import ClientDisconnect, Request as HTTPRequest

from prelude.engine.engine import Engine
from prelude.engine.output import (
    EngineError,
    Overloaded,
    RequestOutput,
    RequestStream,
)
from prelude.engine.request import Request, Task
from prelude.server import access_log
from prelude.server.admission import Admission
from prelude.server.answers import check_count
from prelude.server.early_refusal import overloaded_error
from prelude.server.errors import APIError, bad_request, model_not_found
from prelude.server.protocol import Body, header, read_json
from prelude.server.served_model import ServedModel
from prelude.server.streaming import engine_error, wait_disconnect

logger = logging.getLogger(__name__)
BODY_KEY = "prelude.body"  # the request's Body in its ASGI scope
# Most inputs (prompts, items, documents) one request may carry. Each is a row with its own
# state until the answer is sent (about 11 KB), and one 32 MiB body can list millions of
# one-token prompts: enough rows to run the server out of memory.
MAX_ITEMS = 1024
# A request still unanswered this long after it was submitted is watched for its client going
# away (Serving._watching); one answered sooner has nothing left worth aborting.
WATCH_AFTER_S = 0.05


def _is_ids(value: Any) -> bool:
    """The one-prompt-of-token-ids form (check_ids validates every id afterwards)."""
    return isinstance(value, list) and bool(value) and isinstance(value[0], int)


Answer = TypeVar("Answer")  # an endpoint's response: a Response, or a stream
Awaited = TypeVar("Awaited")


def log_ignored_fields(
        endpoint: Callable[[HTTPRequest], Awaitable[Answer]]) -> Callable[[HTTPRequest], Awaitable[Answer]]:
    """The endpoint, followed by one debug line naming the request's fields it ignored. Checked
    when it returns, not when it submits: some fields shape only the response. A request it
    refused (raised) is not logged here; its error says why."""
    async def endpoint_noting_ignored(http: HTTPRequest) -> Answer:
        response = await endpoint(http)
        body = http.scope.get(BODY_KEY)
        if body is not None and logger.isEnabledFor(logging.DEBUG):
            ignored = body.ignored()
            if ignored:
                logger.debug("%s %s: ignored fields %s (unknown to this endpoint)", http.method, http.url.path,
                             ", ".join(ignored))
        return response

    return endpoint_noting_ignored


class Serving:
    def __init__(self, engine: Engine, admission: Admission, served: ServedModel, max_request_bytes: int,
                 default_deadline_ms: float | None = None):
        self.engine = engine
        self.admission = admission
        self.tokenizer = served.tokenizer
        self.served = served
        self.model_name = served.name
        self.max_request_bytes = max_request_bytes
        self._token_texts: dict[int, str] = {}
        self._token_bytes: dict[int, list[int]] = {}
        # The served names, its path (what /model_info reports as model_path) with or without a
        # trailing slash (vLLM names a model by --model as typed: a client sending "dir/" got 404),
        # and "unknown": sglang-router's placeholder when a request named no model.
        self.model_names = frozenset((served.name, *served.aliases, str(served.path), f"{served.path}/", "unknown"))
        self.default_deadline_ms = default_deadline_ms

    async def body(self, http: HTTPRequest) -> Body:
        body = await read_json(http, self.max_request_bytes)
        http.scope[BODY_KEY] = body  # for log_ignored_fields, once the endpoint has read it
        model = body.str("model")
        if model and model not in self.model_names:  # "" names the served model, as in vLLM
            raise model_not_found(model)
        return body

    def require_lm_head(self, what: str) -> None:
        if not self.served.has_lm_head:
            raise bad_request(f"{what} needs a language-model head; model {self.model_name!r} is "
                              f"{self.served.config.architecture}")

    def token_text(self, token_id: int) -> str:
        """One token's own text (logprob entries), decoded once per token id for the server's
        lifetime: the table is at most the vocabulary."""
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    def token_bytes(self, token_id: int) -> list[int]:
        """One token's own bytes (chat logprobs' `bytes`), found once per token id like its text."""
        raw = self._token_bytes.get(token_id)
        if raw is None:
            raw = self._token_bytes[token_id] = list(self.tokenizer.token_bytes(token_id))
        return raw

    def logprob_token(self, token_id: int, as_id: bool) -> str:
        """How a logprobs entry names a token: its text, or with vLLM's
        return_tokens_as_token_ids "token_id:<id>", which names tokens whose text is no whole
        character (a byte-level piece decodes to U+FFFD) or is shared by several ids."""
        return f"token_id:{token_id}" if as_id else self.token_text(token_id)

    def truncate(self, ids: list[int], limit: int | None, side: str | None = None, text: bool = False) -> list[int]:
        """At most `limit` tokens, dropping from the tokenizer's truncation side (or `side`). `text`:
        the ids encode a string with its special tokens, which stay ([CLS] ... [SEP], as the
        tokenizer truncates); token ids as sent are sliced."""
        if limit is None or len(ids) <= limit:
            return ids
        side = side or self.served.truncation_side
        if text:
            return self.tokenizer.truncate(ids, limit, side)
        return ids[len(ids) - limit:] if side == "left" else ids[:limit]

    def truncation_limit(self, body: Body) -> int | None:
        """vLLM's truncate_prompt_tokens: k keeps at most k prompt tokens, -1 the model's context."""
        k = body.int("truncate_prompt_tokens", None, lo=-1)
        if k == 0 or (k is not None and k < -1):
            raise body.invalid("truncate_prompt_tokens", "must be -1 or positive")
        if k is not None and k > self.served.max_model_len:  # refused whatever the prompt's length, as vLLM
            raise body.invalid("truncate_prompt_tokens", f"({k}) is greater than the model's maximum context "
                               f"length ({self.served.max_model_len}); choose a smaller truncation size")
        return self.served.max_model_len if k == -1 else k

    def pooling_side(self, body: Body) -> str:
        """Where truncate_prompt_tokens cuts a pooling request (embeddings, classify, pooling):
        its `truncation_side`, else "right", keeping the first tokens, as vLLM's pooling runner
        and every embedding server do (a generation prompt keeps its last ones)."""
        side = body.str("truncation_side", "right")
        if side not in ("left", "right"):
            raise body.invalid("truncation_side", "must be 'left' or 'right'")
        return side

    async def inputs(self, body: Body, name: str, max_items: int | None = None,
                     side: str = "left") -> list[list[int]]:
        """A prompt field as OpenAI allows it: a string, an array of strings, an array of token
        ids, or an array of token-id arrays; returns token ids per input (all validated, and
        truncated as truncate_prompt_tokens asks, dropping tokens from `side`)."""
        value = body.require(name)
        if isinstance(value, str) or _is_ids(value):
            items: list = [value]
        elif isinstance(value, list) and value:
            items = value
        else:
            raise bad_request(f"'{name}' must be a non-empty string, array of strings, or array of token ids", name)
        check_count(name, len(items), max_items)
        # An empty string is refused only where it encodes to no tokens (encode_items): an
        # encoder embeds "" as [CLS] [SEP], as vLLM does (LangChain's embed_documents sends empty
        # chunks), and a tokenizer that adds BOS makes it a prompt.
        for item in items:
            if not isinstance(item, (str, list)):
                raise bad_request(f"'{name}' must be a non-empty string, array of strings, or array of token ids",
                                  name)
        limit = self.truncation_limit(body)
        marked = body.bool("add_special_tokens", True)
        encoded = await self.encode_items(items, name, whole=limit is None, add_special_tokens=marked,
                                          cut_texts=limit is None)
        if limit is None:
            return encoded
        return [self.truncate(ids, limit, side, isinstance(item, str) and marked) for item, ids in zip(items, encoded)]

    def sent_texts(self, body: Body, name: str, encoded: list[list[int]]) -> list[str]:
        """Each input of a prompt field `inputs` read, as the client sent it: a string as is, token
        ids decoded (vLLM's echo text). Decoding a string's ids added what tokenization adds, a
        BOS token's text ("<|begin_of_text|>Hello" for "Hello") or normalization."""
        value = body.data[name]
        items = [value] if isinstance(value, str) or _is_ids(value) else value
        return [item if isinstance(item, str) else self.tokenizer.decode(ids) for item, ids in zip(items, encoded)]

    async def encode_items(self, items: list, name: str, whole: bool = False, add_special_tokens: bool = True,
                           cut_texts: bool = True) -> list[list[int]]:
        """Strings (tokenized together, in one thread-pool hop when long) and id lists (checked,
        in the pool when long). `whole`: no truncation will cut the ids, so a list past the
        context is refused before its ids are walked (millions of them would hold the loop just to
        answer 400). `cut_texts`: an encoder's strings are cut at its max_model_len (its default,
        ServedModel.cuts_texts); False where the request says how to truncate."""
        texts = [item for item in items if isinstance(item, str)]
        encoded = iter(await self.admission.encode_many(texts, add_special_tokens) if texts else [])
        out = []
        for item in items:
            if isinstance(item, list) and whole:
                self.admission.check_context(len(item), name)
            if isinstance(item, str):
                ids = next(encoded)
                if cut_texts and self.served.cuts_texts:
                    ids = self.truncate(ids, self.served.max_model_len, None, add_special_tokens)
            else:
                ids = await self.admission.checked_ids(item, name)
            if not ids:
                raise bad_request(f"'{name}' encodes to no tokens", name)
            out.append(ids)
        return out

    def scheduling(self, http: HTTPRequest, body: Body) -> dict[str, Any]:
        """The request's scheduling fields: `priority` (lower first, vLLM's), and a deadline for
        its first token or OneShot result from the X-Deadline-Ms header, the `deadline_ms`
        field, or the server's --default-deadline-ms."""
        priority = body.int("priority", 0)
        if priority and not self.engine.orders_by_priority:  # vLLM's refusal: it was ignored without a word
            raise body.invalid("priority", "has no effect unless the server runs --scheduling-policy priority")
        fields: dict[str, Any] = {"priority": priority}
        given = header(http, b"x-deadline-ms")
        if given is not None:
            try:
                deadline_ms = float(given)
            except ValueError:
                raise bad_request(f"X-Deadline-Ms must be a number of milliseconds, got {given!r}") from None
            if not 0 < deadline_ms < 1e9:
                raise bad_request("X-Deadline-Ms must be in (0, 1e9) milliseconds")
        else:
            deadline_ms = body.float("deadline_ms", self.default_deadline_ms, lo=1e-3, hi=1e9)
        if deadline_ms is not None:
            fields["deadline"] = time.monotonic() + deadline_ms / 1000
        return fields

    def submit_all(self, requests: list[Request]) -> list[RequestStream]:
        """One admission of all rows: they reach the scheduler together, or none does (503 with
        Retry-After when the queue is full or the server is draining)."""
        try:
            return self.engine.submit_all(requests)
        except Overloaded as exc:
            raise overloaded_error(exc, self.engine.draining) from None
        except EngineError as exc:
            raise APIError(503, str(exc)) from None

    def abort_unfinished(self, streams: list[RequestStream]) -> None:
        for stream in streams:
            if not stream.finished:
                self.engine.abort(stream)

    async def collect(self, http: HTTPRequest, requests: list[Request], n: int = 1) -> list[RequestOutput]:
        """Submits the rows and waits for their results. If the client goes away first, its rows
        are aborted at once (queued rows dropped, KV freed) and ClientDisconnect is raised.
        `n`: choices per prompt (rows are prompt-major), for the access log's prompt tokens."""
        logged = access_log.entry(http)
        if logged is not None:  # row ids are "<request id>-<row>" (fan_out, DecisionAPI._rows)
            logged.request_id = requests[0].request_id.rpartition("-")[0]
        streams = self.submit_all(requests)
        try:
            return await self._watching(http, streams, self._collect_all(streams, logged, n))
        finally:
            self.abort_unfinished(streams)

    async def first_outputs(self, http: HTTPRequest, requests: list[Request], streams: list[RequestStream]) -> None:
        """With --shed-late-requests, a stream's 200 waits until each row with a deadline has
        its first output. Shedding only ends work that has given none, so a shed stream now
        answers 503 deadline_exceeded as a whole answer does, which clients and routers retry
        elsewhere: it answered 200 and then an error event, which they do not retry."""
        if not (self.engine.sheds_late and any(r.deadline is not None for r in requests)):
            return
        try:
            await self._watching(http, streams, asyncio.gather(*(s.first() for s in streams)))
        except APIError:
            self.abort_unfinished(streams)
            raise

    async def _watching(self, http: HTTPRequest, streams: list[RequestStream], waiting: Awaitable[Awaited]) -> Awaited:
        """Awaits `waiting` on the streams' rows. If the client goes away first, its rows are
        aborted (queued rows dropped, KV freed) and ClientDisconnect is raised; an engine error
        is the APIError it answers. The watch starts WATCH_AFTER_S in: most decisions are
        answered before it would, and a task reading the connection cost each of them about as
        much as the engine's bookkeeping for it."""
        loop = asyncio.get_running_loop()
        watcher: asyncio.Task | None = None

        def watch() -> None:
            nonlocal watcher
            watcher = loop.create_task(self._abort_when_gone(http, streams))

        timer = loop.call_later(WATCH_AFTER_S, watch)
        try:
            result = await waiting
        except EngineError as exc:
            raise engine_error(exc) from None
        finally:
            timer.cancel()
            if watcher is not None:
                watcher.cancel()
        if watcher is not None and watcher.done() and not watcher.cancelled():
            raise ClientDisconnect()
        return result

    async def _abort_when_gone(self, http: HTTPRequest, streams: list[RequestStream]) -> None:
        await wait_disconnect(http.receive)
        self.abort_unfinished(streams)

    @staticmethod
    async def _collect_all(streams: list[RequestStream], logged: access_log.AccessEntry | None,
                           n: int) -> list[RequestOutput]:
        """The rows' merged outputs, logged as they end: also when the client went away, since
        aborted rows end too, with what they had computed."""
        if len(streams) == 1:  # the usual case: no task per stream
            outputs = [await streams[0].collect()]
        else:
            outputs = list(await asyncio.gather(*(s.collect() for s in streams)))
        if logged is not None:
            logged.record(logged.request_id or "", enumerate(outputs), n)
        return outputs

    def check_length(self, ids: list[int], param: str, task: Task) -> None:
        """A prompt that only needs one forward must still fit the context."""
        self.admission.output_budget(len(ids), 0, param, prompt_param=param, task=task)

    @staticmethod
    def usage(outputs: list[RequestOutput], prompt_lens: list[int]) -> dict:
        """Prompt tokens count once per prompt, whatever n is; outputs are prompt-major."""
        prompt = sum(prompt_lens)
        completion = sum(o.num_output_tokens for o in outputs)
        n = max(1, len(outputs) // max(1, len(prompt_lens)))
        cached = sum(o.num_cached_tokens for o in outputs[::n])
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}
