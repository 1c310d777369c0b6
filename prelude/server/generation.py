"""What the two generation endpoints (/v1/completions and /v1/chat/completions) share: fanning
a request out into n choices per prompt, structured single-token choices, and vLLM's
prompt_logprobs field (read and answered the same way by both)."""
from __future__ import annotations

from dataclasses import replace
from typing import AsyncIterator, Callable

from prelude.contract.batch import TokenLogprob
from prelude.engine.output import EngineError, RequestOutput
from prelude.engine.request import Request
from prelude.server.access_log import AccessEntry
from prelude.server.errors import bad_request
from prelude.server.protocol import Body
from prelude.server.serving import MAX_ITEMS, Serving
from prelude.server.streaming import SSE_DONE, sse, stream_error


class GenerationAPI(Serving):
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
        _refuse_constraints(body, structured)
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

    @staticmethod
    def stream_usage(body: Body) -> tuple[bool, bool]:
        """stream_options' include_usage (a usage chunk before [DONE]) and vLLM's
        continuous_usage_stats (with it, every chunk carries its choice's usage so far, as vLLM's
        do; ignored, a client reading per-chunk token counts found none)."""
        options = body.object("stream_options")
        if options is None:
            return False, False
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

    async def framed(self, rid: str, chunks: AsyncIterator[bytes], finals: dict[int, RequestOutput],
                     prompt_lens: list[int], usage_chunk: Callable[[dict], bytes] | None,
                     logged: AccessEntry | None, n: int = 1) -> AsyncIterator[bytes]:
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
            if usage_chunk is not None:
                yield usage_chunk(self.usage([finals[i] for i in sorted(finals)], prompt_lens))
            yield SSE_DONE
        except EngineError as exc:
            if logged is not None:
                logged.request_id, logged.error = rid, str(exc)
                recorded = True
            yield sse(stream_error(exc))
            yield SSE_DONE
        finally:
            if logged is not None and not recorded:  # cancelled or closed: the client went away
                logged.record(rid, finals.items(), n)
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


# Constraints on the answer's text that need a grammar engine at every sampled token. This server
# has none: answering free text to a request that asked for JSON looked like success, so they
# are refused, naming the field.
UNSUPPORTED_CONSTRAINTS = ("json", "regex", "grammar", "json_object", "structural_tag")


def _refuse_constraints(body: Body, structured: Body | None) -> None:
    unsupported = [f"structured_outputs.{key}" for key in UNSUPPORTED_CONSTRAINTS
                   if structured is not None and structured.has(key)]
    unsupported += [name for name in ("guided_json", "guided_regex", "guided_grammar") if body.has(name)]
    response_format = body.object("response_format")
    kind = response_format.str("type", "text") if response_format is not None else "text"
    if kind != "text":
        unsupported.append(f"response_format.type {kind!r}")
    if unsupported:
        raise bad_request(f"{unsupported[0]} is not supported: this server has no constrained decoding; "
                          "single-token choices (structured_outputs.choice) are", unsupported[0].split(" ")[0])
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
