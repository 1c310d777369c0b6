"""Prelude's on-disk cache (the demo model, derived tables): $PRELUDE_CACHE, else
$XDG_CACHE_HOME/prelude, else ~/.cache/prelude. Everything in it can be rebuilt."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def cache_root() -> Path:
    base = os.environ.get("PRELUDE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "prelude")
    return Path(base)


def write_atomically(path: Path, data: bytes) -> None:
    """Readers see the old file or the whole new one, never a partial write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
