"""fasttoken backend (placeholder until the fasttoken issue lands: every file is unsupported)."""
from __future__ import annotations

from pathlib import Path


class UnsupportedTokenizer(ValueError):
    """The tokenizer.json uses a feature outside fasttoken's supported subset."""


class FastTokenizer:
    backend = "fasttoken"

    def __init__(self, path: str | Path):
        raise UnsupportedTokenizer("fasttoken is not built yet")
