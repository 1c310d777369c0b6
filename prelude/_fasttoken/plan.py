"""The Plan (flat tables the C++ engine loads, plus Python-side lookups) and the readers of the
pipeline components of a tokenizer.json: normalizer, pre-tokenizer, decoder, post-processor.
Anything outside the supported subset raises UnsupportedTokenizer with the reason, so callers
can fall back to HF `tokenizers`.
"""
from __future__ import annotations

import unicodedata
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prelude._fasttoken import patterns


class UnsupportedTokenizer(ValueError):
    """The tokenizer.json uses a feature outside fasttoken's supported subset."""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by ByteLevel."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


BYTE_TO_CHAR = bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}

NORM_NFC, NORM_PREPEND, NORM_REPLACE = 0, 1, 2
FLAG_KNOWN, FLAG_SPECIAL, FLAG_BYTE_TOKEN = 1, 2, 4



def special_token_ids(added_tokens: Iterable[dict[str, Any]]) -> frozenset[int]:
    """The "id" of each tokenizer.json added token flagged special: what every backend reports
    as special_ids."""
    return frozenset(t["id"] for t in added_tokens if t.get("special"))

@dataclass
class Plan:
    classes: bytes = b""
    nfc: tuple | None = None
    normalizers: list[tuple[int, bytes, bytes]] = field(default_factory=list)
    raw_added: list[tuple[bytes, int, int]] = field(default_factory=list)  # content, id, flags
    normalized_added: list[tuple[bytes, int, int]] = field(default_factory=list)
    pattern: int = -1  # a patterns.* kind; -1: no pre-tokenizer split
    max_digits: int = 3
    regexes: tuple[str, ...] | None = None  # Split regexes no scanner covers: run by `regex`
    metaspace: tuple[bytes, int, bool] | None = None  # replacement, prepend scheme, split
    word_boundary: bytes = b""  # no-pre-tokenizer models: a safe place to cut words (see loader)
    byte_level: bool = True
    vocab_keys: bytes = b""
    vocab_offsets: array = field(default_factory=lambda: array("I", [0]))
    vocab_ids: array = field(default_factory=lambda: array("i"))
    merges: array = field(default_factory=lambda: array("i"))
    byte_ids: list[int] = field(default_factory=lambda: [-1] * 256)
    ignore_merges: bool = False
    byte_fallback: bool = False
    fallback_ids: list[int] = field(default_factory=lambda: [-1] * 256)
    unk_id: int = -1
    fuse_unk: bool = False
    prefix_ids: list[int] = field(default_factory=list)
    suffix_ids: list[int] = field(default_factory=list)
    token_bytes: bytes = b""
    token_offsets: array = field(default_factory=lambda: array("I", [0]))
    token_flags: bytes = b""
    token_byte: bytes = b""
    strip_content: bytes = b""
    strip_start: int = 0
    first_token_bytes: bytes = b""  # Metaspace decoder: how a token shows as the first one
    first_token_offsets: array = field(default_factory=lambda: array("I"))
    # Python-side lookups
    token_to_id: dict[str, int] = field(default_factory=dict)
    added_to_id: dict[str, int] = field(default_factory=dict)  # the added tokens' part of token_to_id
    added_by_id: dict[int, str] = field(default_factory=dict)
    vocab_by_id: dict[int, str] = field(default_factory=dict)
    special_ids: frozenset[int] = frozenset()
    vocab_size: int = 0


def require(condition: bool, reason: str) -> None:
    if not condition:
        raise UnsupportedTokenizer(reason)


def normalizer_steps(spec: dict | None) -> list[tuple[int, str, str]]:
    if spec is None:
        return []
    kind = spec.get("type")
    if kind == "Sequence":
        return [step for child in spec.get("normalizers", []) for step in normalizer_steps(child)]
    if kind == "NFC":
        return [(NORM_NFC, "", "")]
    if kind == "Prepend":
        return [(NORM_PREPEND, spec["prepend"], "")]
    if kind == "Replace":
        pattern = spec.get("pattern", {})
        require("String" in pattern, "Replace normalizer with a regex pattern")
        require(pattern["String"] != "", "Replace normalizer with an empty pattern")
        return [(NORM_REPLACE, pattern["String"], spec["content"])]
    raise UnsupportedTokenizer(f"normalizer {kind}")


