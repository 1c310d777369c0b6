"""The bit-parallel splitter (prelude/_fasttoken/ft_bits.hpp) against HF on text
made of the cases its masks decide: letter runs with one-character prefixes, digit runs around
the pattern's limit, one-character whitespace runs including \\r \\n \\t \\v \\f, punctuation runs
that take the newlines after them, control characters; mixed with what sends a 64-byte window
back to the scanner (apostrophes, non-ASCII, doubled whitespace) so both paths meet mid-text.
GPT-2 and DeepSeek-V3 also take apostrophes and control characters on the same texts."""
from __future__ import annotations

import random

import pytest

from bench.tokenizer.equality import load_pair
from tests.data import tokenizer_file

SIMPLE = ["a", "b", "Z", "q", "word", "The", "x", "1", "2", "0", "99", "123", "1234", " ", " ", "\t",
          "\n", "\r", "\v", "\f", "(", ")", ".", ",", "-", "$", "_", '"', "`", "\x01", "\x7f", "((", ".\n"]
REFUSED = ["'s", "'T", "'ll", "'", "\u00e9", "\u2014", "\u4e2d", "  ", "\r\n", "\n\n", "\u017f"]


def _texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        refused = 0.0 if i % 2 else 0.03  # half the texts stay entirely on the bit-parallel path
        parts: list[str] = []
        size, target = 0, rng.choice([5, 40, 63, 64, 65, 130, 400])
        while size < target:
            atom = rng.choice(REFUSED) if rng.random() < refused else rng.choice(SIMPLE)
            if parts and atom[0] in " \t\n\r\v\f" and parts[-1][-1] in " \t\n\r\v\f" and rng.random() < 0.9:
                continue  # mostly single whitespace: doubled runs send the window to the scanner
            parts.append(atom)
            size += len(atom)
        out.append("".join(parts))
    return out


@pytest.mark.parametrize("name", ["qwen3", "llama3", "gpt2", "deepseek-v3"])
def test_bit_parallel_split(name: str) -> None:
    fast, hf, _ = load_pair(tokenizer_file(name))
    texts = _texts(5, 3000)
    bad = [t for t in texts if fast.encode(t, False) != hf.encode(t, False)]
    assert not bad, [repr(t) for t in bad[:5]]
    assert fast.encode_batch(texts[:200]) == hf.encode_batch(texts[:200])


@pytest.mark.parametrize("name", ["qwen3", "gpt2"])
def test_str_kinds(name: str) -> None:
    """Every PEP 393 kind is transcoded by the engine (ft_text.hpp), ASCII stretches in bulk;
    a lone surrogate raises as CPython's own UTF-8 conversion does."""
    fast, hf, _ = load_pair(tokenizer_file(name))
    ascii_run = "plain words, 42 of them. " * 3
    texts = ["", "a", ascii_run, "caf\u00e9 \u00ff\u00e0" + ascii_run, ascii_run + "\u00e9",
             "a\u2014b \u4e2d\u6587 " + ascii_run + "\u2603", ascii_run + "\U0001F600 x \u00e9",
             "\U0001F600" * 3 + ascii_run]
    texts += [t[:k] for t in texts for k in (7, 8, 9, 15, 16, 17)]
    for text in texts:
        assert fast.encode(text) == hf.encode(text), repr(text)
    assert fast.encode_batch(texts) == hf.encode_batch(texts)
    for bad in ["a\ud800b", ascii_run + "\udfff", "\U0001F600\udc00"]:
        with pytest.raises(UnicodeEncodeError):
            fast.encode(bad)
        with pytest.raises(UnicodeEncodeError):
            fast.encode_batch(["fine", bad])


@pytest.mark.parametrize("unit", ["\U0001F600x", "\U0001F468\u200d\U0001F469\u200d\U0001F467", "\u00e9\u2014 "])
def test_deepseek_long_stretch_without_numbers_is_linear(unit: str) -> None:
    """DeepSeek-V3's scanner swept to the next number or CJK character once per 64-byte window
    that holds a non-ASCII byte: a long stretch with neither (emoji and letters) cost
    quadratic time, 40,000 characters about a second, 80,000 four (HF: 40 ms). Timed against HF
    on the same text, so a loaded machine slows both."""
    import time

    fast, hf, _ = load_pair(tokenizer_file("deepseek-v3"))
    text = unit * (80_000 // len(unit))
    started = time.perf_counter()
    want = hf.encode(text, False)
    hf_seconds = time.perf_counter() - started
    started = time.perf_counter()
    got = fast.encode(text, False)
    assert got == want
    assert time.perf_counter() - started < 2 * hf_seconds + 0.05
