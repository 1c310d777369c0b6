"""Shared machinery of the fasttoken equality gate: tokenizer pairs and one-text checks.

Each check compares fasttoken with HF `tokenizers` (through prelude.tokenizer.hf, i.e. without
truncation) and returns a list of human-readable differences, empty when identical. The pytest
suite (tests/tokenizer) asserts on them; bench/tokenizer runs the same checks before it prints
any timing.
"""
from __future__ import annotations

import functools
import random

from tokenizers import Tokenizer as RawHF
from tokenizers.decoders import DecodeStream

from prelude.tokenizer.fast import FastTokenizer
from prelude.tokenizer.hf import HFTokenizer
from bench.tokenizer.corpus import FRAGMENTS, added_contents, special_mixes


def make_pair(path: str) -> tuple[FastTokenizer, HFTokenizer, RawHF]:
    """fasttoken, prelude's HF wrapper and the raw HF tokenizer (for DecodeStream) of one file."""
    raw = RawHF.from_file(path)
    raw.no_truncation()
    raw.no_padding()
    return FastTokenizer(path), HFTokenizer(path), raw


@functools.cache
def load_pair(path: str) -> tuple[FastTokenizer, HFTokenizer, RawHF]:
    """make_pair, cached for the session: for the shared files many tests read."""
    return make_pair(path)


def corpus_for(path: str) -> list[str]:
    return FRAGMENTS + special_mixes(added_contents(path))


def _show(text: str) -> str:
    return repr(text if len(text) < 120 else text[:100] + "...")


def check_encode(fast: FastTokenizer, hf: HFTokenizer, text: str) -> list[str]:
    out = []
    for add in (True, False):
        a, b = fast.encode(text, add), hf.encode(text, add)
        if a != b:
            first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            out.append(f"encode(add_special_tokens={add}) {_show(text)}: first difference at {first}: "
                       f"fast {a[first:first + 8]} hf {b[first:first + 8]}")
    return out


def check_decode(fast: FastTokenizer, hf: HFTokenizer, ids: list[int]) -> list[str]:
    out = []
    for skip in (False, True):
        a, b = fast.decode(ids, skip), hf.decode(ids, skip)
        if a != b:
            out.append(f"decode(skip_special_tokens={skip}) {ids[:12]}...: fast {_show(a)} hf {_show(b)}")
    return out


def check_stream(fast: FastTokenizer, hf: HFTokenizer, raw: RawHF, ids: list[int],
                 with_decode_stream: bool = True) -> list[str]:
    """Feeds ids one at a time through decode_step; every step must equal HF-backed
    base.Tokenizer.decode_step, and the concatenation must equal DecodeStream's."""
    out = []
    for skip in (False, True):
        fp = fr = hp = hr = 0
        pieces = []
        for k in range(1, len(ids) + 1):
            a = fast.decode_step(ids[:k], fp, fr, skip)
            b = hf.decode_step(ids[:k], hp, hr, skip)
            if a != b:
                out.append(f"decode_step(skip={skip}) at {k} of {ids[:12]}...: fast {a} hf {b}")
                break
            fp, fr, hp, hr = a.prefix_offset, a.read_offset, b.prefix_offset, b.read_offset
            pieces.append(a.text)
        if with_decode_stream and not out:
            stream = DecodeStream(skip_special_tokens=skip)
            expected = "".join(t for t in (stream.step(raw, i) for i in ids) if t)
            if "".join(pieces) != expected:
                out.append(f"stream(skip={skip}) {ids[:12]}...: fast {_show(''.join(pieces))} "
                           f"DecodeStream {_show(expected)}")
    return out


def check_text(path: str, text: str, stream: bool = True) -> list[str]:
    fast, hf, raw = load_pair(path)
    problems = check_encode(fast, hf, text)
    ids = hf.encode(text, True)
    problems += check_decode(fast, hf, ids)
    if stream:
        problems += check_stream(fast, hf, raw, ids)
    return problems


def random_texts(path: str, count: int, seed: int = 0) -> list[str]:
    """Deterministic mixes of corpus fragments, added tokens, whitespace and random code points."""
    rng = random.Random(seed)
    pool = FRAGMENTS + added_contents(path)
    blocks = [(0x20, 0x7E), (0xA0, 0x2FF), (0x300, 0x36F), (0x400, 0x4FF), (0x600, 0x6FF),
              (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x3000, 0x30FF), (0x4E00, 0x9FFF),
              (0xAC00, 0xD7A3), (0x1F300, 0x1FAFF), (0x0, 0x10FFFF)]
    texts = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(0, 24)):
            r = rng.random()
            if r < 0.3:
                frag = rng.choice(pool)
                cut = rng.randint(0, len(frag))
                parts.append(frag[:cut] if rng.random() < 0.3 else frag)
            elif r < 0.55:
                parts.append(rng.choice([" ", "  ", "\n", "\t", "\r\n", "'s", "'LL", "123", "\u00a0",
                                         "\u3000", "\u200d", "\ufe0f", "\u0301", "\n\n ", " \n"]))
            else:
                lo, hi = rng.choice(blocks)
                cp = rng.randint(lo, hi)
                parts.append(chr(cp) if not 0xD800 <= cp <= 0xDFFF else "?")
        texts.append("".join(parts))
    return texts
