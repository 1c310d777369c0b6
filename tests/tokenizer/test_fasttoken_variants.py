"""fasttoken on tokenizer.json variants written at run time: the added-token flags, normalizers,
post-processors and model options the shared files use only partly, each compared with HF, and
files outside the supported subset, which must fall back to HF."""
from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from prelude.tokenizer import load
from prelude.tokenizer.fast import FastTokenizer, UnsupportedTokenizer
from prelude.tokenizer.hf import HFTokenizer
from tests.data import tokenizer_dir
from bench.tokenizer.corpus import FRAGMENTS
from bench.tokenizer.equality import (
    check_decode,
    check_encode,
    check_stream,
    make_pair,
    random_texts,
)


def _base(name: str = "gpt2") -> dict[str, Any]:
    return json.loads((tokenizer_dir(name) / "tokenizer.json").read_text(encoding="utf-8"))


def _write(tmp_path: Path, spec: dict[str, Any]) -> str:
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    return str(path)


def _added(content: str, id_: int, **flags: bool) -> dict[str, Any]:
    base = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": False}
    return {"id": id_, "content": content, **base, **flags}


def _flags_variant(spec: dict[str, Any]) -> None:
    spec["added_tokens"] += [
        _added("<L>", 50257, lstrip=True, special=True),
        _added("<R>", 50258, rstrip=True),
        _added("<LR>", 50259, lstrip=True, rstrip=True, special=True),
        _added("<W>", 50260, single_word=True),
        _added("word", 50261, single_word=True, normalized=True),
        _added("café", 50262, normalized=True),
        _added(" <sp>", 50263, rstrip=True),
        _added("<L", 50264),
        _added("Āb", 50265),  # made of byte-level characters: decodes to \x00b
        _added("hello", 50266, special=True),  # also in the model vocab
    ]


def _nfc_variant(spec: dict[str, Any]) -> None:
    spec["normalizer"] = {"type": "NFC"}
    _flags_variant(spec)
    spec["added_tokens"] += [_added("cafe\u0301!", 50267, normalized=True),
                             _added("Spe\u0301c", 50268, normalized=True, special=True)]


def _template_variant(spec: dict[str, Any]) -> None:
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [50256], "tokens": ["<|endoftext|>"]}},
    }
    spec["model"]["ignore_merges"] = True


def _pair_merges_variant(spec: dict[str, Any]) -> None:
    _flags_variant(spec)
    spec["model"]["merges"] = [m.split(" ") for m in spec["model"]["merges"]]
    spec["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Replace", "pattern": {"String": "  "}, "content": " "}, {"type": "Prepend", "prepend": "Ġ"}]}


