"""Unicode tables for the pre-tokenizer scanners and the NFC normalizer, built at load time from
the `regex` module and `unicodedata` (no data file is shipped).

Three Unicode versions meet here and they disagree on recently assigned code points:
Python 3.11's `unicodedata` is Unicode 14, the `regex` module is newer (17 at the time of writing),
Oniguruma inside HF `tokenizers` (which evaluates the Split regexes) is Unicode 16, and HF's NFC
(the `unicode-normalization-alignments` crate) is Unicode 9.

- Classes: for code points Python knows, the regex module's answer is Oniguruma's. Code points
  Python does not know may be Unicode 15-17; their class depends on the version, so the table
  marks them UNSURE. The C++ side reports an input that needs one and the caller hands that input
  to HF itself (rare: recently encoded scripts and ideographs).
- NFC: Python's data restricted to Unicode 9. Python has no Age property, so the few NFC-relevant
  code points Unicode 10-14 added are listed below; tests/tokenizer/test_unicode_tables.py
  re-derives both lists from HF's normalizer so a change on either side fails loudly.
"""
from __future__ import annotations

import functools
import marshal
import sys
import unicodedata
from array import array
from typing import Callable, TypeVar

import regex

from prelude.cachedir import cache_root, write_atomically

# (per-code-point uint16 NFC words as bytes, canonical decompositions, composition pairs)
NfcTables = tuple[bytes, list[tuple[int, list[int]]], list[tuple[int, int, int]]]
# The two kinds of table the disk cache holds; both are values marshal can write.
T = TypeVar("T", bytes, NfcTables)
# Bump when the tables' contents or layout change, so old cache files are not read.
TABLES_VERSION = 1

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

# Combining marks (non-zero ccc) that Unicode 10.0-14.0 added: HF's Unicode 9 NFC sees starters.
MARKS_AFTER_UNICODE_9 = (
    (0x07FD, 0x07FD), (0x0898, 0x089F), (0x08CA, 0x08D3), (0x09FE, 0x09FE), (0x0C3C, 0x0C3C),
    (0x0D3B, 0x0D3C), (0x0EBA, 0x0EBA), (0x1715, 0x1715), (0x1ABF, 0x1ACE), (0x1DF6, 0x1DFA),
    (0xA82C, 0xA82C), (0x10D24, 0x10D27), (0x10EAB, 0x10EAC), (0x10F46, 0x10F50),
    (0x10F82, 0x10F85), (0x11070, 0x11070), (0x1133B, 0x1133B), (0x1145E, 0x1145E),
    (0x11839, 0x1183A), (0x1193D, 0x1193E), (0x11943, 0x11943), (0x119E0, 0x119E0),
    (0x11A34, 0x11A34), (0x11A47, 0x11A47), (0x11A99, 0x11A99), (0x11D42, 0x11D42),
    (0x11D44, 0x11D45), (0x11D97, 0x11D97), (0x16FF0, 0x16FF1), (0x1E130, 0x1E136),
    (0x1E2AE, 0x1E2AE), (0x1E2EC, 0x1E2EF),
)
# Canonical composites Unicode 10.0-14.0 added (DIVES AKURU VOWEL SIGN O): unknown to HF's NFC.
COMPOSITES_AFTER_UNICODE_9 = (0x11938,)

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


@functools.cache
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


def _disk_cached(name: str, build: Callable[[], T]) -> T:
    """Building the tables scans all 1.1M code points (~0.4 s); every later start reads them
    back instead. The key names everything they derive from."""
    key = (f"{name}-v{TABLES_VERSION}-py{sys.version_info[0]}.{sys.version_info[1]}"
           f"-ucd{unicodedata.unidata_version}-regex{regex.__version__}.marshal")
    path = cache_root() / "fasttoken" / key
    try:
        return marshal.loads(path.read_bytes())
    except (OSError, ValueError, EOFError, TypeError):
        pass
    value = build()
    try:
        write_atomically(path, marshal.dumps(value))
    except OSError:  # a read-only home is fine: just no cache
        pass
    return value


@functools.cache
def class_table() -> bytes:
    """One class byte per code point (0x110000 bytes)."""
    return _disk_cached("classes", _build_class_table)


@functools.cache
def nfc_tables() -> NfcTables:
    """(per-code-point uint16 NFC words as bytes, canonical decompositions, composition pairs),
    as HF's Unicode 9 NFC sees them."""
    return _disk_cached("nfc", _build_nfc_tables)


def _build_class_table() -> bytes:
    table = bytearray(N_CODE_POINTS)
    for bit, pattern in _CLASS_PATTERNS.items():
        for start, end in _spans(pattern):
            for cp in range(start, end):
                table[cp] |= bit
    for cp in _newer_than_python():
        if table[cp]:
            table[cp] |= UNSURE
    return bytes(table)


def _build_nfc_tables() -> NfcTables:
    """Decompositions are full (recursive) and exclude Hangul, which the C++ side does
    algorithmically; pairs are (first, second, composite) for primary composites only.
    """
    late_marks = {cp for lo, hi in MARKS_AFTER_UNICODE_9 for cp in range(lo, hi + 1)}
    words = array("H", bytes(2 * N_CODE_POINTS))
    interesting: set[int] = set()
    for start, end in _spans(r"[\P{ccc=0}\p{NFC_QC=N}\p{NFC_QC=M}\p{dt=canonical}]+"):
        interesting.update(range(start, end))
    interesting.difference_update(range(0xAC00, 0xD7A4), late_marks, COMPOSITES_AFTER_UNICODE_9)
    decompositions: list[tuple[int, list[int]]] = []
    pairs: list[tuple[int, int, int]] = []
    for cp in sorted(interesting):
        ch = chr(cp)
        if unicodedata.category(ch) == "Cn":
            continue  # unknown to Python, hence to HF's older tables too: a plain starter
        nfd = unicodedata.normalize("NFD", ch)
        composes_away = unicodedata.normalize("NFC", ch) != ch  # NFC_Quick_Check=No
        if nfd != ch:
            decompositions.append((cp, [ord(c) for c in nfd]))
        mapping = unicodedata.decomposition(ch)
        if mapping and not mapping.startswith("<"):
            parts = [int(p, 16) for p in mapping.split()]
            if len(parts) == 2 and not composes_away:
                pairs.append((parts[0], parts[1], cp))
        words[cp] |= unicodedata.combining(ch) | (NFC_SLOW if composes_away else 0)
    for _, second, _ in pairs:
        words[second] |= NFC_SLOW  # NFC_Quick_Check=Maybe: may compose with what precedes it
    # Hangul jamo vowels and trailing consonants compose with a preceding syllable part.
    for cp in [*range(0x1161, 0x1176), *range(0x11A8, 0x11C3)]:
        words[cp] |= NFC_SLOW
    return words.tobytes(), decompositions, pairs
