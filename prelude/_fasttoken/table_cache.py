"""The on-disk cache of built fasttoken tables, so that a warm load skips JSON parsing, plan
building and table construction (Qwen3: ~0.5 s cold, a few ms warm).

One file per (tokenizer.json content, fasttoken version) under <cache root>/fasttoken/tables:

    header: magic, version tag, source sha256, then (length, checksum) of each section
    engine:  the C++ tables (ft_store.hpp), checksummed, then re-checked field by field on load
    meta:    marshal of (special ids, vocab size, added tokens' content -> id)
    lookups: marshal of (token_to_id, added_by_id, vocab_by_id), read on first use only

Hashing an 11 MB tokenizer.json costs more than the whole warm load, so a small index file per
source path remembers (size, mtime_ns, inode) -> sha256, as build tools do; any change to those
makes the file be hashed again. Anything unexpected in a cache file (bad magic, other version
or source, short read, checksum or structure mismatch) makes the caller rebuild and overwrite
it: a cache file is never trusted beyond what it proves.
"""
from __future__ import annotations

import hashlib
import marshal
import mmap
import os
import struct
from pathlib import Path
from typing import Any, NamedTuple

from prelude import __version__ as _prelude_version
from prelude.cachedir import cache_root, write_atomically

# Bump with any change to what ft_store.hpp writes or to the meaning of the tables.
TABLES_FORMAT = 5
_TAG = f"fasttoken-{_prelude_version}-t{TABLES_FORMAT}"
VERSION_TAG = _TAG.encode()[:32].ljust(32, b"\0")
MAGIC = b"FTTABLES"
# magic, version tag, source sha256, then (length, checksum) for engine, meta, lookups
_HEADER = struct.Struct("<8s32s32sQQQQQQ")


class Hit(NamedTuple):
    tables: memoryview  # over the mapped file
    special_ids: frozenset[int]
    vocab_size: int
    added_to_id: dict[str, int]
    path: Path  # the cache file, for the lookups section
    lookups_at: tuple[int, int, int]  # offset, length, checksum


def _checksum(data: bytes | bytearray | memoryview) -> int:
    from prelude._fasttoken.core import payload_checksum

    return payload_checksum(data)


def _dir() -> Path:
    return cache_root() / "fasttoken" / "tables"


def source_digest(path: Path) -> bytes:
    """sha256 of the file's content, through the stat index when the file is unchanged."""
    real = os.path.realpath(path)
    st = os.stat(real)
    signature = f"{st.st_size} {st.st_mtime_ns} {st.st_ino}"
    index = _dir() / "index" / hashlib.sha256(real.encode()).hexdigest()
    try:
        saved_signature, digest_hex = index.read_text().split("\n")[:2]
        if saved_signature == signature and len(digest_hex) == 64:
            return bytes.fromhex(digest_hex)
    except (OSError, ValueError):
        pass
    with open(real, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").digest() if hasattr(hashlib, "file_digest") \
            else hashlib.sha256(f.read()).digest()
    try:
        write_atomically(index, f"{signature}\n{digest.hex()}\n".encode())
    except OSError:
        pass
    return digest


def _file(digest: bytes) -> Path:
    return _dir() / f"{digest.hex()}-{_TAG}.bin"


def load(digest: bytes) -> Hit | None:
    """The cached tables for this source digest, or None (absent, stale or damaged). The file
    is mapped, not read: the engine copies the tables out once, straight from the page cache."""
    path = _file(digest)
    try:
        with open(path, "rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # ValueError: an empty file cannot be mapped
        return None
    view = memoryview(data)
    if len(view) < _HEADER.size:
        return None
    magic, tag, source, n_engine, c_engine, n_meta, c_meta, n_lookups, c_lookups = _HEADER.unpack(view[:_HEADER.size])
    if magic != MAGIC or tag != VERSION_TAG or source != digest:
        return None
    start = _HEADER.size
    if len(view) != start + n_engine + n_meta + n_lookups:
        return None
    engine, meta = view[start:start + n_engine], view[start + n_engine:start + n_engine + n_meta]
    if _checksum(engine) != c_engine or _checksum(meta) != c_meta:
        return None
    try:
        special_ids, vocab_size, added_to_id = marshal.loads(meta)
        ids = frozenset(int(i) for i in special_ids)
    except (ValueError, EOFError, TypeError):
        return None
    if not isinstance(added_to_id, dict):
        return None
    return Hit(engine, ids, int(vocab_size), added_to_id, path, (start + n_engine + n_meta, n_lookups, c_lookups))


def read_lookups(hit: Hit) -> tuple[dict[str, int], dict[int, str], dict[int, str]] | None:
    """(token_to_id, added_by_id, vocab_by_id) from the cache file, or None if it changed."""
    offset, length, check = hit.lookups_at
    try:
        with open(hit.path, "rb") as f:
            f.seek(offset)
            data = f.read(length)
        if len(data) != length or _checksum(data) != check:
            return None
        token_to_id, added_by_id, vocab_by_id = marshal.loads(data)
    except (OSError, ValueError, EOFError, TypeError):
        return None
    if not (isinstance(token_to_id, dict) and isinstance(added_by_id, dict) and isinstance(vocab_by_id, dict)):
        return None
    return token_to_id, added_by_id, vocab_by_id


def store(digest: bytes, tables: bytes, plan: Any) -> None:
    """Writes the cache file (atomically); a read-only cache directory just means no cache."""
    meta = marshal.dumps((sorted(plan.special_ids), plan.vocab_size, plan.added_to_id))
    lookups = marshal.dumps((plan.token_to_id, plan.added_by_id, plan.vocab_by_id))
    head = _HEADER.pack(MAGIC, VERSION_TAG, digest, len(tables), _checksum(tables), len(meta),
                        _checksum(meta), len(lookups), _checksum(lookups))
    try:
        write_atomically(_file(digest), b"".join((head, tables, meta, lookups)))
    except OSError:
        pass
