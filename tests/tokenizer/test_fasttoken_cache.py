"""The on-disk table cache (prelude/_fasttoken/table_cache.py): a warm load uses it and gives
HF's ids; a damaged, stale or foreign cache file is detected and rebuilt, never used."""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from prelude._fasttoken import table_cache
from prelude.tokenizer.fast import FastTokenizer
from tests.data import tokenizer_dir, tokenizer_file
from bench.tokenizer.equality import check_encode, corpus_for, load_pair

NAME = "gpt2"  # small: every rebuild below stays quick


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PRELUDE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _source(tmp_path: Path, name: str = NAME) -> Path:
    path = tmp_path / name / "tokenizer.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(tokenizer_dir(name) / "tokenizer.json", path)
    return path


def _cache_file(cache: Path) -> Path:
    files = list((cache / "fasttoken" / "tables").glob("*.bin"))
    assert len(files) == 1, files
    return files[0]


def _same_as_hf(tok: FastTokenizer, name: str = NAME) -> None:
    path = tokenizer_file(name)
    _, hf, _ = load_pair(path)
    problems = [p for text in corpus_for(path) for p in check_encode(tok, hf, text)]
    assert not problems, "\n".join(problems[:5])
    for token_id in (0, 5, 1000, hf.vocab_size - 1, hf.vocab_size + 5):
        assert tok.id_to_token(token_id) == hf.id_to_token(token_id)
    assert tok.token_to_id("hello") == hf.token_to_id("hello")
    assert tok.vocab_size == hf.vocab_size and tok.special_ids == hf.special_ids


@pytest.mark.parametrize("name", [NAME, "qwen3"])
def test_warm_load_uses_cache(cache: Path, tmp_path: Path, name: str) -> None:
    source = _source(tmp_path, name)
    cold = FastTokenizer(source)
    assert cold._hit is None
    _cache_file(cache)
    warm = FastTokenizer(source)
    assert warm._hit is not None and warm._lookups is None  # lookups load on first use
    added = {t["content"]: t["id"] for t in json.loads(source.read_text())["added_tokens"]}
    assert added and {token: warm.token_to_id(token) for token in added} == added
    assert warm._lookups is None  # added tokens (the EOS the server looks up as it starts) need none
    _same_as_hf(warm, name)
    assert warm.decode(warm.encode("Hello there")) == "Hello there"


def _damage(path: Path, offset: int, value: bytes) -> None:
    data = bytearray(path.read_bytes())
    data[offset:offset + len(value)] = value
    path.write_bytes(bytes(data))


HEADER = table_cache._HEADER.size


@pytest.mark.parametrize("damage", [
    "engine_byte", "meta_byte", "truncated", "empty", "magic", "version", "source", "extra",
])
def test_damaged_file_is_rebuilt(cache: Path, tmp_path: Path, damage: str) -> None:
    source = _source(tmp_path)
    FastTokenizer(source)
    path = _cache_file(cache)
    data = path.read_bytes()
    n_engine = struct.unpack_from("<Q", data, 72)[0]
    if damage == "engine_byte":
        _damage(path, HEADER + n_engine // 2, bytes([data[HEADER + n_engine // 2] ^ 0x40]))
    elif damage == "meta_byte":
        _damage(path, HEADER + n_engine + 1, b"\xff")
    elif damage == "truncated":
        path.write_bytes(data[:len(data) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "magic":
        _damage(path, 0, b"XXXXXXXX")
    elif damage == "version":
        _damage(path, 8, b"fasttoken-0.0.0-t0".ljust(32, b"\0"))
    elif damage == "source":
        _damage(path, 40, bytes(32))
    else:
        path.write_bytes(data + b"\0")
    tok = FastTokenizer(source)
    assert tok._hit is None, "a damaged cache file was used"
    _same_as_hf(tok)
    assert FastTokenizer(source)._hit is not None  # rewritten whole


def test_checksum_valid_but_malformed_tables_are_rebuilt(cache: Path, tmp_path: Path) -> None:
    """Bytes that pass the checksum (written by a buggy or foreign writer) must still fail the
    engine's own structure checks rather than be used."""
    source = _source(tmp_path)
    FastTokenizer(source)
    path = _cache_file(cache)
    data = bytearray(path.read_bytes())
    fields = list(table_cache._HEADER.unpack_from(data))
    n_engine = fields[3]
    engine = bytearray(data[HEADER:HEADER + n_engine])
    engine[128:136] = struct.pack("<Q", 1 << 40)  # the class table's block index length, after 128 ASCII classes
    fields[4] = table_cache._checksum(bytes(engine))
    data[:HEADER] = table_cache._HEADER.pack(*fields)
    data[HEADER:HEADER + n_engine] = engine
    path.write_bytes(bytes(data))
    tok = FastTokenizer(source)
    assert tok._hit is None
    _same_as_hf(tok)


def test_damaged_lookups_fall_back_to_the_json(cache: Path, tmp_path: Path) -> None:
    source = _source(tmp_path)
    FastTokenizer(source)
    path = _cache_file(cache)
    data = path.read_bytes()
    _damage(path, len(data) - 10, b"\x00\x01\x02")
    tok = FastTokenizer(source)
    assert tok._hit is not None  # the engine and meta sections are intact
    _same_as_hf(tok)


def test_changed_source_gets_new_tables(cache: Path, tmp_path: Path) -> None:
    source = _source(tmp_path)
    FastTokenizer(source)
    spec = json.loads(source.read_text(encoding="utf-8"))
    spec["added_tokens"].append({"id": 50257, "content": "<new>", "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": False, "special": True})
    source.write_text(json.dumps(spec), encoding="utf-8")
    tok = FastTokenizer(source)
    assert tok._hit is None
    assert tok.encode("a<new>b", False) == [64, 50257, 65]
    assert len(list((cache / "fasttoken" / "tables").glob("*.bin"))) == 2
    assert FastTokenizer(source).encode("a<new>b", False) == [64, 50257, 65]


def test_read_only_cache_dir_still_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("PRELUDE_CACHE", str(blocker))  # nothing can be created under a file
    tok = FastTokenizer(_source(tmp_path))
    assert tok.encode("hello", False) == [31373]
