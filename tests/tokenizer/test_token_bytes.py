"""A token's own bytes (chat logprobs' `bytes`, OpenAI's field for joining characters split
across tokens): on byte-level vocabularies the tokens' bytes join to exactly the text's UTF-8,
CJK and emoji split mid-character included, on both backends."""
from __future__ import annotations

import pytest

from prelude.tokenizer.fast import FastTokenizer
from prelude.tokenizer.hf import HFTokenizer
from tests.data import tokenizer_dir

TEXTS = ["Hello world, 你好! def f(x): return x**2", "判断：这个回答是否安全？是 🙂👍🏽 naïve café",
         "\u200b\ttabs and\r\nnewlines\u00a0", "罕见字：𠜎𠜱𡃁 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 🫠🪿ꙮ",
         "<|im_end|> is special only as an added token"]


@pytest.mark.parametrize("backend", [FastTokenizer, HFTokenizer])
@pytest.mark.parametrize("name", ["qwen3", "llama3", "gpt2"])
def test_byte_level_tokens_bytes_join_to_the_text(name, backend):
    tok = backend(tokenizer_dir(name) / "tokenizer.json")
    split = 0  # tokens holding part of a character: their decoded text alone is U+FFFD
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert b"".join(tok.token_bytes(i) for i in ids) == text.encode("utf-8"), (name, text)
        split += sum("\ufffd" in tok.decode([i]) for i in ids)
    assert split > 0, "no text split a character: the case this guards was not exercised"


@pytest.mark.parametrize("backend", [FastTokenizer, HFTokenizer])
def test_byte_fallback_pieces_are_their_bytes(backend):
    """A SentencePiece vocabulary spells a character it lacks as <0xNN> pieces (Llama-2, Mistral,
    Phi-3): each is its byte, so they join to the character (each was U+FFFD's three bytes)."""
    tok = backend(tokenizer_dir("phi3-mini") / "tokenizer.json")
    ids = tok.encode("🦀😀", add_special_tokens=False)
    fallback = [i for i in ids if (tok.id_to_token(i) or "").startswith("<0x")]
    assert len(fallback) == 8
    assert b"".join(tok.token_bytes(i) for i in fallback) == "🦀😀".encode("utf-8")
    assert tok.token_bytes(tok.token_to_id("<0x41>")) == b"A"


@pytest.mark.parametrize("backend", [FastTokenizer, HFTokenizer])
def test_sentencepiece_word_pieces_keep_their_space(backend):
    """A SentencePiece word piece ("▁world") is " world" in the text: decoded alone it loses the
    space, and an answer's bytes joined to "worldworld" where it read " world world"."""
    tok = backend(tokenizer_dir("phi3-mini") / "tokenizer.json")
    for text in TEXTS[:2]:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.id_to_token(ids[0]).startswith("\u2581")
        # A text is encoded with SentencePiece's leading word mark, read as a space after a prompt.
        assert b"".join(tok.token_bytes(i) for i in ids) == (" " + text).encode("utf-8"), text
