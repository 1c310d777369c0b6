"""Exact-length prompt construction and the workloads built on it, with a fake word-additive
tokenizer (the real tokenizers are exercised by the end-to-end smoke test)."""
from __future__ import annotations

import asyncio
import json
import random

import pytest

from bench.serving.core.prompts import WORDS, LocalTokenizer, PromptFactory, TokenizerError, split_specials
from bench.serving.core.workloads import Fixed, Options, Score, SharedPrefix
from tests.data import tokenizer_dir

BOS = 1


class FakeTokenizer:
    """One token per started 3 letters of each space-led word (so words are 1-5 tokens), a BOS
    when asked for special tokens."""

    def __init__(self):
        self.vocab: dict[str, int] = {}

    def _id(self, piece: str) -> int:
        return self.vocab.setdefault(piece, 10 + len(self.vocab))

    async def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        ids = [BOS] if add_special_tokens else []
        for word in text.split(" "):
            if word:
                ids += [self._id((" " if i == 0 else "") + word[i:i + 3]) for i in range(0, len(word), 3)]
        return ids


TOKENIZER = FakeTokenizer()


@pytest.fixture(scope="module")
def factory() -> PromptFactory:
    return asyncio.run(PromptFactory.from_tokenizer(TOKENIZER))


def test_factory_learns_word_pieces_and_special_tokens(factory):
    assert factory.prefix == (BOS,) and factory.suffix == ()
    assert set(factory.words) == set(WORDS)
    assert factory.one_token_words and all(len(factory.pieces[w]) == 1 for w in factory.one_token_words)
    assert max(len(p) for p in factory.pieces.values()) > 1  # multi-token words exercise the fill


@pytest.mark.parametrize("n", [2, 3, 17, 128, 512, 4096])
def test_prompts_have_exactly_the_requested_token_count(factory, n):
    rng = random.Random(n)
    for _ in range(20):
        prompt = factory.exact(n, rng)
        assert prompt.num_tokens == n and prompt.ids[0] == BOS
        # The text form tokenizes back to the same ids: safe to send either.
        assert asyncio.run(TOKENIZER.encode(prompt.text, True)) == prompt.ids


def test_segments_are_exact_and_random(factory):
    rng = random.Random(0)
    assert factory.segment(0, rng).ids == ()
    lengths = {len(factory.segment(n, rng).ids) == n for n in range(1, 200)}
    assert lengths == {True}
    assert factory.segment(64, random.Random(1)) != factory.segment(64, random.Random(2))
    assert factory.segment(64, random.Random(1)) == factory.segment(64, random.Random(1))
    with pytest.raises(ValueError):
        factory.exact(1, rng)  # only room for the BOS


def test_verify_accepts_additive_and_rejects_other_tokenizers(factory):
    prompts = [factory.exact(100, random.Random(i)) for i in range(3)]
    asyncio.run(factory.verify(TOKENIZER, prompts))

    class Merging(FakeTokenizer):
        async def encode(self, text, add_special_tokens):
            return (await super().encode(text, add_special_tokens))[:-1]

    with pytest.raises(TokenizerError):
        asyncio.run(factory.verify(Merging(), prompts))


def test_split_specials():
    assert split_specials([1, 5, 6, 2], [5, 6]) == ([1], [2])
    assert split_specials([5, 6], [5, 6]) == ([], [])
    with pytest.raises(TokenizerError):
        split_specials([7, 8], [5, 6])


def test_fixed_workload_jobs(factory):
    one = Fixed(factory, Options("m"), 128, 1)
    job = one.jobs(1, random.Random(0))[0]
    body = json.loads(job.body)
    assert (job.path, job.stream, job.prompt_tokens, job.output_tokens) == ("/v1/completions", False, 128, 1)
    assert len(body["prompt"]) == 128 and body["max_tokens"] == 1 and body["ignore_eos"] is True
    assert "stream" not in body and body["model"] == "m"

    many = Fixed(factory, Options(None, prompt_format="text"), 64, 32)
    jobs = many.jobs(50, random.Random(0))
    body = json.loads(jobs[0].body)
    assert jobs[0].stream and body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert isinstance(body["prompt"], str) and "model" not in body
    assert len({j.body for j in jobs}) == 50  # distinct prompts: no accidental prefix-cache hits


def test_shared_prefix_workload_reuses_a_few_prefixes(factory):
    w = SharedPrefix(factory, Options("m"), "recommend", num_prefixes=3, prefix_len=256, suffix_len=16,
                     output_len=1, seed=0)
    prompts = [json.loads(j.body)["prompt"] for j in w.jobs(60, random.Random(0))]
    assert all(len(p) == 1 + 256 + 16 for p in prompts)
    assert len({tuple(p[:257]) for p in prompts}) == 3
    assert len({tuple(p) for p in prompts}) == 60
    assert w.label == "recommend 3x256+16/1" and not w.streamed


def test_score_workload_shares_one_query(factory):
    w = Score(factory, Options("m"), query_len=64, item_len=8, items=4, label_token_ids=(11, 12), seed=0)
    jobs = w.jobs(5, random.Random(0))
    bodies = [json.loads(j.body) for j in jobs]
    assert {tuple(b["query"]) for b in bodies} == {tuple(w.query.ids)} and len(w.query.ids) == 64
    assert all(len(b["items"]) == 4 and all(len(i) == 8 for i in b["items"]) for b in bodies)
    assert bodies[0]["label_token_ids"] == [11, 12] and bodies[0]["apply_softmax"] is True
    assert jobs[0].path == "/v1/score" and jobs[0].prompt_tokens == 4 * (64 + 8) and jobs[0].output_tokens == 0


def test_text_starts_without_a_space_where_the_tokenizer_adds_its_own(factory):
    spaced = factory.exact(20, random.Random(0))
    unspaced = PromptFactory(factory.pieces, factory.prefix, leading_space=False).exact(20, random.Random(0))
    assert spaced.ids == unspaced.ids and spaced.text == " " + unspaced.text


# Byte-level BPE; byte-level with a BOS; SentencePiece-style (its own leading "▁").
@pytest.mark.parametrize("name", ["qwen3", "llama3.2-vision", "phi3-mini"])
def test_real_tokenizers_give_exact_ids_and_texts(name):
    tokenizer = LocalTokenizer(tokenizer_dir(name))
    factory = asyncio.run(PromptFactory.from_tokenizer(tokenizer))
    rng = random.Random(0)
    prompts = {n: factory.exact(n, rng) for n in (8, 100, 1000)}
    assert {n: p.num_tokens for n, p in prompts.items()} == {n: n for n in prompts}
    asyncio.run(factory.verify(tokenizer, list(prompts.values())))
