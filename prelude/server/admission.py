"""Admission: turns validated request fields into normalized engine Requests: tokenization
(inline when short, in a thread pool when long), length and vocabulary checks, sampling params."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Callable, Sequence, TypeVar

from prelude._fasttoken.core import first_invalid_id
from prelude.contract.sampling import SamplingParams
from prelude.engine.request import ExecutionClass, Task, execution_class
from prelude.server.errors import bad_request, context_too_long
from prelude.server.protocol import Body
from prelude.tokenizer import Tokenizer

# Below this many characters, a thread hop costs more than encoding on the loop.
INLINE_CHARS = 2048
# Below this many token ids, checking or decoding them on the loop costs well under a millisecond;
# a 32 MiB body's millions of ids would hold the loop for a large part of a second.
INLINE_IDS = 4096
T = TypeVar("T")
# Every body field sampling() reads (tests/server/test_sampling_kept.py holds it to the code).
SAMPLING_FIELDS = frozenset({
    "min_tokens", "spaces_between_special_tokens", "logit_bias", "top_k", "temperature", "top_p", "min_p", "seed",
    "stop", "stop_token_ids", "ignore_eos", "allowed_token_ids", "skip_special_tokens", "presence_penalty",
    "frequency_penalty", "repetition_penalty", "include_stop_str_in_output"})
READ_SAMPLING_KEPT = 256  # kinds of sampling fields (with max_tokens and logprobs) whose parameters are kept


class Admission:
    def __init__(self, tokenizer: Tokenizer, workers: int, max_model_len: int, kv_capacity_tokens: int,
                 max_logprobs: int, disable_oneshot: bool = False, eos_token_ids: tuple[int, ...] = (),
                 model_vocab_size: int | None = None, sampling_defaults: dict[str, float] | None = None):
        self.tokenizer = tokenizer
        # The ids a request may name: those the tokenizer knows and the model embeds. A tokenizer
        # may know more (added tokens the checkpoint's embedding never got), and such an id in a
        # prompt, logit_bias or allowed_token_ids failed its step (500) instead of a 400.
        self.vocab_size = min(tokenizer.vocab_size, model_vocab_size or tokenizer.vocab_size)
        self.max_model_len = max_model_len
        self.kv_capacity_tokens = kv_capacity_tokens
        self.max_logprobs = max_logprobs
        self.disable_oneshot = disable_oneshot
        self.eos_token_ids = eos_token_ids
        # The model's generation_config.json defaults for fields a request leaves out, as in vLLM.
        self.defaults = sampling_defaults or {}
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="prelude-tokenize")
        self._read: dict[tuple, SamplingParams] = {}

    def close(self) -> None:
        self._pool.shutdown(wait=False)

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if len(text) < INLINE_CHARS:
            return self._embeddable(self.tokenizer.encode(text, add_special_tokens))
        return self._embeddable(await self.offload(partial(self.tokenizer.encode, text, add_special_tokens)))

    async def encode_many(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        if sum(map(len, texts)) < INLINE_CHARS:
            encoded = [self.tokenizer.encode(t, add_special_tokens) for t in texts]
        else:
            encoded = await self.offload(partial(self.tokenizer.encode_batch, list(texts), add_special_tokens))
        for ids in encoded:
            self._embeddable(ids)
        return encoded

    async def encode_pairs(self, firsts: Sequence[str], seconds: Sequence[str],
                           limit: int | None = None, side: str = "right") -> list[list[int]]:
        """Text pairs (a cross-encoder's query and document), each as one sequence (of at most
        `limit` tokens, cut longest first, each text from `side`)."""
        encode = partial(self.tokenizer.encode_pairs, firsts, seconds, limit, side)
        encoded = encode() if sum(map(len, firsts)) + sum(map(len, seconds)) < INLINE_CHARS else \
            await self.offload(encode)
        for ids in encoded:
            self._embeddable(ids)
        return encoded

    def _embeddable(self, ids: list[int]) -> list[int]:
        """Text encoded to ids the model embeds (checked only when the tokenizer knows more)."""
        if self.vocab_size < self.tokenizer.vocab_size and ids and max(ids) >= self.vocab_size:
            raise bad_request(f"the text encodes to token {max(ids)}, which this model has no embedding for")
        return ids

    async def offload(self, work: Callable[[], T]) -> T:
        """Runs a long piece of a request's preparation (a long text to encode, a chat template
        over many messages, a long id list) in the tokenizer pool. It may hold the GIL, but the
        loop gets it back every switch interval instead of waiting for the whole piece."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, work)

    async def checked_ids(self, ids: Sequence, param: str) -> list[int]:
        """check_ids, in the tokenizer pool when the list is long."""
        if len(ids) <= INLINE_IDS:
            return self.check_ids(ids, param)
        return await self.offload(partial(self.check_ids, ids, param))

    async def decode(self, ids: list[int]) -> str:
        if len(ids) <= INLINE_IDS:
            return self.tokenizer.decode(ids)
        return await self.offload(partial(self.tokenizer.decode, ids))

    def check_context(self, num_prompt_tokens: int, prompt_param: str = "prompt") -> None:
        """Every prompt must fit the context (checked before anything else about it)."""
        if num_prompt_tokens > self.max_model_len:
            raise context_too_long(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your "
                f"prompt has {num_prompt_tokens} tokens. Please reduce the length of the prompt.", prompt_param)

    def check_ids(self, ids: Sequence, param: str) -> list[int]:
        if not ids:
            raise bad_request(f"'{param}' must not be empty", param)
        checked = list(ids)
        bad = first_invalid_id(checked, self.vocab_size)
        if bad >= 0:
            raise bad_request(f"'{param}' contains {checked[bad]!r}, not a token id in [0, {self.vocab_size})", param)
        return checked

    def output_budget(self, num_prompt_tokens: int, max_tokens: int | None, param: str = "max_tokens",
                      prompt_param: str = "prompt", task: Task = Task.GENERATE) -> int:
        """The effective max_tokens: the request's, or all that fits when it gave none.

        Every request must fit the context. Only Decode work keeps KV across steps, so only it
        must also fit the KV pool: a OneShot row (one forward) computes without storing what
        the pool cannot hold."""
        self.check_context(num_prompt_tokens, prompt_param)
        room = self.max_model_len - num_prompt_tokens
        oneshot = max_tokens is not None and \
            execution_class(task, max_tokens, self.disable_oneshot) is ExecutionClass.ONESHOT
        if max_tokens is None:
            if room < 1 and task is Task.GENERATE:
                raise context_too_long(
                    f"This model's maximum context length is {self.max_model_len} tokens. However, your "
                    f"prompt has {num_prompt_tokens} tokens, leaving no room to generate. Please reduce the "
                    "length of the prompt.", prompt_param)
            max_tokens = room if oneshot else min(room, self.kv_capacity_tokens - num_prompt_tokens)
            if max_tokens < 1 and task is Task.GENERATE:
                raise bad_request(
                    f"the prompt's {num_prompt_tokens} tokens leave no room to generate: the server's KV "
                    f"cache holds {self.kv_capacity_tokens} tokens per request", prompt_param)
        cap = self.defaults.get("max_tokens")  # generation_config.json's max_new_tokens: vLLM's cap on any request
        if cap is not None:
            max_tokens = min(max_tokens, int(cap))
        # The prompt alone leaves no room for any completion: shortening it is the fix, whatever
        # max_tokens says (a smaller max_tokens cannot help), so the error names the prompt.
        if num_prompt_tokens + max_tokens > self.max_model_len:
            raise context_too_long(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                f"requested {num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} in the prompt, "
                f"{max_tokens} in the completion). Please reduce the length of the prompt or completion.",
                prompt_param if num_prompt_tokens >= self.max_model_len else param)
        if not oneshot and num_prompt_tokens + max_tokens > self.kv_capacity_tokens:
            if num_prompt_tokens >= self.kv_capacity_tokens:
                raise bad_request(
                    f"the prompt's {num_prompt_tokens} tokens fill the server's KV cache of "
                    f"{self.kv_capacity_tokens} tokens per request, leaving no room to generate; "
                    "shorten the prompt", prompt_param)
            raise bad_request(
                f"the request needs {num_prompt_tokens + max_tokens} tokens of KV cache but the server "
                f"holds {self.kv_capacity_tokens}; reduce the prompt or max_tokens", param)
        return max_tokens

    def sampling(self, body: Body, max_tokens: int, logprobs: int | None) -> SamplingParams:
        """Sampling fields shared by completions and chat (OpenAI names plus vLLM's extensions)."""
        if logprobs is not None and logprobs > self.max_logprobs:
            raise bad_request(f"requested {logprobs} logprobs; this server allows at most "
                              f"{self.max_logprobs} (--max-logprobs)",
                              "top_logprobs" if body.has("top_logprobs") else "logprobs")  # chat's, completions'
        # Requests name the same few sampling fields with the same values, one after another (a
        # judge's temperature 0, a classifier's logprobs): what reading them gives, field by
        # field and checked (4.6 us of the event loop a request), is kept by what they said.
        # Each value's type is part of the key: 1, 1.0 and true are equal, and not equally valid.
        named = tuple((name, type(value), value) for name, value in body.data.items()
                      if value is not None and name in SAMPLING_FIELDS)
        key = (max_tokens, logprobs, named)
        try:
            params = self._read.get(key)
        except TypeError:  # a list or an object among the values (stop strings, logit_bias)
            return self._read_sampling(body, max_tokens, logprobs)
        if params is None:
            if len(self._read) >= READ_SAMPLING_KEPT:
                self._read.clear()
            params = self._read[key] = self._read_sampling(body, max_tokens, logprobs)
        else:
            body.asked.update(name for name, _, _ in named)
        return params

    def _read_sampling(self, body: Body, max_tokens: int, logprobs: int | None) -> SamplingParams:
        min_tokens = body.int("min_tokens", 0, lo=0, hi=max_tokens)
        body.bool("spaces_between_special_tokens", True)  # a slow-tokenizer option: fast decoding has none
        logit_bias: tuple[tuple[int, float], ...] = ()
        bias = body.object("logit_bias")
        if bias is not None:
            items = []
            for key in bias.data:
                try:
                    token = int(key)
                except ValueError:
                    raise bad_request(f"'logit_bias' keys must be token ids, got {key!r}", "logit_bias") from None
                if not 0 <= token < self.vocab_size:
                    raise bad_request(f"'logit_bias' token {token} is not in [0, {self.vocab_size})", "logit_bias")
                value = bias.float(key, lo=-100.0, hi=100.0)
                if value is None:  # read as absent, it reached the sampler as NaN and forced its token
                    raise bias.invalid(key, "must be a number, got null")
                items.append((token, value))
            logit_bias = tuple(items)
        # top_k: -1 or 0 turn the cut off; a cut wider than the vocabulary is no cut (clamped).
        defaults = self.defaults
        top_k = body.int("top_k", int(defaults.get("top_k", 0)), lo=-1)
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=body.float("temperature", float(defaults.get("temperature", 1.0)), lo=0.0),
            top_p=body.float("top_p", float(defaults.get("top_p", 1.0)), lo=1e-9, hi=1.0),
            top_k=0 if top_k >= self.vocab_size else max(top_k, 0),
            min_p=body.float("min_p", float(defaults.get("min_p", 0.0)), lo=0.0, hi=1.0),
            seed=body.int("seed"),
            stop=body.str_list("stop", max_items=16),
            stop_token_ids=body.int_list("stop_token_ids", hi=self.vocab_size - 1) or (),
            ignore_eos=body.bool("ignore_eos"),
            logprobs=logprobs,
            logit_bias=logit_bias,
            allowed_token_ids=self._allowed_ids(body, self._blocked_before_min(body, min_tokens)),
            skip_special_tokens=body.bool("skip_special_tokens", True),
            presence_penalty=body.float("presence_penalty", 0.0, lo=-2.0, hi=2.0),
            frequency_penalty=body.float("frequency_penalty", 0.0, lo=-2.0, hi=2.0),
            repetition_penalty=body.float("repetition_penalty", float(defaults.get("repetition_penalty", 1.0)),
                                          lo=0.01, hi=10.0),
            min_tokens=min_tokens,
            min_tokens_blocked=self._blocked_before_min(body, min_tokens),
            include_stop_str_in_output=body.bool("include_stop_str_in_output"),
        )

    def _blocked_before_min(self, body: Body, min_tokens: int) -> tuple[int, ...]:
        """The ids that would end generation (EOS unless ignored, stop token ids) cannot be
        sampled before min_tokens, as in vLLM."""
        if not min_tokens:
            return ()
        eos = () if body.bool("ignore_eos") else self.eos_token_ids
        return tuple(dict.fromkeys((*eos, *(body.int_list("stop_token_ids", hi=self.vocab_size - 1) or ()))))

    def _allowed_ids(self, body: Body, blocked: tuple[int, ...]) -> tuple[int, ...] | None:
        """allowed_token_ids, each once (a repeated id stood twice in top_logprobs, in place of
        another), unless they allow no token: none at all, or only ids that min_tokens blocks
        (every logit masked, the sampler answered a token outside them)."""
        allowed = body.int_list("allowed_token_ids", hi=self.vocab_size - 1)
        if allowed is not None and not allowed:
            raise body.invalid("allowed_token_ids", "must not be empty (it would allow no token)")
        if allowed is not None and blocked and set(allowed) <= set(blocked):
            raise body.invalid("allowed_token_ids", "allows only tokens that end generation, which min_tokens "
                                                    "blocks: no token could be generated")
        return None if allowed is None else tuple(dict.fromkeys(allowed))
