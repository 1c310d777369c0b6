"""Workloads: what each benchmark request asks for. Request bodies are built and serialized
before a run starts, so the client spends its measured time sending, not composing.

- fixed: distinct prompts of an exact input length, generating an exact output length (the
  paper's Table 2 shapes: 128/1, 512/1, 128/32).
- embed: /v1/embeddings of distinct prompts of an exact length.
- prompt-logprobs: completions of distinct prompts of an exact length asking for every prompt
  token's logprob (vLLM's prompt_logprobs) and one output token.
- choice: completions of distinct prompts of an exact length whose one-token answer is one of
  two labels (vLLM's guided_choice): a judge's or router's verdict.
- score: the decision endpoint /v1/score in SGLang's label-token shape, one shared query
  against several short items per request.
- recommend: PrefillOnly's recommendation shape, scaled down: a few users with long shared
  profiles, each request one short item for a random user, answered with one token.
- system-prompt: Preble's shape: a few long shared system prompts, distinct questions.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any, ClassVar

from bench.serving.core.prompts import Prompt, PromptFactory, Segment

COMPLETIONS = "/v1/completions"
SCORE = "/v1/score"
EMBEDDINGS = "/v1/embeddings"


@dataclass(frozen=True, slots=True)
class Job:
    """One HTTP request, ready to send."""

    path: str
    body: bytes
    stream: bool
    prompt_tokens: int  # planned; the server's usage replaces it when reported
    output_tokens: int  # requested (0: nothing generated)


@dataclass(frozen=True, slots=True)
class Options:
    """Request options shared by every workload."""

    model: str | None
    prompt_format: str = "ids"  # "ids": prompt as token ids (exact); "text": as a string
    ignore_eos: bool = True
    # None sends no temperature: servers then sample at their default (T=1), as vLLM's own
    # benchmark client does; 0.0 is greedy, which skips the sampler's work.
    temperature: float | None = 0.0


class Workload:
    path = COMPLETIONS
    output_len = 1
    rows_per_request = 1

    def __init__(self, factory: PromptFactory, options: Options):
        self.factory = factory
        self.options = options

    @property
    def label(self) -> str:
        raise NotImplementedError

    @property
    def streamed(self) -> bool:
        """Streaming is how TTFT is seen; a 1-token answer has no later tokens to separate."""
        return self.path == COMPLETIONS and self.output_len > 1

    def make_prompt(self, rng: random.Random) -> Prompt:
        raise NotImplementedError

    def jobs(self, count: int, rng: random.Random) -> list[Job]:
        return [self.completion(self.make_prompt(rng)) for _ in range(count)]

    def completion(self, prompt: Prompt) -> Job:
        body: dict = {
            "prompt": prompt.ids if self.options.prompt_format == "ids" else prompt.text,
            "max_tokens": self.output_len,
        }
        if self.options.temperature is not None:
            body["temperature"] = self.options.temperature
        if self.options.model:
            body["model"] = self.options.model
        if self.options.ignore_eos:
            body["ignore_eos"] = True  # vLLM's extension: outputs run to max_tokens exactly
        if self.streamed:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return Job(self.path, encode(body), self.streamed, prompt.num_tokens, self.output_len)


class Fixed(Workload):
    def __init__(self, factory: PromptFactory, options: Options, input_len: int, output_len: int):
        super().__init__(factory, options)
        factory.body_len(input_len)  # fails early on an impossible length
        self.input_len = input_len
        self.output_len = output_len

    @property
    def label(self) -> str:
        return f"fixed {self.input_len}/{self.output_len}"

    def make_prompt(self, rng: random.Random) -> Prompt:
        return self.factory.exact(self.input_len, rng)


class Embed(Fixed):
    """POST /v1/embeddings of one distinct prompt of exactly `input_len` tokens per request."""

    path = EMBEDDINGS

    def __init__(self, factory: PromptFactory, options: Options, input_len: int):
        super().__init__(factory, options, input_len, output_len=0)

    @property
    def label(self) -> str:
        return f"embed {self.input_len}"

    def completion(self, prompt: Prompt) -> Job:
        body: dict = {"input": prompt.ids if self.options.prompt_format == "ids" else prompt.text}
        if self.options.model:
            body["model"] = self.options.model
        return Job(self.path, encode(body), False, prompt.num_tokens, 0)


class OneToken(Fixed):
    """One distinct prompt of exactly `input_len` tokens per request, one token out, with the
    request fields `fields` adds (and without those named in `dropped`)."""

    name: ClassVar[str]
    fields: ClassVar[dict[str, Any]]
    dropped: ClassVar[tuple[str, ...]] = ()

    def __init__(self, factory: PromptFactory, options: Options, input_len: int):
        super().__init__(factory, options, input_len, output_len=1)

    @property
    def label(self) -> str:
        return f"{self.name} {self.input_len}"

    def completion(self, prompt: Prompt) -> Job:
        job = super().completion(prompt)
        body = {k: v for k, v in json.loads(job.body).items() if k not in self.dropped} | self.fields
        return Job(job.path, encode(body), job.stream, job.prompt_tokens, job.output_tokens)


class PromptLogprobs(OneToken):
    """prompt_logprobs=1: a judge or evaluator reading the prompt's own likelihood."""

    name, fields = "prompt-logprobs", {"prompt_logprobs": 1}


