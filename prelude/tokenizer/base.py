"""The tokenizer contract every backend (fasttoken, HF `tokenizers`) fulfils."""
from __future__ import annotations

from abc import ABC, abstractmethod
from functools import cached_property
from typing import NamedTuple, Sequence

from prelude._fasttoken.plan import CHAR_TO_BYTE

METASPACE = "\u2581"  # SentencePiece's word mark, a space where the text is read


class DecodeStep(NamedTuple):
    """Result of one streaming decode step: the new text and the offsets for the next step."""

    text: str
    prefix_offset: int
    read_offset: int


def longest_first(n1: int, n2: int, budget: int) -> tuple[int, int]:
    """How many tokens each text of a pair keeps within `budget`, as HF tokenizers' longest-first
    truncation keeps them: the longer is cut, down to the shorter's length at most, and where
    that is not enough both are cut to half the budget."""
    if n1 + n2 <= budget:
        return n1, n2
    short, long = min(n1, n2), max(n1, n2)
    long = short if short > budget else max(short, budget - short)
    if short + long > budget:
        short = budget // 2
        long = short + budget % 2
    return (long, short) if n1 > n2 else (short, long)


class Tokenizer(ABC):
    """Encode/decode for one immutable tokenizer.json. Implementations are reentrant:
    any number of threads may call any method at once."""

    backend: str
    # Why this backend serves when fasttoken was asked for (auto) and could not: the banner shows it.
    fallback_reason: str | None = None
    # Set by each backend at load time.
    _vocab_size: int
    _special_ids: frozenset[int]

    @property
    def vocab_size(self) -> int:
        """Number of ids including added tokens (HF `get_vocab_size(with_added_tokens=True)`)."""
        return self._vocab_size

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids of added tokens flagged `special` (what `skip_special_tokens` drops)."""
        return self._special_ids

    @abstractmethod
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        return [self.encode(text, add_special_tokens) for text in texts]

    def encode_pairs(self, firsts: Sequence[str], seconds: Sequence[str], limit: int | None = None,
                     side: str = "right") -> list[list[int]]:
        """Text pairs, each as one sequence (a cross-encoder's query and document), by the file's
        pair template where the backend applies it ([CLS] A [SEP] B [SEP] for BERT); else the
        first text with its special tokens followed by the second without. `limit`: each pair
        cut to at most that many tokens, the longer text first (HF's longest-first truncation),
        each text from `side`, its special tokens kept."""
        pairs = []
        for a, b in zip(firsts, seconds):
            first, second = self.encode(a), self.encode(b, add_special_tokens=False)
            if limit is not None and len(first) + len(second) > limit:
                head, tail = self._template_ends
                text = first[head:len(first) - tail]
                n1, n2 = longest_first(len(text), len(second), max(limit - head - tail, 0))
                first = first[:head] + _kept(text, n1, side) + first[len(first) - tail:]
                second = _kept(second, n2, side)
            pairs.append(first + second)
        return pairs

    def truncate(self, ids: list[int], limit: int, side: str) -> list[int]:
        """One text's ids, encoded with its special tokens, cut to at most `limit` from `side`
        ("left" or "right") with the special tokens its template adds at either end kept, as HF
        tokenizers truncate: [CLS] and [SEP] stay where slicing the ids dropped one of them."""
        if len(ids) <= limit:
            return ids
        head, tail = self._template_ends
        keep = max(limit - head - tail, 0)
        return ids[:head] + _kept(ids[head:len(ids) - tail], keep, side) + ids[len(ids) - tail:]

    @cached_property
    def _template_ends(self) -> tuple[int, int]:
        """How many special tokens encoding one text adds before it and after it."""
        marked, plain = self.encode("a"), self.encode("a", add_special_tokens=False)
        for head in range(len(marked) - len(plain) + 1):
            if marked[head:head + len(plain)] == plain:
                return head, len(marked) - head - len(plain)
        return 0, 0

    @abstractmethod
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...

    @abstractmethod
    def token_to_id(self, token: str) -> int | None: ...

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (OpenAI's logprobs `bytes`). A byte-level BPE piece maps
        back to its raw bytes, so a character split across tokens has its bytes split too and
        the tokens' bytes join to the text; decoded alone, such a piece is U+FFFD, whose bytes
        join to nothing. A SentencePiece word piece ("▁world") is its text with the space that
        decoding it alone drops (the answer reads " world"). Any other token: its decoded text's
        bytes."""
        text = self.decode([token_id])
        piece = self.id_to_token(token_id)
        if piece is not None and all(c in CHAR_TO_BYTE for c in piece):
            raw = bytes(CHAR_TO_BYTE[c] for c in piece)
            # Only where the tokenizer's own decode agrees that the piece is those bytes: a
            # SentencePiece vocabulary's "é" is no byte-level piece.
            if raw.decode("utf-8", errors="replace") == text:
                return raw
        if piece is not None and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            # A SentencePiece byte-fallback piece (Llama-2, Mistral, Phi-3): the one byte it names,
            # where decoding it alone agrees (U+FFFD for a byte of a longer character).
            try:
                byte = bytes([int(piece[3:5], 16)])
            except ValueError:
                byte = b""
            if byte and byte.decode("utf-8", errors="replace") == text:
                return byte
        if piece is not None and piece.startswith(METASPACE):
            spaced = piece.replace(METASPACE, " ")
            if text == spaced[1:]:  # the decoder strips the space a text starts with
                return spaced.encode("utf-8")
        return text.encode("utf-8")

    @abstractmethod
    def id_to_token(self, token_id: int) -> str | None: ...

    def decode_step(
        self,
        ids: Sequence[int],
        prefix_offset: int,
        read_offset: int,
        skip_special_tokens: bool = False,
    ) -> DecodeStep:
        """Stateless streaming decode. `ids` is every id so far; `ids[prefix_offset:read_offset]`
        is context already emitted (decoded again so that decoders which strip or merge across
        token boundaries see it), `ids[read_offset:]` is new. Returns the text the new ids add,
        or "" while the tail is an incomplete UTF-8 sequence (it decodes to U+FFFD)."""
        prefix_text = self.decode(ids[prefix_offset:read_offset], skip_special_tokens)
        full_text = self.decode(ids[prefix_offset:], skip_special_tokens)
        if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
            return DecodeStep(full_text[len(prefix_text):], read_offset, len(ids))
        return DecodeStep("", prefix_offset, read_offset)


def _kept(ids: list[int], keep: int, side: str) -> list[int]:
    """ids cut to `keep` from `side`: "left" drops the first ones."""
    return ids[len(ids) - keep:] if side == "left" else ids[:keep]