def apply_normalizers(steps: list[tuple[int, str, str]], text: str) -> str:
    """Python twin of the C++ normalizers, used on added-token contents only."""
    for kind, a, b in steps:
        if kind == NORM_NFC:
            text = unicodedata.normalize("NFC", text)
        elif kind == NORM_PREPEND:
            text = a + text if text else text
        else:
            text = text.replace(a, b)
    return text


PREPEND_SCHEMES = {"always": 0, "first": 1, "never": 2}


def metaspace_options(spec: dict) -> tuple[str, int, bool]:
    """(replacement, prepend scheme, split) of a Metaspace pre-tokenizer or decoder."""
    scheme = spec.get("prepend_scheme")
    if scheme is None:  # files written before prepend_scheme existed
        scheme = "always" if spec.get("add_prefix_space", True) else "never"
    require(scheme in PREPEND_SCHEMES, f"Metaspace prepend_scheme {scheme}")
    replacement = spec.get("replacement", "\u2581")
    require(len(replacement) == 1 and replacement != " ", "Metaspace replacement")
    return replacement, PREPEND_SCHEMES[scheme], bool(spec.get("split", True))


def pre_tokenizer_options(spec: dict | None,
                          use_scanners: bool = True) -> tuple[int, int, bool, tuple[str, ...] | None]:
    """(pattern kind, max digits, byte level, regexes left to the `regex` module)."""
    if spec is None:
        return -1, 3, False, None
    kind = spec.get("type")
    if kind == "Metaspace":
        return -1, 3, False, None  # options read by metaspace_options
    if kind == "ByteLevel":
        require(not spec.get("add_prefix_space", False), "ByteLevel pre-tokenizer with add_prefix_space")
        if not spec.get("use_regex", True):
            return -1, 3, True, None
        return (patterns.GPT2, 0, True, None) if use_scanners else (-1, 3, True, (patterns.GPT2_REGEX,))
    require(kind == "Sequence", f"pre-tokenizer {kind}")
    steps = spec.get("pretokenizers", [])
    require(len(steps) >= 1, "empty pre-tokenizer sequence")
    last = steps[-1]
    require(
        last.get("type") == "ByteLevel" and not last.get("use_regex", True)
        and not last.get("add_prefix_space", False),
        "pre-tokenizer sequence not ending in ByteLevel(use_regex=false)",
    )
    regexes = []
    for split in steps[:-1]:
        require(split.get("type") == "Split", f"pre-tokenizer {split.get('type')} in a sequence")
        require(split.get("behavior") == "Isolated" and not split.get("invert", False),
                 "Split pre-tokenizer that is not Isolated")
        require("Regex" in split.get("pattern", {}), "Split on a plain string")
        regexes.append(split["pattern"]["Regex"])
    if not regexes:
        return -1, 3, True, None
    known = patterns.recognize(regexes)
    if known is not None and use_scanners:
        return known[0], known[1], True, None
    for regex in regexes:
        require(patterns.compiles(regex), f"Split regex the regex module cannot compile: {regex!r}")
    return -1, 3, True, tuple(regexes)


