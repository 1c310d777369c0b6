"""Incremental detokenization: streamed pieces concatenate to the full decode, stop strings cut
the text even when split across tokens, and a possible stop prefix is held back until resolved."""
from __future__ import annotations

import pytest

from prelude.engine.detokenize import IncrementalDetokenizer
from prelude.tokenizer import load
from prelude._fasttoken.plan import BYTE_TO_CHAR
from tests.data import tokenizer_dir


@pytest.fixture(scope="module")
def tokenizer(demo_model):
    return load(demo_model, "hf")


def stream(tokenizer, text, stop=(), prompt="Prompt:"):
    detok = IncrementalDetokenizer(tokenizer, tokenizer.encode(prompt), stop, skip_special_tokens=True)
    pieces, hit = [], None
    ids = tokenizer.encode(text)
    for i, token in enumerate(ids):
        hit = detok.add(token)
        pieces.append(detok.emit(final=hit is not None or i == len(ids) - 1))
        if hit is not None:
            break
    return pieces, hit


TEXTS = ["Hello world, the cache holds blocks.", "naïve café 你好世界 😀 done", "def f(x):\n    return x * 2\n"]


@pytest.mark.parametrize("text", TEXTS)
def test_pieces_concatenate_to_the_full_decode(tokenizer, text):
    pieces, hit = stream(tokenizer, text)
    assert hit is None
    assert "".join(pieces) == tokenizer.decode(tokenizer.encode(text))


def test_stop_string_split_across_tokens_cuts_before_it(tokenizer):
    text = "the judge says yes and then continues"
    pieces, hit = stream(tokenizer, text, stop=("s yes a",))
    assert hit == "s yes a"
    assert "".join(pieces) == "the judge say"


def test_partial_stop_is_held_back_then_released(tokenizer):
    text = "abc abd abe"
    pieces, hit = stream(tokenizer, text, stop=("abf",))
    assert hit is None
    assert "".join(pieces) == tokenizer.decode(tokenizer.encode(text))
    # While "ab" could still begin "abf", it was not emitted early.
    emitted = ""
    for piece in pieces[:-1]:
        emitted += piece
        assert not emitted.endswith("ab")


def test_earliest_of_several_stops_wins(tokenizer):
    pieces, hit = stream(tokenizer, "one two three four", stop=("four", "two"))
    assert hit == "two" and "".join(pieces) == "one "


def test_an_answer_that_ends_inside_a_character_keeps_the_characters_before_it(tokenizer):
    """A byte-level piece of whole characters then a character's first bytes ("рив" + half of the
    next) was held while the text ended in U+FFFD, and at the answer's end it was dropped whole:
    the answer's text lost "рив" with the partial character."""
    piece = next(i for i in range(tokenizer.vocab_size)
                 if (text := tokenizer.decode([i])).endswith("\ufffd") and len(text.rstrip("\ufffd")) >= 2)
    for ids in ([piece], [piece, piece, piece]):
        detok = IncrementalDetokenizer(tokenizer, tokenizer.encode("Prompt:"), (), skip_special_tokens=True)
        streamed = ""
        for token in ids:
            assert detok.add(token) is None
            streamed += detok.emit(final=False)
        assert detok.finish() is None
        streamed += detok.emit(final=True)
        assert streamed == tokenizer.decode(ids)[:-1]  # all but the last, partial character


def _byte_token(tokenizer, name: str, byte: int) -> int:
    """The token of one raw byte: SentencePiece's byte-fallback piece, or byte-level BPE's."""
    if name == "phi3-mini":
        return tokenizer.token_to_id(f"<0x{byte:02X}>")
    return tokenizer.token_to_id(BYTE_TO_CHAR[byte])


@pytest.mark.parametrize("name", ["phi3-mini", "qwen3"])
@pytest.mark.parametrize("backend", ["auto", "hf"])
def test_a_character_cut_by_the_answers_end_or_the_prompts_leaves_no_replacement_character(name, backend):
    """中 is E4 B8 AD. An answer cut after E4 B8 ended in "\ufffd\ufffd" on a byte-fallback
    tokenizer (one U+FFFD a byte: one was dropped); and a prompt sent back cut after E4 lost the
    character its answer completed (it read as the context's U+FFFD), as it lost the answer's
    whole characters after a dangling byte that nothing completed."""
    tokenizer = load(tokenizer_dir(name), backend)
    e4, b8, ad = (_byte_token(tokenizer, name, b) for b in (0xE4, 0xB8, 0xAD))
    prompt = tokenizer.encode("Hello", add_special_tokens=False)

    def answer(prompt_ids, ids):
        detok = IncrementalDetokenizer(tokenizer, prompt_ids, (), skip_special_tokens=True)
        text = ""
        for token in ids:
            assert detok.add(token) is None
            text += detok.emit(final=False)
        detok.finish()
        return text + detok.emit(final=True)

    assert answer(prompt, [e4, b8]) == ""
    assert answer([*prompt, e4], [b8, ad]) == "中"
    x = tokenizer.encode("x", add_special_tokens=False)
    assert answer([*prompt, e4], x).strip() == "x"
    assert answer([*prompt, e4], [b8]) == ""
