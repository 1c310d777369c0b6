"""Unicode tables for the pre-tokenizer scanners and the NFC normalizer, built at load time from
the `regex` module and `unicodedata` (no data file is shipped).

Three Unicode versions meet here and they disagree on recently assigned code points:
Python 3.11's `unicodedata` is Unicode 14, the `regex` module is newer (17 at the time of writing),
Oniguruma inside HF `tokenizers` (which evaluates the Split regexes) is Unicode 16, and HF's NFC
(the `unicode-normalization-alignments` crate) is Unicode 9. Rather than guess which version a
code point belongs to, each table marks the code points whose answer depends on that version as
UNSURE; the C++ side reports them and the caller hands that one input to the reference
implementation. For every code point assigned in Python's Unicode version the answer is certain,
and tests/tokenizer/test_unicode_tables.py checks it against HF's own engines.
"""
from __future__ import annotations

import functools
import unicodedata
from array import array

import regex

# Bits of the per-code-point class byte; the same values are in ft_unicode.hpp.
LETTER = 1  # \p{L}
NUMBER = 2  # \p{N}
SPACE = 4  # \s (White_Space: what Oniguruma and the Rust regex crate both use)
PUNCT = 8  # \p{P}
SYMBOL = 16  # \p{S}
MARK = 32  # \p{M}
WORD = 64  # Rust regex's \w, used by single_word added tokens
UNSURE = 128  # classification depends on the Unicode version (see module docstring)

# Bits of the per-code-point NFC word (low byte: canonical combining class).
NFC_SLOW = 1 << 8  # NFC_Quick_Check is No or Maybe: the quick path cannot vouch for the text
NFC_UNSURE = 1 << 9  # matters to NFC but may be unknown to HF's Unicode 9 tables

N_CODE_POINTS = 0x110000
_CLASS_PATTERNS = {
    LETTER: r"\p{L}+",
    NUMBER: r"\p{N}+",
    SPACE: r"\s+",
    PUNCT: r"\p{P}+",
    SYMBOL: r"\p{S}+",
    MARK: r"\p{M}+",
    WORD: r"[\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}]+",
}


@functools.lru_cache(maxsize=None)
def _all_code_points() -> str:
    """Every scalar value in order, with each surrogate replaced by U+0000 so indices stay
    code points (U+0000 is in no class, so the stand-ins never match)."""
    cps = array("I", range(N_CODE_POINTS))
    cps[0xD800:0xE000] = array("I", bytes(4 * 0x800))
    return cps.tobytes().decode("utf-32-le")


def _spans(pattern: str) -> list[tuple[int, int]]:
    return [m.span() for m in regex.finditer(pattern, _all_code_points())]


def _newer_than_python() -> list[int]:
    """Code points the regex module knows but Python's unicodedata calls unassigned."""
    out: list[int] = []
    for start, end in _spans(r"[^\p{Cn}\p{Co}]+"):
        text = _all_code_points()[start:end]
        out.extend(start + i for i, ch in enumerate(text) if unicodedata.category(ch) == "Cn")
    return out


@functools.lru_cache(maxsize=None)
def class_table() -> bytes:
    """One class byte per code point (0x110000 bytes)."""
    table = bytearray(N_CODE_POINTS)
    for bit, pattern in _CLASS_PATTERNS.items():
        for start, end in _spans(pattern):
            for cp in range(start, end):
                table[cp] |= bit
    for cp in _newer_than_python():
        if table[cp]:
            table[cp] |= UNSURE
    return bytes(table)


@functools.lru_cache(maxsize=None)
def nfc_tables() -> tuple[bytes, list[tuple[int, list[int]]], list[tuple[int, int, int]]]:
    """(per-code-point uint16 NFC words as bytes, canonical decompositions, composition pairs).

    Decompositions are full (recursive) and exclude Hangul, which the C++ side does
    algorithmically; pairs are (first, second, composite) for primary composites only.
    """
    words = array("H", bytes(2 * N_CODE_POINTS))
    interesting: set[int] = set()
    for start, end in _spans(r"[\P{ccc=0}\p{NFC_QC=N}\p{NFC_QC=M}\p{dt=canonical}]+"):
        interesting.update(range(start, end))
    interesting.difference_update(range(0xAC00, 0xD7A4))
    decompositions: list[tuple[int, list[int]]] = []
    pairs: list[tuple[int, int, int]] = []
    old = unicodedata.ucd_3_2_0
    for cp in sorted(interesting):
        ch = chr(cp)
        if unicodedata.category(ch) == "Cn":
            continue  # unknown to Python, hence also to HF's older tables: a plain starter
        ccc = unicodedata.combining(ch)
        nfd = unicodedata.normalize("NFD", ch)
        composes_away = unicodedata.normalize("NFC", ch) != ch  # NFC_Quick_Check=No
        if nfd != ch:
            decompositions.append((cp, [ord(c) for c in nfd]))
        mapping = unicodedata.decomposition(ch)
        if mapping and not mapping.startswith("<"):
            parts = [int(p, 16) for p in mapping.split()]
            if len(parts) == 2 and not composes_away:
                pairs.append((parts[0], parts[1], cp))
        words[cp] |= ccc | (NFC_SLOW if composes_away else 0)
        if (ccc or composes_away) and old.category(ch) == "Cn":
            words[cp] |= NFC_UNSURE
    for first, second, _ in pairs:
        words[second] |= NFC_SLOW  # NFC_Quick_Check=Maybe: may compose with what precedes it
        if old.category(chr(second)) == "Cn":
            words[second] |= NFC_UNSURE
    # Hangul jamo vowels and trailing consonants compose with a preceding syllable part.
    for cp in list(range(0x1161, 0x1176)) + list(range(0x11A8, 0x11C3)):
        words[cp] |= NFC_SLOW
    return words.tobytes(), decompositions, pairs