def decoder_options(spec: dict | None, byte_level: bool) -> tuple[list[tuple[str, str]], bool, str, int, str]:
    """(replaces, byte fallback, strip content, strip start, metaspace replacement that the
    first token drops). A ByteLevel decoder goes with, and only with, a byte-level
    pre-tokenizer, so `byte_level` also says how tokens decode."""
    if spec is None:  # spelled out, not require(), so the type narrows
        raise UnsupportedTokenizer("no decoder")
    if spec.get("type") == "ByteLevel":
        require(byte_level, "ByteLevel decoder without a ByteLevel pre-tokenizer")
        return [], False, "", 0, ""
    require(not byte_level, "byte-level pre-tokenizer with a non-ByteLevel decoder")
    if spec.get("type") == "Metaspace":
        replacement, scheme, _ = metaspace_options(spec)
        return [(replacement, " ")], False, "", 0, replacement if scheme != PREPEND_SCHEMES["never"] else ""
    require(spec.get("type") == "Sequence", f"decoder {spec.get('type')}")
    replaces: list[tuple[str, str]] = []
    byte_fallback = fused = False
    strip = ("", 0)
    stage = 0  # enforces the order Replace* ByteFallback? Fuse? Strip?
    for step in spec.get("decoders", []):
        kind = step.get("type")
        if kind == "Replace" and stage == 0:
            pattern = step.get("pattern", {})
            require("String" in pattern and pattern["String"] != "", "Replace decoder with a regex")
            replaces.append((pattern["String"], step["content"]))
        elif kind == "ByteFallback" and stage < 1:
            byte_fallback, stage = True, 1
        elif kind == "Fuse" and stage < 2:
            fused, stage = True, 2
        elif kind == "Strip" and stage == 2 and fused:
            require(step.get("stop", 0) == 0 and len(step.get("content", "")) == 1, "Strip decoder form")
            strip, stage = (step["content"], int(step.get("start", 0))), 3
        else:
            raise UnsupportedTokenizer(f"decoder sequence with {kind} at this position")
    return replaces, byte_fallback, strip[0], strip[1], ""


def post_processor_ids(spec: dict | None) -> tuple[list[int], list[int]]:
    if spec is None:
        return [], []
    kind = spec.get("type")
    if kind == "ByteLevel":
        return [], []  # only adjusts offsets
    if kind == "Sequence":
        prefix: list[int] = []
        suffix: list[int] = []
        for child in spec.get("processors", []):
            p, s = post_processor_ids(child)
            prefix, suffix = prefix + p, s + suffix
            require(not (p or s) or child.get("type") == "TemplateProcessing", "post-processor order")
        return prefix, suffix
    require(kind == "TemplateProcessing", f"post-processor {kind}")
    before: list[int] = []
    after: list[int] = []
    seen_sequence = False
    for item in spec.get("single", []):
        if "Sequence" in item:
            require(item["Sequence"]["id"] == "A" and not seen_sequence, "template sequence")
            seen_sequence = True
        elif "SpecialToken" in item:
            ids = spec["special_tokens"][item["SpecialToken"]["id"]]["ids"]
            (after if seen_sequence else before).extend(ids)
        else:
            raise UnsupportedTokenizer("template item")
    require(seen_sequence, "template without the sequence")
    return before, after


def byte_fallback_value(token: str) -> int | None:
    """ByteFallback's test for <0xNN>: Rust's u8::from_str_radix accepts a leading '+'."""
    if len(token.encode()) != 6 or not token.startswith("<0x") or not token.endswith(">"):
        return None
    digits = token[3:5]
    digits = digits.removeprefix("+")
    if not digits or any(c not in "0123456789abcdefABCDEF" for c in digits):
        return None
    return int(digits, 16)


# str.translate table from byte characters to the code point of their byte; every other code
# point below 256 goes to U+FFFF so that encoding the result as latin-1 fails exactly when the
# token has a character that is not a byte character (loads 150K-token vocabularies quickly).
_TO_BYTE = {ord(c): b for c, b in CHAR_TO_BYTE.items()} | {
    cp: 0xFFFF for cp in range(256) if chr(cp) not in CHAR_TO_BYTE}


def byte_chars_to_bytes(token: str) -> bytes | None:
    """The bytes a token of byte characters stands for; None if it has any other character."""
    try:
        return token.translate(_TO_BYTE).encode("latin-1")
    except UnicodeEncodeError:
        return None
