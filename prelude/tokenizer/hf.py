"""HF `tokenizers` backend: the fallback for configurations fasttoken does not support,
and the oracle fasttoken is tested against."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from tokenizers import Tokenizer as _HFTokenizer

from prelude._fasttoken.plan import special_token_ids
from prelude.tokenizer.base import Tokenizer, longest_first


class HFTokenizer(Tokenizer):
    backend = "hf"

    def __init__(self, path: str | Path, truncate_at: int | None = None):
        """`truncate_at`: text pairs are cut to that many tokens (HF's longest-first strategy, the
        template's special tokens kept); a single text is cut where its request says (truncate)."""
        text = Path(path).read_text(encoding="utf-8")
        self._tok = _HFTokenizer.from_str(text)
        # Some files bake truncation or padding in (GPT-2's has max_length=50); a server must not.
        self._tok.no_truncation()
        self._tok.no_padding()
        self._pairs = self._tok
        if truncate_at is not None:
            self._pairs = _HFTokenizer.from_str(text)
            self._pairs.enable_truncation(truncate_at)
            self._pairs.no_padding()
        added = json.loads(text).get("added_tokens", [])
        self._special_ids = special_token_ids(added)
        self._vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=add_special_tokens)]

    def encode_pairs(self, firsts: Sequence[str], seconds: Sequence[str], limit: int | None = None,
                     side: str = "right") -> list[list[int]]:
        if limit is None:
            return [e.ids for e in self._pairs.encode_batch(list(zip(firsts, seconds)))]
        # A request's own limit: each text encoded alone, cut as the file's longest-first
        # truncation would cut it at that length, then joined by its pair template.
        processor = self._tok.post_processor
        budget = max(limit - (processor.num_special_tokens_to_add(True) if processor is not None else 0), 0)
        pairs = []
        for a, b in zip(firsts, seconds):
            first, second = self._tok.encode(a, add_special_tokens=False), self._tok.encode(b, add_special_tokens=False)
            n1, n2 = longest_first(len(first.ids), len(second.ids), budget)
            first.truncate(n1, direction=side)
            second.truncate(n2, direction=side)
            pairs.append(self._tok.post_process(first, second, add_special_tokens=True).ids)
        return pairs

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)
