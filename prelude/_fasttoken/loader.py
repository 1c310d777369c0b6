"""Builds a Plan from a tokenizer.json: the BPE tables, the added vocabulary as HF resolves it,
and the per-id decode table.

The id bookkeeping mirrors HF's AddedVocabulary (ids come from the model vocab or are assigned
past it, flags are looked up by id), because that, not the "id" field in the JSON, is what HF
encodes and decodes with.
"""
from __future__ import annotations

import json
from array import array
from itertools import accumulate
from pathlib import Path
from typing import Any, NamedTuple

from prelude._fasttoken import unicode_data
from prelude._fasttoken.plan import (
    BYTE_TO_CHAR,
    FLAG_BYTE_TOKEN,
    FLAG_KNOWN,
    FLAG_SPECIAL,
    NORM_NFC,
    Plan,
    UnsupportedTokenizer,
    apply_normalizers,
    byte_chars_to_bytes,
    byte_fallback_value,
    decoder_options,
    metaspace_options,
    normalizer_steps,
    post_processor_ids,
    pre_tokenizer_options,
    require,
    special_token_ids,
)


class Added(NamedTuple):
    content: str
    single_word: bool
    lstrip: bool
    rstrip: bool
    normalized: bool
    special: bool


def _arena(keys: list[bytes]) -> tuple[bytes, array]:
    return b"".join(keys), array("I", accumulate((len(k) for k in keys), initial=0))


def _resolve_added(tokens: list[Added],
                   vocab: dict[str, int]) -> tuple[dict[str, int], dict[int, Added], list[Added], set[str]]:
    """HF's AddedVocabulary::add_tokens: returns (content->id, id->token, trie order, special contents)."""
    model_size = len(vocab)
    special_order: list[Added] = []
    special_set: set[str] = set()
    for tok in tokens:
        if tok.special and tok.content and tok.content not in special_set:
            special_order.append(tok)
            special_set.add(tok.content)
    by_content: dict[str, int] = {}
    by_id: dict[int, Added] = {}
    present: set[Added] = set()
    classic: list[Added] = []
    for tok in tokens:
        if not tok.content or tok in present:
            continue
        new_id = by_content.get(tok.content, vocab.get(tok.content))
        if new_id is None:
            if by_content:
                top = max(by_content.values())
                new_id = top + 1 if top >= model_size or model_size == 0 else model_size
            else:
                new_id = model_size
        by_content[tok.content] = new_id
        if new_id in by_id:
            present.discard(by_id[new_id])
        by_id[new_id] = tok
        present.add(tok)
        if tok.content not in special_set:
            classic.append(tok)
    return by_content, by_id, special_order + classic, special_set


def _merge_triples(merges: list[Any], vocab: dict[str, int]) -> array:
    flat: list[int] = []
    append = flat.append
    try:
        for merge in merges:
            a, b = merge.split(" ") if isinstance(merge, str) else merge
            append(vocab[a])
            append(vocab[b])
            append(vocab[a + b])
    except (KeyError, ValueError, TypeError) as exc:
        raise UnsupportedTokenizer(f"merge {merge!r} is malformed or outside the vocab") from exc
    return array("i", flat)


SENTENCEPIECE_SPACE = "\u2581"


def _word_boundary(vocab: dict[str, int], merges: list[Any]) -> bytes:
    """For models without a pre-tokenizer (SentencePiece-style BPE over whole segments): "▁" if
    no merge result has it after another character, so cutting before such a "▁" never
    separates two symbols a merge could join; b"" otherwise."""
    sp = SENTENCEPIECE_SPACE
    if not any(t.startswith(sp) for t in vocab):
        return b""
    for merge in merges:
        joined = merge.replace(" ", "") if isinstance(merge, str) else "".join(merge)
        if sp in joined.lstrip(sp):
            return b""
    return sp.encode()


