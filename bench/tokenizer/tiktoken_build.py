"""Builds a `tiktoken.Encoding` equivalent to a byte-level BPE tokenizer.json, where possible.

tiktoken ranks whole byte strings, so each model-vocab token becomes a mergeable rank equal to
its id (GPT-2, Llama-3 and Qwen2/3 ids are in merge order), the Split regex becomes pat_str and
every added token a special token. tiktoken has no normalizer and always tries the whole
pre-token first (HF's ignore_merges); the benchmark checks its ids against HF before timing it.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import tiktoken

from prelude._fasttoken import patterns
from prelude._fasttoken.plan import CHAR_TO_BYTE


def split_regex(spec: dict) -> str | None:
    pre = spec.get("pre_tokenizer") or {}
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return patterns.GPT2_REGEX
    if pre.get("type") == "Sequence":
        regexes = [p["pattern"]["Regex"] for p in pre["pretokenizers"] if p.get("type") == "Split"]
        if len(regexes) == 1:
            return regexes[0]
    return None  # several Splits in a row (DeepSeek-V3) have no single-regex equivalent


@functools.cache  # the equality note and the timing both need it: parse the vocab once per path
def build(path: str | Path) -> tiktoken.Encoding | None:
    spec = json.loads(Path(path).read_text(encoding="utf-8"))
    regex = split_regex(spec)
    if regex is None or spec["model"].get("type") != "BPE":
        return None
    specials = {t["content"]: t["id"] for t in spec.get("added_tokens", [])}
    ranks: dict[bytes, int] = {}
    for token, token_id in spec["model"]["vocab"].items():
        if token in specials:
            continue  # GPT-2's <|endoftext|> is in the vocab too; HF matches it as added token
        try:
            ranks[bytes(CHAR_TO_BYTE[c] for c in token)] = token_id
        except KeyError:
            return None  # not a byte-level vocab
    return tiktoken.Encoding(name=Path(path).parent.name, pat_str=regex, mergeable_ranks=ranks,
                             special_tokens=specials)
