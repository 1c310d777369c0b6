"""fasttoken backend: a thin Python shell over the Cython/C++ engine in prelude._fasttoken.

The hot methods (encode, encode_batch, decode, decode_step) are the Cython methods themselves,
bound onto the instance, so a call costs one C-level dispatch. A few inputs need Unicode data
whose version differs between Python and HF (see prelude/_fasttoken/unicode_data.py); the engine
reports those and they go through HF `tokenizers`, loaded on first need, so results never differ.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prelude._fasttoken import table_cache
from prelude._fasttoken.loader import load_plan
from prelude._fasttoken.plan import UnsupportedTokenizer
from prelude.tokenizer.base import Tokenizer

__all__ = ["FastTokenizer", "UnsupportedTokenizer"]


class FastTokenizer(Tokenizer):
    backend = "fasttoken"

    def __init__(self, path: str | Path, use_scanners: bool = True):
        """use_scanners=False runs even the recognized Split regexes through the `regex` module
        (the slow reference path that unknown regexes always take); tests compare both."""
        self.path = Path(path)
        self._lookups: tuple[dict[str, int], dict[int, str], dict[int, str]] | None = None
        self._hit: table_cache.Hit | None = None
        self._digest: bytes | None = None
        core = self._load_cached() if use_scanners else None
        self._core: Any = core if core is not None else self._build(use_scanners)
        self._reference: Tokenizer | None = None  # HF, loaded on the first input that needs it
        self._reference_lock = threading.Lock()
        self.reference_encodes = 0  # how many inputs went to HF (tests watch it; races are harmless)
        # Instance attributes shadow encode and decode below and the base class's encode_batch
        # and decode_step: callers reach the Cython code directly.
        self.encode = self._core.encode  # type: ignore[method-assign]
        self.encode_batch = self._core.encode_batch  # type: ignore[method-assign]
        self.decode = self._core.decode  # type: ignore[method-assign]
        self.decode_step = self._core.decode_step  # type: ignore[method-assign]

    def _load_cached(self) -> Any:
        """The Core from the table cache (see prelude/_fasttoken/table_cache.py), or None."""
        from prelude._fasttoken.core import Core

        try:
            self._digest = table_cache.source_digest(self.path)
        except OSError:
            return None
        hit = table_cache.load(self._digest)
        if hit is None:
            return None
        try:
            core = Core(None, self._reference_encode, hit.tables)
        except RuntimeError:  # structure checks failed: rebuild and overwrite
            return None
        self._hit = hit
        self._special_ids = hit.special_ids
        self._vocab_size = hit.vocab_size
        self._added_to_id = hit.added_to_id
        return core

    def _build(self, use_scanners: bool) -> Any:
        from prelude._fasttoken.core import Core

        plan = load_plan(self.path, use_scanners)
        core = Core(plan, self._reference_encode)
        self._lookups = plan.token_to_id, plan.added_by_id, plan.vocab_by_id
        self._special_ids = plan.special_ids
        self._vocab_size = plan.vocab_size
        self._added_to_id = plan.added_to_id
        if use_scanners and plan.regexes is None and self._digest is not None:
            table_cache.store(self._digest, core.save(), plan)
        return core

    def _tables(self) -> tuple[dict[str, int], dict[int, str], dict[int, str]]:
        """token_to_id, added_by_id, vocab_by_id: from the cache file on first use after a
        cached load (the JSON if that file changed meanwhile)."""
        if self._lookups is None:
            lookups = table_cache.read_lookups(self._hit) if self._hit is not None else None
            if lookups is None:
                plan = load_plan(self.path)
                lookups = plan.token_to_id, plan.added_by_id, plan.vocab_by_id
            self._lookups = lookups
        return self._lookups

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._core.encode(text, add_special_tokens)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._core.decode(ids, skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        # An added token (the EOS and chat markers the server looks up as it starts) is found
        # without the vocabulary's tables, whose load costs a Qwen3 tokenizer ~60 ms and 29 MiB.
        added = self._added_to_id.get(token)
        return added if added is not None else self._tables()[0].get(token)

    def id_to_token(self, token_id: int) -> str | None:
        _, added_by_id, vocab_by_id = self._tables()
        token = added_by_id.get(token_id)
        return token if token is not None else vocab_by_id.get(token_id)

    def _reference_encode(self, text: str, add_special_tokens: bool) -> list[int]:
        """Encodes an input the engine flagged as depending on Unicode-version skew."""
        self.reference_encodes += 1
        if self._reference is None:
            with self._reference_lock:
                if self._reference is None:
                    from prelude.tokenizer.hf import HFTokenizer

                    self._reference = HFTokenizer(self.path)
        return self._reference.encode(text, add_special_tokens)
