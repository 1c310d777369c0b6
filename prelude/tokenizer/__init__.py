"""Tokenizer loading: fasttoken by default, HF `tokenizers` where fasttoken does not apply."""
from __future__ import annotations

import logging
from pathlib import Path

from prelude.tokenizer.base import DecodeStep, Tokenizer

__all__ = ["DecodeStep", "Tokenizer", "load"]

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "fasttoken", "hf")


def load(path: str | Path, backend: str = "auto", truncate_at: int | None = None) -> Tokenizer:
    """Load `tokenizer.json` (or the one inside a model directory).

    backend "auto" uses fasttoken when the file is inside its supported subset and otherwise
    falls back to HF `tokenizers`, logging why; "fasttoken" raises instead of falling back.
    `truncate_at`: text pairs (a cross-encoder's) are cut to that many tokens, their special
    tokens kept; HF `tokenizers` does it, fasttoken does not.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if backend not in BACKENDS:
        raise ValueError(f"unknown tokenizer backend {backend!r}; choose one of {BACKENDS}")
    reason, level = None, logging.INFO
    if truncate_at is not None:
        if backend == "fasttoken":
            from prelude.tokenizer.fast import UnsupportedTokenizer

            raise UnsupportedTokenizer("it does not truncate, and this model's texts are truncated")
        reason = f"fasttoken does not truncate, and this model's texts are cut at {truncate_at} tokens"
    if backend != "hf" and truncate_at is None:
        from prelude.tokenizer.fast import FastTokenizer, UnsupportedTokenizer

        try:
            return FastTokenizer(path)
        except UnsupportedTokenizer as exc:
            if backend == "fasttoken":
                raise
            reason, level = f"fasttoken does not support this tokenizer.json: {exc}", logging.INFO
        except ImportError as exc:  # the Cython extension was not compiled for this interpreter
            if backend == "fasttoken":
                raise
            reason, level = f"fasttoken's extension is not built ({exc}; `pip install -e .` builds it)", logging.WARNING
    from prelude.tokenizer.hf import HFTokenizer

    tokenizer = HFTokenizer(path, truncate_at)
    if reason is not None and truncate_at is None:  # logged once HF's loads: where it cannot, its error says why
        logger.log(level, "%s; using HF tokenizers", reason)
    tokenizer.fallback_reason = reason
    return tokenizer
