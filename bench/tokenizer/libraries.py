"""The three contenders behind one interface: fasttoken, HF `tokenizers` and tiktoken."""
from __future__ import annotations

from collections.abc import Callable

from tokenizers import Tokenizer as HFRaw
from tokenizers.decoders import DecodeStream

from bench.tokenizer.measure import Library
from bench.tokenizer.tiktoken_build import build as build_tiktoken
from prelude.tokenizer.fast import FastTokenizer


def fasttoken(path: str) -> Library:
    tok = FastTokenizer(path)
    step = tok.decode_step

    def stream(ids: list[int]) -> int:
        seen: list[int] = []
        prefix = read = emitted = 0
        for token_id in ids:
            seen.append(token_id)
            text, prefix, read = step(seen, prefix, read)
            emitted += len(text)
        return emitted

    return Library("fasttoken", tok.encode, tok.decode, tok.encode_batch, stream)


def hf(path: str) -> Library:
    tok = HFRaw.from_file(path)
    tok.no_truncation()
    tok.no_padding()

    def stream(ids: list[int]) -> int:
        decoder = DecodeStream(skip_special_tokens=False)
        emitted = 0
        for token_id in ids:
            text = decoder.step(tok, token_id)
            emitted += len(text) if text else 0
        return emitted

    return Library("hf", lambda t: tok.encode(t).ids, lambda ids: tok.decode(ids, skip_special_tokens=False),
                   tok.encode_batch, stream)


def tiktoken(path: str) -> Library | None:
    enc = build_tiktoken(path)
    if enc is None:
        return None
    decode: Callable[[list[int]], str] = enc.decode

    def stream(ids: list[int]) -> int:
        # tiktoken has no streaming API: the usual prefix/read-offset loop over its decode.
        seen: list[int] = []
        prefix = read = emitted = 0
        for token_id in ids:
            seen.append(token_id)
            prefix_text = decode(seen[prefix:read])
            full = decode(seen[prefix:])
            if len(full) > len(prefix_text) and not full.endswith("\ufffd"):
                emitted += len(full) - len(prefix_text)
                prefix, read = read, len(seen)
        return emitted

    return Library("tiktoken", lambda t: enc.encode(t, allowed_special="all"), decode,
                   lambda texts: enc.encode_batch(texts, allowed_special="all"), stream)
