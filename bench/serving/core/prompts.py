"""Prompts of an exact token count, measured with the target's own tokenizer.

Prompts are runs of common English words, each with a leading space. Byte-level BPE tokenizers
(GPT-2, Llama 3, Qwen) split text into pre-tokens before merging, and " word" is always a whole
pre-token, so a prompt's token count is the sum of its words' counts. Each word is tokenized once
(remotely via POST /tokenize, or with a local tokenizer.json); a prompt of n tokens is then
assembled locally by picking words whose counts sum to exactly n, finishing with one-token words.
The same words give both the token-id form (exact by construction) and the text form (exact
when the tokenizer is additive, which PromptFactory.verify checks against the tokenizer).
"""
from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

import httpx

WORDS = tuple("""
a an the of and to in is it on at by we he she you for not but all can one two day sun sea red big
old new hot top cat dog car box cup map pen run sit eat see way man boy art
able about above across after again against almost alone along already also always among animal
answer apple around autumn back bank basket before begin behind below better between bird black
blue board boat body book bottle bread bridge bright bring brother build busy cable camera candle
carry castle center chair change cheap chicken circle city clean clock cloud coffee color common
corner country cousin create cross dance dark daughter decide deep desert dinner doctor dollar door
dream drink early earth east engine evening every family farmer field figure finger finish flower
follow forest garden gentle glass golden green ground guitar happy harbor heavy hello hidden hill
history horse hotel hungry island jacket journey kitchen ladder language large laugh lemon letter
light little market matter meadow middle minute mirror modern money morning mountain music narrow
nature north number ocean office orange paper pencil people pepper picture planet pocket quiet
rabbit river road rocket season secret silver simple sister small soft south spring square station
stone story street summer table teacher thunder ticket today tomorrow travel valley village water
west window winter wooden world yellow young
""".split())


CONTEXT = "the"


class TokenizerError(RuntimeError):
    """The target cannot tokenize for us, or its tokenizer breaks the additivity assumption."""


class TextTokenizer(Protocol):
    async def encode(self, text: str, add_special_tokens: bool) -> list[int]: ...


class RemoteTokenizer:
    """The target's POST /tokenize (Prelude and vLLM: {"prompt"} -> {"tokens"})."""

    def __init__(self, client: httpx.AsyncClient, model: str | None = None):
        self.client = client
        self.model = model

    async def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        body: dict = {"prompt": text, "add_special_tokens": add_special_tokens}
        if self.model:
            body["model"] = self.model
        try:
            resp = await self.client.post("/tokenize", json=body)
        except httpx.HTTPError as exc:
            raise TokenizerError(f"POST /tokenize failed: {exc!r}") from None
        if resp.status_code != 200:
            raise TokenizerError(f"POST /tokenize answered {resp.status_code}: {resp.text[:200]}; "
                                 "pass --tokenizer PATH/tokenizer.json to tokenize locally")
        return list(resp.json()["tokens"])