def _unknown_regex_variant(spec: dict[str, Any]) -> None:
    """Split regexes no scanner knows: they run through the `regex` module."""
    splits = [r"\w+|[^\w\s]+|\s+", r"(?<=\d)(?=(\d\d\d)+\b)|\p{Lu}\p{Ll}*"]
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        *({"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False} for r in splits),
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    _flags_variant(spec)


def _missing_bytes_variant(spec: dict[str, Any]) -> None:
    """A byte-level vocab without a few byte characters: those bytes become (fused) unk."""
    from prelude._fasttoken.plan import BYTE_TO_CHAR

    model = spec["model"]
    gone = {BYTE_TO_CHAR[b] for b in (0xE4, 0xBD, 0xA0, 0x80, ord("z"))}
    model["vocab"] = {t: i for t, i in model["vocab"].items() if not gone & set(t)}
    model["merges"] = [m for m in model["merges"] if not gone & set(m)]
    model["unk_token"], model["fuse_unk"] = "<|endoftext|>", True


def _phi3_cross_word_merge_variant(spec: dict[str, Any]) -> None:
    """A merge that joins a character to a following "▁": words can no longer be cut before
    "▁", so fasttoken must run BPE over each whole segment."""
    model = spec["model"]
    for offset, token in enumerate(("e▁", "e▁t")):
        model["vocab"][token] = 40_000 + offset
    model["merges"] = ["e ▁", "e▁ t", *model["merges"]]
    _phi3_rstrip_variant(spec)


def _phi3_rstrip_variant(spec: dict[str, Any]) -> None:
    spec["added_tokens"] += [_added("<|sys|>", 32011, lstrip=True, rstrip=True, special=True),
                             _added("<w>", 32012, single_word=True)]


def _metaspace(scheme: str | None, split: bool, metaspace_decoder: bool) -> Callable[[dict[str, Any]], None]:
    """Mistral-v0.3-style: no normalizer, a Metaspace pre-tokenizer (and decoder)."""
    def mutate(spec: dict[str, Any]) -> None:
        options: dict[str, Any] = {"type": "Metaspace", "replacement": "\u2581", "split": split}
        if scheme is None:
            options["add_prefix_space"] = True  # the form written before prepend_scheme existed
        else:
            options["prepend_scheme"] = scheme
        spec["normalizer"] = None
        spec["pre_tokenizer"] = options
        if metaspace_decoder:
            spec["decoder"] = dict(options)
        _phi3_rstrip_variant(spec)
    return mutate


VARIANTS: dict[str, tuple[str, Callable[[dict[str, Any]], None]]] = {
    "metaspace-first-split": ("phi3-mini", _metaspace("first", True, True)),
    "metaspace-first": ("phi3-mini", _metaspace("first", False, False)),
    "metaspace-always": ("phi3-mini", _metaspace("always", True, True)),
    "metaspace-never": ("phi3-mini", _metaspace("never", False, True)),
    "metaspace-legacy": ("phi3-mini", _metaspace(None, True, True)),
    "flags": ("gpt2", _flags_variant),
    "nfc": ("gpt2", _nfc_variant),
    "template+ignore_merges": ("gpt2", _template_variant),
    "pair-merges+normalizers": ("gpt2", _pair_merges_variant),
    "phi3-flags": ("phi3-mini", _phi3_rstrip_variant),
    "phi3-cross-word-merge": ("phi3-mini", _phi3_cross_word_merge_variant),
    "unknown-regex": ("gpt2", _unknown_regex_variant),
    "missing-bytes+unk": ("gpt2", _missing_bytes_variant),
}

TEXTS = FRAGMENTS + [
    "x <L> y  <L>z\t<L>", "a<R>   b <R>\n\nc", "  <LR>  middle  <LR>", "<W> a<W> <W>b (<W>) <W>",
    "word words sword word_ word1 éword wordé", "café cafe\u0301 CAFÉ cafe\u0301! café!",
    "x <sp>   y <sp>", "<L <L> <<L>>", "Āb xĀby", "hello hello! ohello", "<|sys|>\n  hi <|sys|>x",
    "<w> a<w> <w>", "  double  spaces  ", "ĠĠ", "", "Spe\u0301c Spéc xSpéc",
]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_matches_hf(tmp_path: Path, variant: str) -> None:
    base_name, mutate = VARIANTS[variant]
    spec = _base(base_name)
    mutate(spec)
    path = _write(tmp_path, spec)
    fast, hf, raw = make_pair(path)  # not load_pair: a per-test file need not live all session
    assert fast.vocab_size == hf.vocab_size
    for token in ["<L>", "<R>", "<W>", "word", "café", "cafe\u0301!", "hello", "<|sys|>", "Āb"]:
        assert fast.token_to_id(token) == hf.token_to_id(token)
    for token_id in [*range(31990, 32020), *range(50250, 50275)]:
        assert fast.id_to_token(token_id) == hf.id_to_token(token_id)
    problems = []
    for text in TEXTS + random_texts(path, 300, seed=9):
        problems += check_encode(fast, hf, text)
        problems += check_decode(fast, hf, hf.encode(text))
    for text in TEXTS:
        problems += check_stream(fast, hf, raw, hf.encode(text))
    assert not problems, "\n".join(problems[:10])


def test_word_boundary_only_when_safe(tmp_path: Path) -> None:
    from prelude._fasttoken.loader import load_plan

    assert load_plan(tokenizer_dir("phi3-mini") / "tokenizer.json").word_boundary == "\u2581".encode()
    spec = _base("phi3-mini")
    _phi3_cross_word_merge_variant(spec)
    assert load_plan(_write(tmp_path, spec)).word_boundary == b""


UNSUPPORTED: dict[str, Callable[[dict[str, Any]], None]] = {
    "wordpiece": lambda s: s.update(model={"type": "WordPiece", "unk_token": "[UNK]", "vocab": {"[UNK]": 0, "a": 1},
                                           "continuing_subword_prefix": "##", "max_input_chars_per_word": 100}),
    "bert-pre-tokenizer": lambda s: s.update(pre_tokenizer={"type": "BertPreTokenizer"}),
    "split-merged-with-previous": lambda s: s.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"\s+"}, "behavior": "MergedWithPrevious", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}),
    "nfkc": lambda s: s.update(normalizer={"type": "NFKC"}),
    "bert-processing": lambda s: s.update(post_processor={"type": "BertProcessing", "sep": ["<|endoftext|>", 50256],
                                                          "cls": ["<|endoftext|>", 50256]}),
    "add-prefix-space": lambda s: s["pre_tokenizer"].update(add_prefix_space=True),
    "dropout": lambda s: s["model"].update(dropout=0.1),
}


