"""What the two generation endpoints (/v1/completions and /v1/chat/completions) share: fanning
a request out into n choices per prompt, structured outputs (server.constraints), and vLLM's
prompt_logprobs field (read and answered the same way by both)."""
from __future__ import annotations

import json
from dataclasses import replace
from functools import cached_property, partial
from typing import AsyncIterator, Callable, ItemsView

from prelude.contract.batch import TokenLogprob
from prelude.engine.output import EngineError, RequestOutput, RequestStream
from prelude.engine.request import Request
from prelude.server.access_log import AccessEntry
from prelude.server.constraints import AnswerConstraint, Grammars, requested
from prelude.server.errors import bad_request
from prelude.server.protocol import Body
from prelude.server.serving import MAX_ITEMS, Serving
from prelude.server.streaming import SSE_DONE, sse, stream_error
from prelude.structured.compiler import Constraint


class GenerationAPI(Serving):
    grammars: Grammars | None = None  # set by the app: structured outputs for the served tokenizer

    @staticmethod
    def requested_n(body: Body) -> int:
        """The choices asked for; best_of, which would sample more and keep the best, is refused
        unless it asks for no more than n (on chat too, where it was dropped without a word)."""
        n = body.int("n", 1, lo=1, hi=128)
        if body.int("best_of", n, lo=1) != n:
            raise bad_request("'best_of' different from 'n' is not supported", "best_of")
        return n

    def fan_out(self, rid: str, prompts: list[list[int]], n: int, body: Body, max_tokens: int | None,
                logprobs: int | None, constraint: AnswerConstraint, **fields) -> list[Request]:
        """n choices per prompt, all validated before any is submitted. Sampling is read from the
        body once; each prompt gets its own output budget (it depends on the prompt's length), and
        seeded sampling gets seed + choice index so that choices differ. Each choice under a
        grammar gets a state of its own."""
        choice_ids = constraint.token_ids
        # n multiplies the rows: unbounded, one request could queue far past the queue's bound and
        # stall every other request while its rows are scheduled.
        if len(prompts) * n > MAX_ITEMS:
            raise bad_request(f"{len(prompts)} prompts with n={n} make {len(prompts) * n} choices; at most "
                              f"{MAX_ITEMS} are allowed per request", "n")
        if choice_ids is not None:  # a single-token choice is the whole answer (none with max_tokens 0)
            max_tokens = 1 if max_tokens is None else min(max_tokens, 1)
        prompt_param = "messages" if body.has("messages") else "prompt"
        # The error names the field the client sent: chat's max_completion_tokens wins over max_tokens.
        param = "max_completion_tokens" if body.has("max_completion_tokens") else "max_tokens"
        budgets = [self.admission.output_budget(len(ids), max_tokens, param, prompt_param) for ids in prompts]
        params = self.admission.sampling(body, budgets[0], logprobs)
        if choice_ids is not None:
            params = replace(params, allowed_token_ids=_allowed_choices(choice_ids, params.allowed_token_ids, body),
                             one_token_answer=True)
        requests = []
        for p, (ids, budget) in enumerate(zip(prompts, budgets)):
            prompt_params = params if budget == params.max_tokens else replace(params, max_tokens=budget)
            for j in range(n):
                seeded = prompt_params
                if j and params.seed is not None:
                    seeded = replace(prompt_params, seed=params.seed + j)
                grammar = constraint.new_state() if constraint.new_state is not None else None
                requests.append(Request(f"{rid}-{p * n + j}", ids, seeded, grammar=grammar, **fields))
        return requests

    async def answer_constraint(self, body: Body, reasoning_end: int | None = None,
                                forced: Constraint | None = None) -> AnswerConstraint:
        """What constrains the answer's text (see server.constraints). A choice whose strings are
        each one token is the allowed tokens of a one-token answer; any other choice, schema,
        regex or grammar is compiled. `reasoning_end`: the token ending the reasoning block the
        answer starts with, after which the grammar applies. `forced`: a forced tool call's."""
        _refuse_unsupported(body)
        wanted = requested(body)
        if forced is not None:
            if wanted is not None:
                other = wanted.param if isinstance(wanted, Constraint) else _choice_param(body)
                raise bad_request(f"only one constraint per request: 'tool_choice' and '{other}' were given", other)
            wanted = forced
        if wanted is None:
            return AnswerConstraint()
        if isinstance(wanted, list):
            encoded = await self.admission.encode_many(wanted, add_special_tokens=False)
            special = self.tokenizer.special_ids
            if any(len(ids) == 1 and ids[0] in special for ids in encoded):
                # Drawn as that token, "<|im_end|>" ended the answer with its text skipped: "".
                param = _choice_param(body)
                raise bad_request(f"'{param}' holds a special token's text, which would be drawn as that token",
                                  param)
            tokens = [self._one_token(text, ids) for text, ids in zip(wanted, encoded)]
            if all(token is not None for token in tokens):  # once each: top_logprobs lists distinct tokens
                return AnswerConstraint(token_ids=tuple(dict.fromkeys(t for t in tokens if t is not None)))
            wanted = Constraint("choice", json.dumps(wanted), param=_choice_param(body))
        if self.grammars is None:
            raise bad_request(f"'{wanted.param}' is not supported: structured outputs are off", wanted.param)
        compiled = await self.grammars.compile(wanted)
        return AnswerConstraint(new_state=partial(compiled.new_state, reasoning_end))

    def _one_token(self, text: str, encoded: list[int]) -> int | None:
        """The one token that, drawn after other text, adds exactly a choice's `text`: its
        encoding, where that is one such token, else the vocabulary's piece spelled as the text.
        A SentencePiece tokenizer encodes "yes" alone as "▁yes", which adds " yes" (a choice of
        "yes" and "no" answered " yes"); its piece "yes" adds "yes". None: the choice takes the
        grammar, and may take several tokens."""
        context, before = self._choice_context
        candidates = (encoded[0] if len(encoded) == 1 else None, self.tokenizer.token_to_id(text))
        return next((token for token in candidates if token is not None and token not in self.tokenizer.special_ids
                     and self.tokenizer.decode([*context, token])[len(before):] == text), None)

    @cached_property
    def _choice_context(self) -> tuple[list[int], str]:
        """Text a choice's token is read after (_one_token), as ids and as decoded: the same for
        every request, found once."""
        context = self.tokenizer.encode("a", add_special_tokens=False)
        return context, self.tokenizer.decode(context)

    @staticmethod
    def stream_usage(body: Body, stream: bool) -> tuple[bool, bool]:
        """stream_options' include_usage (a usage chunk before [DONE]) and vLLM's
        continuous_usage_stats (with it, every chunk carries its choice's usage so far, as vLLM's
        do; ignored, a client reading per-chunk token counts found none). Without `stream` they
        are a 400, as OpenAI and vLLM answer them."""
        options = body.object("stream_options")
        if options is None:
            return False, False
        if options.data and not stream:
            raise bad_request("'stream_options' can only be set with \"stream\": true", "stream_options")
        include_usage = options.bool("include_usage")
        return include_usage, include_usage and options.bool("continuous_usage_stats")

    @staticmethod
    def chunk_usage(continuous: bool, prompt_tokens: int, completion_tokens: int) -> dict:
        """A stream chunk's usage field: with continuous_usage_stats, its choice's usage so far;
        without, none."""
        if not continuous:
            return {}
        return {"usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens}}

    def requested_prompt_logprobs(self, body: Body) -> int | None:
        """vLLM's prompt_logprobs: the logprob of each prompt token, with this many alternatives.
        Refused on a stream, as vLLM refuses them: no chunk has a place for them, and a stream
        that dropped them looked like an answer that had them. vLLM lets 0 through (and drops
        it); refused here too, for the same reason."""
        prompt_logprobs = body.int("prompt_logprobs", None, lo=0)
        if prompt_logprobs is None:
            return None
        if prompt_logprobs > self.admission.max_logprobs:
            raise bad_request(f"requested {prompt_logprobs} prompt logprobs; at most "
                              f"{self.admission.max_logprobs} are allowed", "prompt_logprobs")
        if body.bool("stream"):
            raise bad_request("'prompt_logprobs' are not available with 'stream': true (as in vLLM); "
                              "ask for them without streaming", "prompt_logprobs")
        return prompt_logprobs

    async def framed(self, rid: str, chunks: AsyncIterator[bytes], streams: list[RequestStream],
                     finals: dict[int, RequestOutput], prompt_lens: list[int],
                     usage_chunk: Callable[[dict], bytes] | None, logged: AccessEntry | None,
                     n: int = 1) -> AsyncIterator[bytes]:
        """A stream's chunks (which fill `finals`, index -> last output), then its access-log
        record, the usage chunk when asked for, and [DONE]; an engine error ends it with an
        error event and [DONE] instead. A client that goes away mid-stream still gets its line:
        the response id and what finished, marked as such: the line said 200 with no id and no
        tokens, so a client's aborted stream could not be found in the log. `n`: choices per
        prompt."""
        recorded = False
        try:
            async for chunk in chunks:
                yield chunk
            if logged is not None:
                logged.record(rid, finals.items(), n)
                recorded = True
            usage = b"" if usage_chunk is None else usage_chunk(
                self.usage([finals[i] for i in sorted(finals)], prompt_lens))
            yield usage + SSE_DONE  # one write, with the response's end (EventStream)
        except EngineError as exc:
            if logged is not None:  # with what was streamed until then (a drain's timeout, a failed grammar)
                logged.record(rid, _with_metrics(finals, streams), n)
                logged.error = str(exc)
                recorded = True
            yield sse(stream_error(exc)) + SSE_DONE
        finally:
            if logged is not None and not recorded:  # cancelled or closed: the client went away
                # Its rows end now, each with its counts: a row still queued had sent nothing,
                # and its line said no class, no prompt, no queue time.
                self.abort_unfinished(streams)
                for index, stream in enumerate(streams):
                    last = stream.last_queued()
                    if index not in finals and last is not None:
                        finals[index] = last
                logged.record(rid, _with_metrics(finals, streams), n)
                logged.error = "client went away"

    def prompt_logprobs_field(self, entries: list[TokenLogprob]) -> list:
        """vLLM's prompt_logprobs shape: None for the first token, then {id: {logprob, rank, decoded_token}}."""
        out: list = [None]
        for entry in entries:
            item = {str(t): {"logprob": lp, "rank": r + 1, "decoded_token": self.token_text(t)}
                    for r, (t, lp) in enumerate(entry.top)}
            item[str(entry.token_id)] = {"logprob": entry.logprob, "rank": entry.rank,
                                         "decoded_token": self.token_text(entry.token_id)}
            out.append(item)
        return out


def _choice_param(body: Body) -> str:
    return "guided_choice" if body.has("guided_choice") else "structured_outputs.choice"


def _allowed_choices(choice_ids: tuple[int, ...], allowed: tuple[int, ...] | None, body: Body) -> tuple[int, ...]:
    """A single-token choice's tokens that allowed_token_ids (if given) allows too: both apply,
    as they do to a compiled choice's mask."""
    if allowed is None:
        return choice_ids
    permitted = set(allowed)
    kept = tuple(t for t in choice_ids if t in permitted)
    if not kept:
        raise bad_request(f"'allowed_token_ids' allows none of the choices in '{_choice_param(body)}'",
                          "allowed_token_ids")
    return kept


def _refuse_unsupported(body: Body) -> None:
    # vLLM's other ways to shape the answer that this server does not have: beam search, banned
    # word sequences, server-side logits processors. Each was ignored as unknown.
    if body.bool("use_beam_search"):
        raise bad_request("'use_beam_search' is not supported: this server samples or decodes greedily",
                          "use_beam_search")
    for name in ("bad_words", "logits_processors"):
        if body.list(name):
            raise bad_request(f"'{name}' is not supported by this server", name)
    # vLLM's per-tenant prefix-cache salt. Ignored, a tenant relying on it to keep its prompts'
    # cache hits (and their timing) from other tenants was not isolated at all.
    if body.has("cache_salt"):
        raise bad_request("'cache_salt' is not supported: this server's prefix cache is shared by every "
                          "request (start it with --no-enable-prefix-caching to share nothing)", "cache_salt")


def _with_metrics(finals: dict[int, RequestOutput], streams: list[RequestStream]) -> ItemsView[int, RequestOutput]:
    """A stream's last outputs so far, each with its request's metrics (known from its first
    output; a last one has none until the request ends)."""
    for index, out in finals.items():
        out.metrics = out.metrics or streams[index].metrics
    return finals.items()