class LocalTokenizer:
    """A tokenizer.json (or a model directory holding one) loaded with HF `tokenizers`."""

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer

        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        self._tok = Tokenizer.from_file(str(path))
        # Some tokenizer.json files carry truncation or padding; counts must be the raw ones.
        self._tok.no_truncation()
        self._tok.no_padding()

    async def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of words: its token ids (no special tokens) and its text."""

    ids: tuple[int, ...]
    text: str


@dataclass(frozen=True, slots=True)
class Prompt:
    ids: list[int]  # special tokens included, as the server would add them to the text
    text: str

    @property
    def num_tokens(self) -> int:
        return len(self.ids)


class PromptFactory:
    def __init__(self, pieces: dict[str, tuple[int, ...]], prefix: Sequence[int] = (),
                 suffix: Sequence[int] = (), leading_space: bool = True):
        self.pieces = {w: p for w, p in pieces.items() if p}
        self.leading_space = leading_space
        self.prefix = tuple(prefix)  # special tokens the tokenizer puts before text (BOS)
        self.suffix = tuple(suffix)  # and after it (EOS for some tokenizers)
        self.words = sorted(self.pieces)
        self.one_token_words = [w for w in self.words if len(self.pieces[w]) == 1]
        if not self.one_token_words:
            raise TokenizerError("no word in the word list is a single token; cannot hit exact lengths")

    @classmethod
    async def from_tokenizer(cls, tokenizer: TextTokenizer, concurrency: int = 16) -> "PromptFactory":
        gate = asyncio.Semaphore(concurrency)

        context = list(await tokenizer.encode(CONTEXT, False))

        async def piece(word: str) -> tuple[int, ...]:
            """The tokens " word" adds after another word. Measured in context because
            SentencePiece-style tokenizers treat a text's first space specially."""
            async with gate:
                ids = await tokenizer.encode(f"{CONTEXT} {word}", False)
                if ids[:len(context)] == context:
                    return tuple(ids[len(context):])
                return tuple(await tokenizer.encode(" " + word, False))

        pieces = await asyncio.gather(*(piece(w) for w in WORDS))
        bare = list(await tokenizer.encode(" hello", False))
        full = list(await tokenizer.encode(" hello", True))
        prefix, suffix = split_specials(full, bare)
        # SentencePiece normalizers that prepend "▁" turn a leading space into an extra token;
        # such texts start without it (byte-level BPEs keep it: " hello" is their in-context form).
        leading_space = bare == list(await piece("hello"))
        return cls(dict(zip(WORDS, pieces)), prefix, suffix, leading_space)

    @property
    def num_special(self) -> int:
        return len(self.prefix) + len(self.suffix)

    def segment(self, n: int, rng: random.Random) -> Segment:
        """Exactly n tokens of random words: any word while it fits, then one-token words."""
        if n < 0:
            raise ValueError(f"segment length must be >= 0, got {n}")
        words: list[str] = []
        ids: list[int] = []
        while len(ids) < n:
            left = n - len(ids)
            word = rng.choice(self.words)
            if len(self.pieces[word]) > left:
                word = rng.choice(self.one_token_words)
            words.append(word)
            ids.extend(self.pieces[word])
        return Segment(tuple(ids), "".join(" " + w for w in words))

    def prompt(self, *segments: Segment, with_suffix: bool = True) -> Prompt:
        """Segments joined, with the tokenizer's special tokens around them (only those before
        them for a text the server will extend, such as a score query)."""
        ids = list(self.prefix)
        for s in segments:
            ids.extend(s.ids)
        if with_suffix:
            ids.extend(self.suffix)
        text = "".join(s.text for s in segments)
        return Prompt(ids, text if self.leading_space else text[1:])

    def body_len(self, total: int) -> int:
        """Tokens of words in a prompt of `total` tokens (the rest are special tokens)."""
        if total <= self.num_special:
            raise ValueError(f"a prompt needs more than {self.num_special} tokens (its special tokens)")
        return total - self.num_special

    def exact(self, total: int, rng: random.Random) -> Prompt:
        return self.prompt(self.segment(self.body_len(total), rng))

    async def verify(self, tokenizer: TextTokenizer, prompts: Sequence[Prompt]) -> None:
        """Tokenizes the text form of `prompts` and checks it gives exactly their ids' count."""
        for p in prompts:
            got = len(await tokenizer.encode(p.text, True))
            if got != p.num_tokens:
                raise TokenizerError(
                    f"a {p.num_tokens}-token prompt's text tokenizes to {got} tokens: this tokenizer "
                    "is not additive over words; send token ids (--prompt-format ids)")


def split_specials(full: Sequence[int], bare: Sequence[int]) -> tuple[list[int], list[int]]:
    """The special tokens a tokenizer adds around `bare` (the same text without them)."""
    for start in range(len(full) - len(bare) + 1):
        if list(full[start:start + len(bare)]) == list(bare):
            return list(full[:start]), list(full[start + len(bare):])
    raise TokenizerError("the tokenizer changes a text's tokens when adding special tokens")
