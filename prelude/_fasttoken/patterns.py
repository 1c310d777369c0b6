"""The pre-tokenizer regexes fasttoken scans by hand, and their `regex`-module reference.

A tokenizer.json whose Split regexes are exactly one of these sequences gets the C++ scanner.
Any other Split regexes go through `reference_pieces`, which runs them with the `regex` module
(slower, but the same leftmost-first backtracking semantics as Oniguruma).
"""
from __future__ import annotations

import functools

import regex

GPT2, LLAMA3, DEEPSEEK = 0, 1, 2  # PatternKind in ft_pretok.hpp

GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_TEMPLATE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|DIGITS|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_REGEX = _LLAMA3_TEMPLATE.replace("DIGITS", r"\p{N}{1,3}")
QWEN2_REGEX = _LLAMA3_TEMPLATE.replace("DIGITS", r"\p{N}")
# DeepSeek-V3's third regex has literal CR and LF characters (not escapes) in its classes.
DEEPSEEK_REGEXES = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    (
        r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^"""
        "\r\n"
        r"""\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+["""
        "\r\n"
        r"""]*|\s*["""
        "\r\n"
        r"""]+|\s+(?!\S)|\s+"""
    ),
)

_KNOWN: dict[tuple[str, ...], tuple[int, int]] = {
    (GPT2_REGEX,): (GPT2, 0),
    (LLAMA3_REGEX,): (LLAMA3, 3),
    (QWEN2_REGEX,): (LLAMA3, 1),
    DEEPSEEK_REGEXES: (DEEPSEEK, 3),
}


def recognize(regexes: list[str]) -> tuple[int, int] | None:
    """(pattern kind, max digits) when the Split sequence is one the scanners reproduce."""
    return _KNOWN.get(tuple(regexes))


def compiles(pattern: str) -> bool:
    try:
        _compiled(pattern)
    except regex.error:
        return False
    return True


@functools.cache
def _compiled(pattern: str) -> regex.Pattern:
    return regex.compile(pattern)


def split_isolated(pattern: str, pieces: list[str]) -> list[str]:
    """HF's Split(behavior=Isolated) over each piece: matches and the gaps between them."""
    out: list[str] = []
    compiled = _compiled(pattern)
    for piece in pieces:
        prev = 0
        for m in compiled.finditer(piece):
            if m.start() > prev:
                out.append(piece[prev:m.start()])
            if m.end() > m.start():
                out.append(m.group())
            prev = m.end()
        if prev < len(piece):
            out.append(piece[prev:])
    return out


def reference_pieces(regexes: tuple[str, ...] | list[str], text: str) -> list[str]:
    pieces = [text] if text else []
    for pattern in regexes:
        pieces = split_isolated(pattern, pieces)
    return pieces