def build_plan(spec: dict[str, Any], use_scanners: bool = True) -> Plan:
    model = spec.get("model") or {}
    require(model.get("type") == "BPE", f"model {model.get('type')}")
    require(not model.get("dropout"), "BPE dropout")
    require(not model.get("continuing_subword_prefix"), "continuing_subword_prefix")
    require(not model.get("end_of_word_suffix"), "end_of_word_suffix")
    vocab: dict[str, int] = model.get("vocab") or {}
    require(bool(vocab), "empty vocab")
    # The merge table packs ids in 20 bits and ranks in 24 (ft_bpe.hpp PairMap).
    require(0 <= min(vocab.values()) and max(vocab.values()) < (1 << 20) - 1, "ids outside [0, 2^20 - 1)")
    require(len(model.get("merges") or []) < 1 << 24, "more than 2^24 merges")

    plan = Plan()
    norm_steps = normalizer_steps(spec.get("normalizer"))
    plan.normalizers = [(k, a.encode(), b.encode()) for k, a, b in norm_steps]
    plan.pattern, plan.max_digits, plan.byte_level, plan.regexes = pre_tokenizer_options(spec.get("pre_tokenizer"),
                                                                                         use_scanners)
    replaces, dec_byte_fallback, strip_content, strip_start, drop_first = decoder_options(
        spec.get("decoder"), plan.byte_level)
    pre = spec.get("pre_tokenizer") or {}
    if pre.get("type") == "Metaspace":
        require(not norm_steps, "Metaspace pre-tokenizer after a normalizer")
        replacement, scheme, split = metaspace_options(pre)
        plan.metaspace = (replacement.encode(), scheme, split)
    plan.prefix_ids, plan.suffix_ids = post_processor_ids(spec.get("post_processor"))
    plan.classes = unicode_data.class_table()
    if any(k == NORM_NFC for k, _, _ in norm_steps):
        plan.nfc = unicode_data.nfc_tables()

    # BPE model
    plan.ignore_merges = bool(model.get("ignore_merges", False))
    plan.byte_fallback = bool(model.get("byte_fallback", False))
    plan.fuse_unk = bool(model.get("fuse_unk", False))
    require(not (plan.byte_level and plan.byte_fallback), "byte_fallback with a ByteLevel pre-tokenizer")
    if model.get("unk_token") is not None:
        require(model["unk_token"] in vocab, "unk_token outside the vocab")
        plan.unk_id = vocab[model["unk_token"]]
    mapped_by_id: dict[int, bytes | None] = {}  # byte-level: each vocab token's bytes, for decode too
    if plan.byte_level:
        keys, ids = [], array("i")
        for piece, token_id in vocab.items():
            key = mapped_by_id[token_id] = byte_chars_to_bytes(piece)
            if key is not None:  # other tokens can never come out of BPE over bytes
                keys.append(key)
                ids.append(token_id)
        plan.byte_ids = [vocab.get(BYTE_TO_CHAR[b], -1) for b in range(256)]
    else:
        keys, ids = [t.encode() for t in vocab], array("i", vocab.values())
    if plan.byte_fallback:
        plan.fallback_ids = [vocab.get(f"<0x{b:02X}>", -1) for b in range(256)]
    plan.vocab_keys, plan.vocab_offsets = _arena(keys)
    plan.vocab_ids = ids
    plan.merges = _merge_triples(model.get("merges") or [], vocab)
    if plan.pattern < 0 and not plan.byte_level and plan.metaspace is None and plan.regexes is None:
        plan.word_boundary = _word_boundary(vocab, model.get("merges") or [])

    # Added vocabulary
    tokens = [
        Added(t["content"], bool(t.get("single_word", False)), bool(t.get("lstrip", False)),
              bool(t.get("rstrip", False)), bool(t.get("normalized", True)), bool(t.get("special", False)))
        for t in spec.get("added_tokens") or []
    ]
    by_content, by_id, trie_order, special_set = _resolve_added(tokens, vocab)
    for tok in trie_order:
        token_id = by_content[tok.content]
        owner = by_id[token_id]  # HF reads the flags of whichever token holds this id
        flags = int(owner.lstrip) | int(owner.rstrip) << 1 | int(owner.single_word) << 2
        if tok.normalized:
            content = apply_normalizers(norm_steps, tok.content)
            if content:
                plan.normalized_added.append((content.encode(), token_id, flags))
        else:
            plan.raw_added.append((tok.content.encode(), token_id, flags))

    # Decode table and Python-side lookups. HF keeps a normalized token's *normalized* content
    # as its id -> token entry: id_to_token, decode and the skip-special test all see that.
    shown = {i: apply_normalizers(norm_steps, t.content) if t.normalized else t.content
             for i, t in by_id.items()}
    vocab_by_id = {i: t for t, i in vocab.items()}
    top = max(max(vocab.values()), max(by_id, default=-1))
    token_keys: list[bytes] = []
    first_keys: list[bytes] = []
    flag_table = bytearray(top + 1)
    byte_values = bytearray(top + 1)
    for token_id in range(top + 1):
        token = shown.get(token_id)
        from_vocab = token is None
        if from_vocab:
            token = vocab_by_id.get(token_id)
        if token is None:
            token_keys.append(b"")
            first_keys.append(b"")
            continue
        if drop_first:
            first_keys.append(token.replace(drop_first, "").encode())
        flag_table[token_id] = FLAG_KNOWN | (FLAG_SPECIAL if token in special_set else 0)
        if plan.byte_level:
            # The ByteLevel decoder maps a token back to bytes when every char is a byte char.
            # A vocab token was mapped above (the last token listed for an id, as in
            # vocab_by_id); an added token's shown content may differ, so it is mapped here.
            mapped = mapped_by_id[token_id] if from_vocab else byte_chars_to_bytes(token)
            token_keys.append(token.encode() if mapped is None else mapped)
            continue
        for old, new in replaces:
            token = token.replace(old, new)
        value = byte_fallback_value(token) if dec_byte_fallback else None
        if value is not None:
            flag_table[token_id] |= FLAG_BYTE_TOKEN
            byte_values[token_id] = value
        token_keys.append(token.encode())
    plan.token_bytes, plan.token_offsets = _arena(token_keys)
    plan.token_flags, plan.token_byte = bytes(flag_table), bytes(byte_values)
    plan.strip_content, plan.strip_start = strip_content.encode(), strip_start
    if drop_first:
        plan.first_token_bytes, plan.first_token_offsets = _arena(first_keys)

    plan.token_to_id = {**vocab, **by_content}
    plan.added_to_id = by_content
    plan.added_by_id = shown
    plan.vocab_by_id = vocab_by_id
    plan.special_ids = special_token_ids(spec.get("added_tokens") or [])
    plan.vocab_size = len(vocab.keys() | by_content.keys())
    return plan



def load_plan(path: str | Path, use_scanners: bool = True) -> Plan:
    try:
        spec: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UnsupportedTokenizer(f"cannot read {path}: {exc}") from exc
    require(isinstance(spec, dict), "tokenizer.json is not an object")
    return build_plan(spec, use_scanners)
