"""The contenders behind one interface: fasttoken, HF `tokenizers`, tiktoken, and (when pip has
them; bench-only, never required) the Rust tokenizers fastokens and kitoken."""
from __future__ import annotations

import importlib.util
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


def fastokens(path: str) -> Library | None:
    if importlib.util.find_spec("fastokens") is None:
        return None
    import fastokens as fk

    tok = fk.Tokenizer.from_file(path)
    tok.no_truncation()  # HF equality: some files (GPT-2) ship a truncation setting
    tok.no_padding()
    encode = tok.encode
    batch = tok.encode_batch
    return Library("fastokens", lambda t: encode(t).ids, lambda ids: tok.decode(ids, skip_special_tokens=False),
                   lambda texts: [e.ids for e in batch(texts)], None)


def kitoken(path: str) -> Library | None:
    if importlib.util.find_spec("kitoken") is None:
        return None
    import kitoken as kt

    tok = kt.Kitoken.from_file(path)
    return Library("kitoken", lambda t: tok.encode(t, True), lambda ids: tok.decode(ids).decode("utf-8", "replace"),
                   lambda texts: tok.encode_all(texts, True), None)


def loaders() -> dict[str, Callable[[str], object]]:
    """name -> load(path) for the load-time rows (libraries that are not installed are left out)."""
    out: dict[str, Callable[[str], object]] = {"fasttoken": FastTokenizer, "hf": HFRaw.from_file}
    if importlib.util.find_spec("fastokens") is not None:
        import fastokens as fk

        out["fastokens"] = fk.Tokenizer.from_file
    if importlib.util.find_spec("kitoken") is not None:
        import kitoken as kt

        out["kitoken"] = kt.Kitoken.from_file
    return out
