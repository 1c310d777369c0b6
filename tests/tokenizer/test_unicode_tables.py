"""fasttoken's Unicode data against what HF's own engines see: Oniguruma's classes for every
code point, the Unicode 9 NFC gap lists, lossy UTF-8 repair, and case-insensitive contractions."""
from __future__ import annotations

import random
import unicodedata

import pytest
from tokenizers import Regex, normalizers, pre_tokenizers

from prelude._fasttoken import unicode_data as ud
from prelude._fasttoken.plan import BYTE_TO_CHAR
from tests.data import tokenizer_file
from bench.tokenizer.equality import load_pair

ALL = ud._all_code_points()
CLASSES = {
    ud.LETTER: r"\p{L}", ud.NUMBER: r"\p{N}", ud.SPACE: r"\s", ud.PUNCT: r"\p{P}",
    ud.SYMBOL: r"\p{S}", ud.MARK: r"\p{M}",
}


def _onig_members(cls: str) -> set[int]:
    """Code points HF's Split regex (Oniguruma) puts in `cls`: everything outside the gaps."""
    gaps = pre_tokenizers.Split(Regex(cls), "removed").pre_tokenize_str(ALL)
    outside = bytearray(ud.N_CODE_POINTS)
    for piece, (start, end) in gaps:
        outside[start:end] = b"\x01" * (end - start)
    return {cp for cp in range(ud.N_CODE_POINTS) if not outside[cp]} - {0}


@pytest.mark.parametrize("bit", list(CLASSES))
def test_classes_match_oniguruma(bit: int) -> None:
    table = ud.class_table()
    ours = {cp for cp in range(ud.N_CODE_POINTS) if table[cp] & bit and not table[cp] & ud.UNSURE}
    unsure = {cp for cp in range(ud.N_CODE_POINTS) if table[cp] & ud.UNSURE}
    onig = _onig_members(CLASSES[bit]) - unsure
    assert ours - onig == set() and onig - ours == set(), (sorted(ours - onig)[:10], sorted(onig - ours)[:10])


def test_unsure_only_where_python_lacks_data() -> None:
    table = ud.class_table()
    unsure = [cp for cp in range(ud.N_CODE_POINTS) if table[cp] & ud.UNSURE]
    assert all(unicodedata.category(chr(cp)) == "Cn" for cp in unsure)
    # The additions since Unicode 14 that have a class, nothing more: each version adds about 5K,
    # and the regex module follows the newest version (regex 2026.11 already counts ~28K).
    assert len(unsure) < 60_000


def test_nfc_version_gap_lists_match_hf() -> None:
    """Re-derives, from HF's normalizer, the marks and composites it does not know."""
    hf = normalizers.NFC()
    marks = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF and unicodedata.combining(chr(cp))]
    probes = [" \u0345" + chr(cp) if unicodedata.combining(chr(cp)) < 240 else " " + chr(cp) + "\u0301"
              for cp in marks]
    seen = hf.normalize_str("\n".join(probes)).split("\n")
    unknown = {cp for cp, probe, got in zip(marks, probes, seen) if got == probe != unicodedata.normalize("NFC", probe)}
    listed = {cp for lo, hi in ud.MARKS_AFTER_UNICODE_9 for cp in range(lo, hi + 1)}
    assert unknown == listed
    composites = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF
                  and unicodedata.decomposition(chr(cp))[:1] not in ("", "<")]
    nfd = normalizers.NFD().normalize_str("\n".join(map(chr, composites))).split("\n")
    undecomposed = {cp for cp, got in zip(composites, nfd) if got != unicodedata.normalize("NFD", chr(cp))}
    assert undecomposed == set(ud.COMPOSITES_AFTER_UNICODE_9)
    _, _, pairs = ud.nfc_tables()
    composed = hf.normalize_str("\n".join(chr(a) + chr(b) for a, b, _ in pairs)).split("\n")
    assert all(got == chr(c) for (_, _, c), got in zip(pairs, composed))


def test_nfc_fuzz_through_qwen3() -> None:
    """Random base + combining-mark soups: the slow NFC path must agree with HF's NFC."""
    path = tokenizer_file("qwen3")
    fast, hf, _ = load_pair(path)
    rng = random.Random(5)
    marks = [cp for cp in range(0x3000) if unicodedata.combining(chr(cp))] + [
        cp for lo, hi in ud.MARKS_AFTER_UNICODE_9[:6] for cp in range(lo, hi + 1)] + [0x11930, 0x11935]
    bases = [*map(ord, "aeiouAEOUnNcCsSyY "), 0x1100, 0x1161, 0x11A8, 0xAC00, 0x0915, 0x0B47, 0x0B3E, 0x0DD9]
    decomposable = [cp for cp in range(0xC0, 0x2000) if unicodedata.decomposition(chr(cp))[:1] not in ("", "<")]
    texts = []
    for _ in range(3000):
        pool = rng.choice([marks, bases, decomposable])
        texts.append("".join(chr(rng.choice(rng.choice([pool, marks, bases]))) for _ in range(rng.randint(1, 10))))
    assert fast.encode_batch(texts) == hf.encode_batch(texts)


def test_lossy_utf8_matches_hf_and_python() -> None:
    """Byte-level decode of arbitrary bytes: one U+FFFD per maximal invalid subpart."""
    path = tokenizer_file("gpt2")
    fast, hf, _ = load_pair(path)
    byte_id = {b: fast.token_to_id(c) for b, c in BYTE_TO_CHAR.items()}
    rng = random.Random(11)
    interesting = [0x00, 0x41, 0x7F, 0x80, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1, 0xED, 0xEE, 0xEF,
                   0xF0, 0xF1, 0xF4, 0xF5, 0xFF, 0x9F, 0xA0, 0x8F, 0x90]
    for _ in range(3000):
        data = bytes(rng.choice(interesting) if rng.random() < 0.7 else rng.randrange(256)
                     for _ in range(rng.randint(0, 12)))
        ids = [byte_id[b] for b in data]
        expected = data.decode("utf-8", errors="replace")
        assert fast.decode(ids) == hf.decode(ids) == expected, data


def test_contractions_fold_like_oniguruma() -> None:
    """(?i:'s|...) in Qwen/Llama: every BMP code point after an apostrophe."""
    path = tokenizer_file("qwen3")
    fast, hf, _ = load_pair(path)
    texts = [f"x'{chr(cp)}e'{chr(cp)}l" for cp in range(0x20, 0x10000) if not 0xD800 <= cp <= 0xDFFF]
    assert fast.encode_batch(texts, False) == hf.encode_batch(texts, False)