@pytest.mark.parametrize("feature", list(UNSUPPORTED))
def test_unsupported_falls_back_to_hf(tmp_path: Path, feature: str, caplog: pytest.LogCaptureFixture) -> None:
    spec = _base("gpt2")
    UNSUPPORTED[feature](spec)
    path = _write(tmp_path, spec)
    with pytest.raises(UnsupportedTokenizer):
        FastTokenizer(path)
    with caplog.at_level(logging.INFO, logger="prelude.tokenizer"):
        tok = load(path)
    assert tok.backend == "hf"
    assert any("fasttoken does not support" in r.getMessage() for r in caplog.records)
    with pytest.raises(UnsupportedTokenizer):
        load(path, backend="fasttoken")
    assert load(tokenizer_dir("gpt2"), backend="hf").backend == "hf"


def test_unreadable_file_is_unsupported(tmp_path: Path) -> None:
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(UnsupportedTokenizer):
        FastTokenizer(bad)


def _tiny_byte_level() -> dict[str, Any]:
    """A small byte-level BPE written from scratch, so these tests need no shared data."""
    from prelude._fasttoken.plan import BYTE_TO_CHAR

    vocab = {BYTE_TO_CHAR[b]: b for b in range(256)}
    merges = []
    for a, b in [("t", "h"), ("th", "e"), ("Ġ", "th"), ("Ġ", "the"), ("i", "n"), ("in", "g"), ("Ġ", "a")]:
        merges.append(f"{a} {b}")
        vocab.setdefault(a + b, len(vocab))
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [_added("<|end|>", len(vocab), special=True), _added("<tool>", len(vocab) + 1, rstrip=True)],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                  "merges": merges},
    }


def test_tiny_tokenizer_without_shared_data(tmp_path: Path) -> None:
    path = _write(tmp_path, _tiny_byte_level())
    fast, hf = FastTokenizer(path), HFTokenizer(path)
    assert load(path).backend == "fasttoken"
    texts = FRAGMENTS + ["the thing<|end|>the<tool>  \n x", "Ġthe ĠĠ", "thethe the  the\t\tthe"]
    problems = [p for t in texts for p in check_encode(fast, hf, t) + check_decode(fast, hf, hf.encode(t))]
    assert not problems, "\n".join(problems[:10])


def test_wordpiece_falls_back_without_shared_data(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spec = _tiny_byte_level()
    spec.update(model={"type": "WordPiece", "unk_token": "[UNK]", "vocab": {"[UNK]": 0, "a": 1, "##b": 2},
                       "continuing_subword_prefix": "##", "max_input_chars_per_word": 100},
                pre_tokenizer={"type": "BertPreTokenizer"},
                decoder={"type": "WordPiece", "prefix": "##", "cleanup": True},
                normalizer=None, added_tokens=[], post_processor=None)
    path = _write(tmp_path, spec)
    with pytest.raises(UnsupportedTokenizer, match="WordPiece"):
        FastTokenizer(path)
    with caplog.at_level(logging.INFO, logger="prelude.tokenizer"):
        tok = load(path)
    assert tok.backend == "hf" and tok.encode("ab a") == HFTokenizer(path).encode("ab a")
    assert any("fasttoken does not support" in r.getMessage() for r in caplog.records)


def test_missing_extension_falls_back_to_hf_with_a_warning(monkeypatch, caplog):
    import sys

    path = tokenizer_dir("gpt2")
    monkeypatch.setitem(sys.modules, "prelude._fasttoken.core", None)  # import now raises ImportError
    with caplog.at_level("WARNING", logger="prelude.tokenizer"):
        tok = load(path)
    assert tok.backend == "hf" and "not built" in caplog.text
    with pytest.raises(ImportError):
        load(path, "fasttoken")
