"""The bit-parallel Llama-3/Qwen2 splitter (prelude/_fasttoken/ft_bits.hpp) against HF on text
made of the cases its masks decide: letter runs with one-character prefixes, digit runs around
the pattern's limit, one-character whitespace runs including \\r \\n \\t \\v \\f, punctuation runs
that take the newlines after them, control characters; mixed with what sends a 64-byte window
back to the scanner (apostrophes, non-ASCII, doubled whitespace) so both paths meet mid-text."""
from __future__ import annotations

import random

import pytest

from bench.tokenizer.equality import load_pair, tokenizer_path
from tests.data import tokenizer_dir

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


@pytest.mark.parametrize("name", ["qwen3", "llama3"])
def test_bit_parallel_split(name: str) -> None:
    fast, hf, _ = load_pair(tokenizer_path(tokenizer_dir(name)))
    texts = _texts(5, 3000)
    bad = [t for t in texts if fast.encode(t, False) != hf.encode(t, False)]
    assert not bad, [repr(t) for t in bad[:5]]
    assert fast.encode_batch(texts[:200]) == hf.encode_batch(texts[:200])