class Choice(OneToken):
    """The answer guided_choice [" yes", " no"]: a judge's or router's verdict (single tokens in
    Qwen3's and Llama's vocabularies, a grammar where a label takes more). No ignore_eos: the
    choice ends the answer."""

    name, fields, dropped = "choice", {"guided_choice": [" yes", " no"]}, ("ignore_eos",)


class SharedPrefix(Workload):
    """Prompts = one of `num_prefixes` shared prefixes + a distinct suffix. Prefixes are chosen
    uniformly; they are fixed when the workload is built, so every load level reuses them."""

    def __init__(self, factory: PromptFactory, options: Options, name: str, num_prefixes: int,
                 prefix_len: int, suffix_len: int, output_len: int, seed: int):
        super().__init__(factory, options)
        rng = random.Random(seed)
        self.name = name
        self.prefixes = [factory.segment(prefix_len, rng) for _ in range(num_prefixes)]
        self.prefix_len, self.suffix_len = prefix_len, suffix_len
        self.output_len = output_len

    @property
    def label(self) -> str:
        return f"{self.name} {len(self.prefixes)}x{self.prefix_len}+{self.suffix_len}/{self.output_len}"

    def make_prompt(self, rng: random.Random) -> Prompt:
        prefix = rng.choice(self.prefixes)
        return self.factory.prompt(prefix, self.factory.segment(self.suffix_len, rng))


class Score(Workload):
    """SGLang's /v1/score: {"query", "items", "label_token_ids", "apply_softmax"}. The server
    scores query + item for each item: the probabilities of the label tokens next."""

    path = SCORE
    output_len = 0

    def __init__(self, factory: PromptFactory, options: Options, query_len: int, item_len: int,
                 items: int, label_token_ids: tuple[int, int], seed: int, fresh_query: bool = False):
        super().__init__(factory, options)
        self.rng = random.Random(seed)
        self.query_len, self.item_len, self.items = query_len, item_len, items
        self.rows_per_request = items
        self.fresh_query = fresh_query  # a new query per request: only items of one request share it
        self.query = self.make_query()
        self.label_token_ids = label_token_ids

    def make_query(self) -> Prompt:
        # The server joins query and item into one prompt: only the query starts with specials.
        return self.factory.prompt(self.factory.segment(self.query_len - len(self.factory.prefix), self.rng),
                                   with_suffix=False)

    @property
    def label(self) -> str:
        return f"score q{self.query_len} {self.items}x{self.item_len}" + (" fresh" if self.fresh_query else "")

    def jobs(self, count: int, rng: random.Random) -> list[Job]:
        return [self.score_job([self.factory.segment(self.item_len, rng) for _ in range(self.items)])
                for _ in range(count)]

    def score_job(self, items: list[Segment]) -> Job:
        ids = self.options.prompt_format == "ids"
        query = self.make_query() if self.fresh_query else self.query
        body: dict = {
            "query": query.ids if ids else query.text,
            "items": [list(s.ids) if ids else s.text for s in items],
            "label_token_ids": list(self.label_token_ids),
            "apply_softmax": True,
        }
        if self.options.model:
            body["model"] = self.options.model
        tokens = sum(query.num_tokens + len(s.ids) for s in items)
        return Job(self.path, encode(body), False, tokens, 0)


def encode(body: dict) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()
